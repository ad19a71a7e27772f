"""``smiexlm hpopt`` with one worker against several on the same budget: trials per hour.

    SMIEXLM_DATA=../shared/data python benchmarks/hpopt_workers.py --task bace --trials 8 \
        --max-train-steps 40 --out benchmarks/results/scale

Runs the real command twice in fresh folders, on one set with the same budget and settings:
one worker on the embedded SQLite study (the default), then ``--workers N`` on a journal
file (``--storage journal:PATH``). Reports each run's wall time, trials counted, failed and
given up as surplus, trials per hour and the ratio of the two, with the machine's load at the
start and the end; writes ``hpopt_workers.json`` and ``hpopt_workers.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def smiexlm_command() -> str:
    beside = Path(sys.executable).with_name("smiexlm")
    return str(beside) if beside.is_file() else "smiexlm"


def run(task: str, trials: int, steps: int, workers: int, folder: Path) -> dict:
    out = folder / f"w{workers}"
    args = [smiexlm_command(), "hpopt", task, "--trials", str(trials), "--max-train-steps",
            str(steps), "--device", "cpu", "--precision", "fp32", "--out", str(out)]  # fmt: skip
    if workers > 1:
        args += ["--storage", f"journal:{folder / f'w{workers}.journal'}", "--workers",
                 str(workers)]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    load, start = os.getloadavg()[0], time.perf_counter()
    subprocess.run(args, env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    states = _states(out / "trials.csv")
    done = states.count("complete") + states.count("pruned")
    return {"workers": workers, "storage": "sqlite" if workers == 1 else "journal",
            "wall_s": round(wall, 1), "counted": done, "failed": states.count("fail"),
            "trials_per_hour": round(3600 * done / wall, 1), "load_start": round(load, 2),
            "load_end": round(os.getloadavg()[0], 2)}  # fmt: skip


def _states(path: Path) -> list[str]:
    import csv

    with open(path, newline="") as handle:
        return [row["state"] for row in csv.DictReader(handle)]


def report(rows: list[dict], command: str, machine: str) -> str:
    base = rows[0]["trials_per_hour"]
    lines = ["# hpopt: one worker against several, same budget", "", f"`{command}`", "",
             f"{machine}.", "",
             "| workers | study | wall s | trials counted | failed | trials / hour | ratio | load start, end |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['workers']} | {r['storage']} | {r['wall_s']:.0f} | {r['counted']} | "
                     f"{r['failed']} | {r['trials_per_hour']:.0f} | "
                     f"{r['trials_per_hour'] / base:.2f}x | {r['load_start']}, {r['load_end']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="bace")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--max-train-steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON and report here")
    args = parser.parse_args()
    machine = f"{platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}"
    print(f"# {machine}")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for workers in (1, args.workers):
            row = run(args.task, args.trials, args.max_train_steps, workers, Path(scratch))
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(f"ratio: {rows[1]['trials_per_hour'] / rows[0]['trials_per_hour']:.2f}x")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        command = "python benchmarks/hpopt_workers.py " + " ".join(sys.argv[1:])
        (args.out / "hpopt_workers.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "hpopt_workers.md").write_text(report(rows, command, machine))


if __name__ == "__main__":
    main()
