"""What ``finetune`` serves on the regression sets from another pre-trained backbone, beside
what it serves from the shipped default.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/backbone_served.py --checkpoint runs/mordred20k/model \\
        --name "Mordred MTR, 20k molecules" --sets lipophilicity bace_pic50 esol freesolv \\
        --seeds 0 1 2 --jobs 2 --work runs/backbone_served --out benchmarks/results/mordred

Each (set, seed) is the real command, ``smiexlm finetune SET --checkpoint C --seeds K --out
WORK/SET_sK --resume`` (``bace_pic50``: BACE's own potency column as a table of one's own,
``--data bace.csv --smiles-col mol --label-cols pIC50 --task-type regression``), ``--jobs`` at
a time on one thread each; a cell whose ``results.json`` is there is read back, so the job
resumes. From each cell: the served test RMSE, its members' alone and the RMSE on the test
molecules that form activity cliffs. Beside them, the default's served figures of the same
splits and seeds (``picked`` in ``benchmarks/results/potency/<set>.json``). Writes
``served.json`` (every cell) and ``served.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_memory import smiexlm_command  # noqa: E402  (the one way to find the command)

DEFAULT = Path(__file__).resolve().parent / "results" / "potency"
MEMBERS = ("model", "forest", "svr_tanimoto", "svr_rbf", "svr_both")


def cell_command(task: str, seed: int, checkpoint: Path, out: Path,
                 settings: list[str]) -> list[str]:  # fmt: skip
    extra = [word for setting in settings for word in ("--set", setting)]
    if task == "bace_pic50":
        bace = Path(os.environ["SMIEXLM_DATA"]) / "moleculenet" / "bace.csv"
        extra += ["--data", str(bace), "--smiles-col", "mol", "--label-cols", "pIC50",
                  "--task-type", "regression"]  # fmt: skip
    return [smiexlm_command(), "finetune", task, *extra, "--checkpoint", str(checkpoint),
            "--seeds", str(seed), "--device", "cpu", "--out", str(out), "--resume"]  # fmt: skip


def run_cell(task: str, seed: int, args) -> dict | None:
    """The cell's figures, fine-tuning it first when its results are not there (None with
    ``--finished-only``)."""
    out = args.work / f"{task}_s{seed}"
    seconds = None
    if args.finished_only and not (out / "results.json").is_file():
        return None
    if not (out / "results.json").is_file():
        env = os.environ | {"OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
        start = time.perf_counter()
        command = cell_command(task, seed, args.checkpoint, out, args.set)
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{task} seed {seed} failed:\n{done.stderr[-3000:]}")
        seconds = round(time.perf_counter() - start, 1)
    (record,) = json.loads((out / "results.json").read_text())
    kept = record["config"]  # each member's scores alone, as the run recorded them
    return {"set": task, "seed": seed, "test": record["test"], "valid": record["valid"],
            "cliff": record.get("more", {}).get("cliff_rmse"), "seconds": seconds,
            "members": {m: kept.get(f"test_{m}") for m in MEMBERS},
            "members_cliff": {m: kept.get(f"test_cliff_{m}") for m in MEMBERS},
            "weights": {m: kept.get(f"member_weight_{m}") for m in MEMBERS}}  # fmt: skip


def default_served(task: str, seed: int) -> dict | None:
    """The shipped default's figures of a cell as ``run_cell`` gives them: served (``picked``)
    and each member alone, from ``benchmarks/results/potency/<set>.json``."""
    from smiexlm.moleculenet.registry import ALIASES

    path = DEFAULT / f"{ALIASES.get(task, task)}.json"
    if not path.is_file():
        return None
    rows = {
        r["combination"]: r for r in json.loads(path.read_text())["seeds"].get(f"seed{seed}", [])
    }
    if "picked" not in rows:
        return None
    return {"test": rows["picked"]["test"], "cliff": rows["picked"]["test_cliff"],
            "members": {m: rows.get(m, {}).get("test") for m in MEMBERS}}  # fmt: skip


def _mean(values: list) -> str:
    values = [v for v in values if v is not None]
    return f"{np.mean(values):.3f}" if values else "–"


def _row(label: str, cells: list[dict]) -> str:
    served = f"{_mean([c['test'] for c in cells])} ({_mean([c['cliff'] for c in cells])})"
    alone = [_mean([c["members"][m] for c in cells]) for m in MEMBERS]
    return f"| {label} | {served} | " + " | ".join(alone) + " |"


def report(rows: list[dict], args) -> str:
    lines = [f"# What `finetune` serves from {args.name}, beside the shipped default", "",
             f"`python {shlex.join(sys.argv)}`", "",
             "Test RMSE, scaffold split, mean over the seeds of each row (on the test "
             "molecules that form activity cliffs in brackets); the default's figures of the "
             "same seeds are `benchmarks/results/potency`'s (`picked` served).", "",
             "| set, backbone | served (cliff) | " + " | ".join(f"{m} alone" for m in MEMBERS)
             + " |", "|---|---|" + "---|" * len(MEMBERS)]  # fmt: skip
    for task in dict.fromkeys(r["set"] for r in rows):
        mine = [r for r in rows if r["set"] == task]
        seeds = ", ".join(str(r["seed"]) for r in mine)
        lines.append(_row(f"{task} (seeds {seeds}), {args.name}", mine))
        base = [b for r in mine if (b := default_served(task, r["seed"])) is not None]
        if base:
            lines.append(_row(f"{task}, the default", base))
    if args.not_run:
        lines += ["", f"Not run: {', '.join(args.not_run)}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="pre-trained folder")
    parser.add_argument("--name", default="another backbone")
    parser.add_argument("--sets", nargs="+", default=["esol", "freesolv"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--jobs", type=int, default=1, help="cells at a time")
    parser.add_argument("--finished-only", action="store_true",
                        help="report the cells already run, and run none")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a fine-tuning setting for every cell (a smoke run's caps)")  # fmt: skip
    parser.add_argument("--work", type=Path, default=Path("runs/backbone_served"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mordred"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    cells = [(task, seed) for task in args.sets for seed in args.seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        found = list(pool.map(lambda c: run_cell(*c, args), cells))
    rows = [r for r in found if r is not None]
    args.not_run = [f"{t} seed {k}" for (t, k), r in zip(cells, found, strict=True) if r is None]
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "name": args.name,
        "checkpoint": str(args.checkpoint),
        "runs": rows,
        "not_run": args.not_run,
    }
    (args.out / "served.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "served.md").write_text(report(rows, args))
    print(report(rows, args))


if __name__ == "__main__":
    main()
