"""``smiexlm embed`` into parts: one process against two under torchrun, and peak memory.

    SMIEXLM_DATA=../shared/data nice python benchmarks/embed_parts.py --sizes 20000 100000

For each size it writes the first N MOSES training SMILES as a CSV (``id``, ``smiles``) and
runs the real command in fresh processes, each into a new folder of parts:

- ``1 proc x 1 thread``:  ``smiexlm embed IN.csv --out DIR --device cpu --threads 1``
- ``1 proc x 2 threads``: the same with ``--threads 2``
- ``2 procs x 1 thread``: ``python -m torch.distributed.run --nproc_per_node 2 --no-python
  smiexlm embed IN.csv --out DIR --device cpu`` (each rank takes one thread: 2 cores / 2)
- ``ray 1 node x 1 cpu`` and ``ray 2 nodes x 1 cpu``: ``smiexlm embed IN.csv --out DIR --ray
  127.0.0.1:PORT`` on a Ray cluster of this machine started for the run (``ray start --head``,
  then ``ray start --address`` for the second node, one CPU each, on loopback:
  ``tests.conftest.LoopbackRayCluster``, root only); the cluster's start-up is timed apart
  (``startup_s``) and the command's wall time includes joining it and loading the model in
  each part writer

It reports the wall time, molecules per second, the CPU seconds the command used (user +
system, all its processes), the machine's 1-minute load average at the start and the end, and
the peak resident memory of each process (``ru_maxrss``, recorded by each rank in the
manifest). It checks that every run gives the same table (ids, order, values).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_memory import smiexlm_command, write_input  # noqa: E402  (the same input writer)

MODES = {
    "1 proc x 1 thread": (1, 1),
    "1 proc x 2 threads": (1, 2),
    "2 procs x 1 thread": (2, None),
    "ray 1 node x 1 cpu": ("ray", 1),
    "ray 2 nodes x 1 cpu": ("ray", 2),
}


def run(mode: str, table: Path, out: Path, part_rows: int, port: int = 29533) -> dict:
    procs, threads = MODES[mode]
    args = [
        "embed",
        str(table),
        "--out",
        str(out),
        "--device",
        "cpu",
        "--part-rows",
        str(part_rows),
    ]
    if procs == "ray":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.conftest import LoopbackRayCluster  # one CPU a node, on loopback alone

        with LoopbackRayCluster(nodes=threads, object_store_mib=1024) as cluster:
            command = cluster.command([smiexlm_command(), *args, "--ray", cluster.address])
            row = _timed(mode, command, out, cluster.env)
        return row | {"startup_s": round(cluster.startup_s, 1)}
    if procs == 1:
        cmd = [smiexlm_command(), *args, "--threads", str(threads)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
               "--master_addr", "127.0.0.1", "--master_port", str(port), "--no-python",
               smiexlm_command(), *args]  # fmt: skip
    return _timed(mode, cmd, out)


def _timed(mode: str, cmd: list[str], out: Path, env: dict | None = None) -> dict:
    """One run of ``cmd``: wall and CPU time (the Ray cluster's processes are not its
    children: their CPU is not counted), load, peak memory from the manifest."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    manifest = json.loads((out / "manifest.json").read_text())
    peaks = [w.get("peak_rss_mib") for w in manifest["last_run"]["workers"]]
    return {"mode": mode, "n": manifest["n_rows"], "wall_s": round(wall, 1),
            "mol_per_s": round(manifest["n_rows"] / wall, 1), "cpu_s": round(cpu, 1),
            "load_start": round(load, 2), "load_end": round(os.getloadavg()[0], 2),
            "peak_rss_mib": peaks, "failed": manifest["n_failed"]}  # fmt: skip


def compare(out: Path, first: Path) -> dict:
    """The table of ``out`` against that of ``first``, one part at a time (10^6 molecules
    are 4.6 GB of float32): the same ids in the same order, the largest difference, bitwise."""
    from itertools import zip_longest

    from smiexlm.parts.reading import iter_parts

    same_ids, worst, bitwise = True, 0.0, True
    for a, b in zip_longest(iter_parts(out), iter_parts(first)):
        if a is None or b is None or a.num_rows != b.num_rows:
            return {"same_ids": False, "max_abs_diff": float("nan"), "bitwise": False}
        x, y = a.to_pandas(), b.to_pandas()
        same_ids &= x["id"].tolist() == y["id"].tolist()
        ex, ey = x.filter(regex=r"^e\d+$").to_numpy(), y.filter(regex=r"^e\d+$").to_numpy()
        worst = max(worst, float(np.nanmax(np.abs(ex - ey))))
        bitwise &= bool(np.array_equal(ex, ey, equal_nan=True))
    return {"same_ids": same_ids, "max_abs_diff": worst, "bitwise": bitwise}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20000, 100000])
    parser.add_argument("--modes", nargs="+", default=list(MODES)[:3], choices=list(MODES))
    parser.add_argument("--part-rows", type=int, default=10000)
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the last 2-process folder here"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--port", type=int, default=29533, help="torchrun's rendezvous port")
    args = parser.parse_args()
    source = Path(os.environ["SMIEXLM_DATA"]) / "pretrain" / "moses_train.smi.gz"
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for n in args.sizes:
            table = Path(scratch) / f"moses_{n}.csv"
            write_input(source, n, table)
            first = None
            for mode in args.modes:
                out = Path(scratch) / f"emb_{n}_{mode.replace(' ', '_')}"
                row = run(mode, table, out, args.part_rows, args.port)
                reference = {"same_ids": True, "max_abs_diff": 0.0, "bitwise": True}
                row |= reference if first is None else compare(out, first)
                print(json.dumps(row), flush=True)
                rows.append(row)
                if args.keep is not None and mode.startswith("2 procs"):
                    shutil.rmtree(args.keep, ignore_errors=True)
                    shutil.copytree(out, args.keep)
                if first is None:
                    first = out  # kept until the size is done: the others compare to it
                else:
                    shutil.rmtree(out)
            if first is not None:
                shutil.rmtree(first)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
