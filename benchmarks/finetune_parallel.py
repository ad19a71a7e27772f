"""One fine-tuning run on one core, on two threads, and on two data-parallel processes.

Runs the real command three times, one after the other, on the same set, seed and schedule:

    export SMIEXLM_DATA=../shared/data
    python benchmarks/finetune_parallel.py --task bbbp --epochs 10 --out benchmarks/results/finetune

1. ``smiexlm finetune TASK`` with ``OMP_NUM_THREADS=1`` (the one-process result path);
2. the same with ``OMP_NUM_THREADS=2`` (torch's intra-op threads);
3. ``smiexlm finetune TASK --processes 2`` (two processes of one thread, each half a batch).

Wall time is what a user waits for; it counts only on an otherwise idle machine, which the
script checks (the 1-minute load average before each run is recorded). Speed-ups are ratios
to (1) measured in the same invocation. Raw records go to ``OUT/parallel.json``.
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

WAYS = {  # name -> (OMP threads, extra arguments)
    "1 process, 1 thread": (1, []),
    "1 process, 2 threads": (2, []),
    "2 processes, 1 thread each": (1, ["--processes", "2"]),
}


def smiexlm() -> str:
    beside = Path(sys.executable).with_name("smiexlm")
    return str(beside) if beside.is_file() else "smiexlm"


def one(task: str, epochs: int, seed: int, threads: int, extra: list[str], root: Path) -> dict:
    out = root / f"run{len(list(root.iterdir()))}"
    # the network's fine-tuning alone: the forest kept beside it by default is not timed here
    command = [smiexlm(), "finetune", task, "--epochs", str(epochs), "--seeds", str(seed),
               "--device", "cpu", "--forest", "none", "--out", str(out), *extra]  # fmt: skip
    load = os.getloadavg()[0]
    start = time.perf_counter()
    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    result = json.loads((out / "runs" / task / f"seed{seed}" / "result.json").read_text())["result"]
    config = result["config"]
    return {
        # the run folder is a temporary one: the record names its place, not its path
        "command": " ".join(command[1:]).replace(str(out), "RUN"), "threads": threads, "load_before": round(load, 2),
        "wall_s": round(wall, 1), "train_s": config["train_seconds"],
        "train_cpu_s": config["train_cpu_seconds"], "steps": config["steps"],
        "precision": config["precision"], "test": round(result["test"], 2),
        "best_epoch": result["best_epoch"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="bbbp")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ways", nargs="+", choices=list(WAYS), default=list(WAYS))
    parser.add_argument("--out", type=Path, default=None, help="folder for parallel.json")
    parser.add_argument("--max-train-steps", type=int, default=None, help="smoke runs only")
    args = parser.parse_args()
    cap = [] if args.max_train_steps is None else ["--max-train-steps", str(args.max_train_steps)]
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.ways:
            threads, extra = WAYS[name]
            extra = [*extra, *cap]
            records[name] = one(args.task, args.epochs, args.seed, threads, extra, Path(tmp))
            print(name, records[name], flush=True)
    base = records[args.ways[0]]["train_s"]
    print(f"\n{args.task}, {args.epochs} epochs, seed {args.seed}, {platform.machine()}, "
          f"{os.cpu_count()} cores\n")  # fmt: skip
    print("| way | training wall s | speed-up | whole command s | CPU s | test | load before |")
    print("|---|---|---|---|---|---|---|")
    for name, r in records.items():
        print(f"| {name} | {r['train_s']:.1f} | {base / r['train_s']:.2f}x | {r['wall_s']:.1f} | "
              f"{r['train_cpu_s']:.0f} | {r['test']:.1f} | {r['load_before']} |")  # fmt: skip
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "parallel.json").write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
