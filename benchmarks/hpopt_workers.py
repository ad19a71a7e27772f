"""``smiexlm hpopt`` with one worker against several on the same budget: trials per hour.

    SMIEXLM_DATA=../shared/data python benchmarks/hpopt_workers.py --task bace --trials 8 \
        --max-train-steps 40 --out benchmarks/results/scale

Runs the real command twice in fresh folders, on one set with the same budget and settings:
one worker on the embedded SQLite study (the default), then ``--workers N`` on a journal
file (``--storage journal:PATH``). Reports each run's wall time, trials counted, failed and
given up as surplus, trials per hour and the ratio of the two, with the machine's load at the
start and the end; writes ``hpopt_workers.json`` and ``hpopt_workers.md`` into ``--out``.
Workers draw other trials than one worker does (the sampler sees fewer finished ones), and a
trial's cost depends on what it drew, so each run also reports the CPU seconds its counted
trials took and those per wall second: the share of the machine the workers kept busy,
whatever they drew.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_memory import smiexlm_command  # noqa: E402  (the one way to find the command)


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
    trials = _trials(out / "trials.csv")
    counted = [t for t in trials if t["state"] in ("complete", "pruned")]
    cpu = sum(float(t["cpu_s"]) for t in counted)
    return {"workers": workers, "storage": "sqlite" if workers == 1 else "journal",
            "wall_s": round(wall, 1), "counted": len(counted),
            "failed": sum(t["state"] == "fail" for t in trials),
            "trials_per_hour": round(3600 * len(counted) / wall, 1),
            "trial_cpu_s": round(cpu, 1), "busy": round(cpu / wall, 2),
            "load_start": round(load, 2), "load_end": round(os.getloadavg()[0], 2)}  # fmt: skip


def _trials(path: Path) -> list[dict[str, str]]:
    import csv

    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def report(rows: list[dict], command: str, machine: str) -> str:
    base = rows[0]
    lines = ["# hpopt: one worker against several, same budget", "", f"`{command}`", "",
             f"{machine}.", "",
             "| workers | study | wall s | trials counted | failed | trials / hour | ratio "
             "| trials' CPU s | busy CPUs (ratio) | load start, end |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['workers']} | {r['storage']} | {r['wall_s']:.0f} | {r['counted']} | "
                     f"{r['failed']} | {r['trials_per_hour']:.0f} | "
                     f"{r['trials_per_hour'] / base['trials_per_hour']:.2f}x | "
                     f"{r['trial_cpu_s']:.0f} | {r['busy']:.2f} ({r['busy'] / base['busy']:.2f}x) | "
                     f"{r['load_start']}, {r['load_end']} |")  # fmt: skip
    lines += [
        "",
        "Busy CPUs: the counted trials' CPU seconds per wall second; its ratio says "
        "how much more of the machine the workers kept busy, whatever trials they drew.",
    ]
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
    print(
        f"ratio: {rows[1]['trials_per_hour'] / rows[0]['trials_per_hour']:.2f}x trials/hour, "
        f"{rows[1]['busy'] / rows[0]['busy']:.2f}x busy CPUs"
    )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        command = "python benchmarks/hpopt_workers.py " + " ".join(sys.argv[1:])
        (args.out / "hpopt_workers.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "hpopt_workers.md").write_text(report(rows, command, machine))


if __name__ == "__main__":
    main()
