"""What the kernel members cost: ``smiexlm finetune`` of a regression set and ``smiexlm
predict`` of new molecules, served as before them (the network and its forest, ``--set
kernels=none``) and as served now (the default: the kernels beside them, ``combine =
picked``), side by side in one run.

    export SMIEXLM_DATA=../shared/data
    python benchmarks/members_cost.py --task esol --seed 0 --predict-rows 2000 \
        --out benchmarks/results/potency

Runs the real commands, one after the other on one thread each (``OMP_NUM_THREADS=1``), and
reports their wall and CPU seconds. ``predict`` is timed on ``--predict-rows`` MOSES test
molecules and on one molecule; the difference, per 1,000 molecules, is its cost without the
start-up (loading Python, torch and the folder), which is reported apart. Writes
``members_cost.json`` and ``members_cost.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_memory import smiexlm_command  # noqa: E402  (the one way to find the command)

VARIANTS = {"before: network + forest": ["--set", "kernels=none"], "served: + kernels": []}


def timed(args: list[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of the command, which must succeed."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(args)} failed:\n{done.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return round(wall, 1), round(cpu, 1)


def molecules(n: int, path: Path) -> Path:
    """A CSV of the first ``n`` MOSES test molecules."""
    data = Path(os.environ.get("SMIEXLM_DATA", "../shared/data"))
    with gzip.open(data / "pretrain" / "moses_test.smi.gz", "rt") as handle:
        rows = [line.split()[0] for line, _ in zip(handle, range(n + 1), strict=False)][1:]
    path.write_text("smiles\n" + "\n".join(rows) + "\n")
    return path


def run(task: str, seed: int, n: int, scratch: Path, settings: list[str]) -> list[dict]:
    many, one = molecules(n, scratch / "many.csv"), molecules(1, scratch / "one.csv")
    rows = []
    for i, (name, extra) in enumerate(VARIANTS.items()):
        model = scratch / f"model{i}"
        wall, cpu = timed([smiexlm_command(), "finetune", task, "--seeds", str(seed),
                           "--device", "cpu", "--save-dir", str(model),
                           "--out", str(scratch / f"run{i}"), *settings, *extra])  # fmt: skip
        predict = [smiexlm_command(), "predict", "--checkpoint", str(model / f"seed{seed}")]
        p_wall, p_cpu = timed([*predict, "--input", str(many), "--out", str(scratch / "p.csv")])
        s_wall, s_cpu = timed([*predict, "--input", str(one), "--out", str(scratch / "q.csv")])
        rows.append({"variant": name, "finetune_wall_s": wall, "finetune_cpu_s": cpu,
                     "predict_rows": n, "predict_wall_s": p_wall, "predict_start_wall_s": s_wall,
                     "predict_per_1000_wall_s": round(1000 * (p_wall - s_wall) / n, 2),
                     "predict_per_1000_cpu_s": round(1000 * (p_cpu - s_cpu) / n, 2)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def report(rows: list[dict], command: str, machine: str) -> str:
    base = rows[0]
    lines = ["# What the kernel members cost", "", f"`{command}`", "", f"{machine}.", "",
             "| served | finetune wall s (CPU s) | ratio | predict, per 1,000 molecules, wall s "
             "(CPU s) | ratio | predict start-up wall s |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['finetune_wall_s']:.0f} ({r['finetune_cpu_s']:.0f}) | "
            f"{r['finetune_wall_s'] / base['finetune_wall_s']:.2f}x | "
            f"{r['predict_per_1000_wall_s']:.1f} ({r['predict_per_1000_cpu_s']:.1f}) | "
            f"{r['predict_per_1000_wall_s'] / base['predict_per_1000_wall_s']:.2f}x | "
            f"{r['predict_start_wall_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="esol")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--predict-rows", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON and report here")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a fine-tuning setting for both (a smoke run's short schedule)",
    )
    args = parser.parse_args()
    machine = f"{platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}"
    with tempfile.TemporaryDirectory() as scratch:
        settings = [word for kv in args.set for word in ("--set", kv)]
        rows = run(args.task, args.seed, args.predict_rows, Path(scratch), settings)
    text = report(rows, "python benchmarks/members_cost.py " + " ".join(sys.argv[1:]), machine)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "members_cost.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "members_cost.md").write_text(text)


if __name__ == "__main__":
    main()
