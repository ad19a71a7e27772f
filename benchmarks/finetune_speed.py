"""Fine-tuning speed, before and after, side by side in one run (BBBP, shipped model, 1 thread).

    export SMIEXLM_DATA=../shared/data
    python benchmarks/finetune_speed.py --before-rev 74a1f88 --before-steps 104 --after-seeds 0 \\
        --out benchmarks/results/finetune

*Before* is the package as it was at ``--before-rev`` (``git archive`` into a temporary folder,
imported from there through ``PYTHONPATH``; nothing of it is kept). *After* is this checkout.
Both run the same script, in their own process, one thread each, Table 8's BBBP config (40
epochs, batch 128, lr 4e-4) on the deterministic scaffold split: ``finetune_once`` on seed
``s``. ``--before-steps`` caps the old loop's updates (it costs ~4x more per step); the new loop
runs the whole schedule. The rounds alternate (before, after, before, ...) so that both see the
same machine load. Reported: wall and process-CPU seconds per update (CPU time is what a busy
machine does not inflate), and test ROC-AUC at the epoch chosen on valid.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = r"""
import json, sys, time
import torch
torch.set_num_threads(1)
import smiexlm
from smiexlm import moleculenet
try:
    from smiexlm.finetuning.config import finetune_config
except ImportError:  # packages before the config moved into smiexlm.finetuning
    from smiexlm.moleculenet.configs import finetune_config
try:
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.adapter import finetune_once
except ImportError:  # packages before the adapter moved into smiexlm.finetuning
    from smiexlm.moleculenet.backbone import Backbone
    from smiexlm.moleculenet.finetune import finetune_once
from smiexlm.moleculenet.splits import make_split
from smiexlm.paths import PACKAGE_DIR

seed, steps, amp = int(sys.argv[1]), (int(sys.argv[2]) or None), sys.argv[3]
# the task where the package has one; older packages took the table as a DataFrame
if hasattr(moleculenet, "load_task"):
    data = moleculenet.load_task("bbbp")
    smiles = data.smiles
else:
    data = moleculenet.load_dataset("bbbp")
    smiles = data["smiles"].tolist()
extra = {} if amp == "-" else {"amp": amp}  # the old config has no amp field
cfg = finetune_config("bbbp", device="cpu", max_train_steps=steps, forest="none", **extra)
split = make_split(smiles, cfg.split, seed)
backbone = Backbone(checkpoint=PACKAGE_DIR / "assets" / "default_model")
wall, cpu = time.perf_counter(), time.process_time()
r = finetune_once(data, split, cfg, seed, backbone)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({"package": smiexlm.__file__, "seed": seed, "steps": r.config["steps"],
                  "wall_s": wall, "cpu_s": cpu, "test": r.test, "valid": r.valid,
                  "best_epoch": r.best_epoch}))
"""


def run_side(pythonpath: Path | None, seed: int, steps: int | None, amp: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TQDM_DISABLE="1")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(seed), str(steps or 0), amp],
        env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before-rev", required=True, help="git revision of the old loop")
    parser.add_argument("--before-steps", type=int, default=104, help="0 = the whole schedule")
    parser.add_argument("--before-seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--after-seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--after-steps", type=int, default=0, help="0 = the whole schedule")
    parser.add_argument(
        "--after-amp", nargs="+", default=["off"], help="after runs per seed: off (fp32) | bf16"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(
            ["git", "archive", args.before_rev, "smiexlm"], cwd=ROOT, capture_output=True,
            check=True,
        )  # fmt: skip
        subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
        plan = []
        for i in range(max(len(args.before_seeds), len(args.after_seeds))):
            if i < len(args.before_seeds):
                plan.append(("before", Path(old), args.before_seeds[i], args.before_steps, "-"))
            if i < len(args.after_seeds):
                for amp in args.after_amp:
                    plan.append(("after", None, args.after_seeds[i], args.after_steps, amp))
        for side, path, seed, steps, amp in plan:
            row = run_side(path, seed, steps, amp) | {"side": side, "amp": amp}
            row["package"] = args.before_rev if side == "before" else "this checkout"
            rows.append(row)
            print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speed.json").write_text(json.dumps(rows, indent=1))
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["side"] + ("" if r["amp"] == "-" else f" ({r['amp']})"), []).append(r)
    base = None
    for name, group in groups.items():
        steps = sum(r["steps"] for r in group)
        cpu = sum(r["cpu_s"] for r in group) / steps
        wall = sum(r["wall_s"] for r in group) / steps
        base = base or cpu
        tests = ", ".join(f"{r['test']:.1f}" for r in group)
        print(f"{name}: CPU {cpu:.3f} s/step, wall {wall:.3f} s/step, "
              f"{base / cpu:.2f}x by CPU time; test ROC-AUC per seed {tests}")  # fmt: skip


if __name__ == "__main__":
    main()
