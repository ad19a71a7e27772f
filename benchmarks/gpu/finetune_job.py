"""One fine-tuning run of the GPU campaign's phase 4: a backbone, a MoleculeNet task, a seed.

    python benchmarks/gpu/finetune_job.py --cache FINETUNE_DIR --task bbbp --seed 0 \
        --checkpoint MODEL_DIR --out RESULT.json [--epochs N] [--device cuda]

It reads the cached task (``prepare.py``: cleaned rows, canonical SMILES, scaffold split), so
it needs no RDKit, runs :func:`smiexlm.finetuning.adapter.finetune_once` with the task's
Table 8 config and writes the :class:`RunResult` as JSON. Many of these run at once, one
process each, sharing the GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def load_task(cache: Path, task: str):
    """(MoleculeTask, Split, model inputs) of a cached task."""
    import pandas as pd

    from smiexlm.moleculenet.splits import Split
    from smiexlm.moleculenet.task import MoleculeTask

    record = json.loads((cache / f"{task}.json").read_text())  # written by prepare.py
    frame = pd.read_csv(cache / f"{task}.csv", low_memory=False)
    parts = {
        part: frame.index[frame["part"] == part][frame["rank"][frame["part"] == part].argsort()]
        for part in ("train", "valid", "test")
    }
    split = Split("scaffold", None, *(parts[p].tolist() for p in ("train", "valid", "test")))
    inputs = frame["input"].tolist()
    label_cols = list(record["label_cols"])
    molecules = MoleculeTask(
        name=record["name"], smiles=frame["smiles"].tolist(),
        labels=frame[label_cols].to_numpy(dtype=float), label_cols=label_cols,
        task_type=record["task_type"], source=record.get("source"), sha256=record.get("sha256"),
        n_raw=record.get("n_raw"), n_invalid=int(record.get("n_invalid", 0)),
        invalid=[tuple(row) for row in record.get("invalid", [])],
    )  # fmt: skip
    return molecules, split, inputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--name", default=None, help="the backbone's name in the report")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=None, help="override Table 8's epochs")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)

    import torch

    from smiexlm.finetuning.adapter import finetune_once
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.config import finetune_config

    torch.set_num_threads(1)
    task, split, inputs = load_task(args.cache, args.task)
    cfg = finetune_config(args.task, epochs=args.epochs, device=args.device, forest="none")
    result = finetune_once(
        task, split, cfg, args.seed, Backbone(checkpoint=args.checkpoint), inputs=inputs,
        progress=False,
    )  # fmt: skip
    if args.name:
        result.model = args.name
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dataclasses.asdict(result), indent=1, default=str))
    print(f"{args.task} seed {args.seed}: test {result.test:.2f} valid {result.valid:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
