"""A library embedded by 2 processes under torchrun, one worker killed, the job resumed.

    SMIEXLM_DATA=../shared/data python benchmarks/embed_resume.py --n 1000000 --json out.json

Writes the first ``--n`` MOSES training SMILES as a CSV (``id``, ``smiles``) and runs the real
command, ``python -m torch.distributed.run --nproc_per_node 2 --no-python smiexlm embed IN.csv
--out DIR --device cpu --part-rows R``. Once ``--kill-after`` parts are finished it sends
SIGKILL to the worker of rank 1 (torchrun then stops rank 0 and fails), and runs the same
command again, which resumes. It checks and reports:

- the parts finished before the kill are kept byte for byte (same size and mtime);
- the resumed table has every input row once, in input order, with its id;
- its values equal those of one uninterrupted process: the same rows embedded by a fresh
  ``Featurizer`` in this process (one thread), on a random sample of ``--check`` rows (the
  featurizer is batch-invariant, so a row's embedding does not depend on its batch; the CI
  test compares whole tables);
- wall time and CPU seconds of both runs, peak RSS of every worker, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_memory import smiexlm_command, write_input  # noqa: E402  (the same input writer)


def command(table: Path, out: Path, part_rows: int, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(port), "--no-python",
            smiexlm_command(), "embed", str(table), "--out", str(out), "--device", "cpu",
            "--part-rows", str(part_rows)]  # fmt: skip


def parts(out: Path) -> dict[str, tuple[int, int]]:
    """Finished parts: name -> (size, mtime_ns)."""
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in out.glob("part-*.parquet")}


def worker_of_rank(launcher: int, rank: int, timeout: float = 120) -> int:
    """PID of the torchrun worker of ``rank`` among the launcher's children (Linux /proc)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        path = Path(f"/proc/{launcher}/task/{launcher}/children")
        for pid in path.read_text().split() if path.exists() else []:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ:
                return int(pid)
        time.sleep(0.1)
    raise RuntimeError(f"no worker of rank {rank} under torchrun pid {launcher}")


def timed(cmd: list[str], kill_after: int | None, out: Path) -> dict:
    """Run ``cmd``; with ``kill_after``, SIGKILL rank 1 once that many parts exist."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed = None
    if kill_after is not None:
        worker = worker_of_rank(proc.pid, 1)
        while len(parts(out)) < kill_after and proc.poll() is None:
            time.sleep(0.2)
        if proc.poll() is not None:
            raise RuntimeError(f"the job ended before {kill_after} parts were finished: "
                               "lower --kill-after or --part-rows, or raise --n")  # fmt: skip
        os.kill(worker, signal.SIGKILL)
        killed = len(parts(out))
    code = proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"exit_code": code, "wall_s": round(time.perf_counter() - start, 1),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1),
            "load_start": round(load, 2), "load_end": round(os.getloadavg()[0], 2),
            "parts_at_kill": killed}  # fmt: skip


def check_values(out: Path, table: Path, n_check: int, seed: int = 0) -> dict:
    """Ids and order of the whole table; values of a random sample against one process."""
    import pandas as pd
    import torch

    from smiexlm import Featurizer
    from smiexlm.model.pooling import last_blocks
    from smiexlm.parts.reading import read_parts

    torch.set_num_threads(1)
    got = read_parts(out).to_pandas()
    expected = pd.read_csv(table)
    same_ids = got["id"].tolist() == expected["id"].tolist()
    rows = np.sort(np.random.default_rng(seed).choice(len(expected), n_check, replace=False))
    ours = got.filter(regex=r"^e\d+$").to_numpy()[rows]
    settings = json.loads((out / "manifest.json").read_text())["settings"]
    feat = Featurizer.from_pretrained(device="cpu")
    fresh = feat.featurize(expected["smiles"].iloc[rows].tolist(), pooling=settings["pooling"],
                           layer=last_blocks(settings.get("layers", 1)), errors="nan")  # fmt: skip
    both = ~np.isnan(fresh).any(axis=1)
    return {"rows": len(got), "same_ids_in_order": same_ids,
            "duplicates": int(got["id"].duplicated().sum()), "checked_rows": int(n_check),
            "nan_rows_checked": int((~both).sum()),
            "nan_rows_agree": bool((np.isnan(ours).any(axis=1) == ~both).all()),
            "max_abs_diff": float(np.abs(ours[both] - fresh[both]).max())}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--part-rows", type=int, default=50_000)
    parser.add_argument("--kill-after", type=int, default=8, help="finished parts before the kill")
    parser.add_argument("--check", type=int, default=20_000, help="rows recomputed in one process")
    parser.add_argument("--keep", type=Path, default=None, help="keep the parts folder here")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--port", type=int, default=29541)
    args = parser.parse_args()
    source = Path(os.environ["SMIEXLM_DATA"]) / "pretrain" / "moses_train.smi.gz"
    report = {"machine": f"{platform.platform()}, {os.cpu_count()} CPUs", "n": args.n,
              "part_rows": args.part_rows}  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        table = Path(scratch) / f"moses_{args.n}.csv"
        write_input(source, args.n, table)
        out = args.keep or Path(scratch) / "emb"
        cmd = command(table, out, args.part_rows, args.port)
        report["killed_run"] = timed(cmd, args.kill_after, out)
        before = parts(out)
        print(json.dumps(report), flush=True)
        report["resumed_run"] = timed(cmd, None, out)
        after = parts(out)
        report["kept_parts_unchanged"] = all(after.get(k) == v for k, v in before.items())
        report["parts_before_resume"], report["parts_after"] = len(before), len(after)
        manifest = json.loads((out / "manifest.json").read_text())
        report["peak_rss_mib"] = [w["peak_rss_mib"] for w in manifest["last_run"]["workers"]]
        report["failed_rows"] = manifest["n_failed"]
        report["check"] = check_values(out, table, min(args.check, args.n))
    print(json.dumps(report, indent=1), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
