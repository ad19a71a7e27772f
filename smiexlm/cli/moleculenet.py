"""MoleculeNet commands: finetune, benchmark, baseline, predict.

Heavy imports (torch, RDKit, pandas) happen inside the command bodies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

Seeds = Annotated[list[int], typer.Option("--seeds", help="Training seeds (one run each).")]
Split = Annotated[
    str,
    typer.Option(help="scaffold (DeepChem-equal, no seed) | scaffold_chiral | balanced_scaffold "
                 "(seeded) | random (seeded)."),
]  # fmt: skip
Out = Annotated[Path, typer.Option("--out", help="Folder for results.csv, report.md, report.png.")]
DataCsv = Annotated[
    Optional[Path], typer.Option("--data", help="Your own CSV instead of a MoleculeNet set.")
]
SmilesCol = Annotated[str, typer.Option("--smiles-col", help="SMILES column of --data.")]
LabelCols = Annotated[
    Optional[list[str]], typer.Option("--label-cols", help="Label column(s) of --data.")
]
TaskTypeOpt = Annotated[
    str, typer.Option("--task-type", help="classification (0/1, blank = missing) | regression.")
]


def _tasks(tasks: list[str]) -> list[str]:
    from smiexlm.moleculenet.registry import PAPER_TASKS

    names = [t.strip().lower() for item in tasks for t in item.split(",") if t.strip()]
    return list(PAPER_TASKS) if names == ["all"] else names


def _frames(tasks: list[str], data: Path | None, smiles_col: str, label_cols, task_type: str):
    from smiexlm.moleculenet import load_csv, load_dataset

    if data is not None:
        return [load_csv(data, smiles_col, label_cols or [], task_type)]  # type: ignore[arg-type]
    return [load_dataset(name) for name in _tasks(tasks)]


def _print_report(results, out: Path, title: str) -> None:
    import sys

    from smiexlm.moleculenet.report import markdown_table, write_report

    paths = write_report(results, out, title, command="smiexlm " + " ".join(sys.argv[1:]))
    typer.echo(markdown_table(results))
    typer.echo(f"wrote {', '.join(str(p) for p in paths.values())}")


def baseline(
    tasks: Annotated[list[str], typer.Option("--tasks", help="Dataset names, or 'all' (the paper's seven).")] = ["all"],  # noqa: E501
    seeds: Seeds = [0, 1, 2],
    n_trees: Annotated[int, typer.Option("--n-trees", help="Trees per forest.")] = 500,
    split: Split = "scaffold",
    data: DataCsv = None,
    smiles_col: SmilesCol = "smiles",
    label_cols: LabelCols = None,
    task_type: TaskTypeOpt = "classification",
    out: Out = Path("runs/baseline"),
) -> None:
    """RandomForest on Morgan radius-2 2048-bit fingerprints (ECFP4), same splits and seeds."""
    from smiexlm.moleculenet.baseline import BaselineConfig, run_baseline

    cfg = BaselineConfig(n_trees=n_trees, split=split)
    results = []
    for df in _frames(tasks, data, smiles_col, label_cols, task_type):
        results += run_baseline(df, seeds, cfg)
    _print_report(results, out, "RF-ECFP4 baseline")


Checkpoint = Annotated[
    Optional[Path],
    typer.Option("--checkpoint", help="Pretrained folder (config.json, vocab.json, "
                 "model.safetensors). Omit for a random init of --preset."),
]  # fmt: skip
Preset = Annotated[str, typer.Option(help="Preset for random init when no --checkpoint.")]
Objective = Annotated[str, typer.Option(help="Objective of the random init (mlm, exlm, maelm).")]
Epochs = Annotated[Optional[int], typer.Option(help="Override the Table 8 epochs.")]
MaxSteps = Annotated[
    Optional[int], typer.Option("--max-train-steps", help="Stop each run after N steps.")
]
BatchSize = Annotated[Optional[int], typer.Option("--batch-size", help="Override batch size.")]
Lr = Annotated[Optional[float], typer.Option("--lr", help="Override the learning rate.")]
NoCanon = Annotated[
    bool, typer.Option("--no-canonicalize", help="Keep SMILES as written (default: canonical).")
]
Device = Annotated[str, typer.Option(help="auto (CUDA when available) | cpu | cuda[:N].")]


def _config(task, split, epochs, max_train_steps, batch_size, lr, no_canonicalize, device):
    from smiexlm.moleculenet.configs import finetune_config

    return finetune_config(
        task, split=split, epochs=epochs, max_train_steps=max_train_steps,
        batch_size=batch_size, lr=lr, canonicalize=False if no_canonicalize else None,
        device=device,
    )  # fmt: skip


def finetune(
    task: Annotated[str, typer.Argument(help="Dataset name (bbbp, tox21, ...), or 'csv' with --data.")],  # noqa: E501
    checkpoint: Checkpoint = None,
    seeds: Seeds = [0, 1, 2],
    preset: Preset = "tiny",
    objective: Objective = "mlm",
    split: Split = "scaffold",
    epochs: Epochs = None,
    max_train_steps: MaxSteps = None,
    batch_size: BatchSize = None,
    lr: Lr = None,
    no_canonicalize: NoCanon = False,
    device: Device = "auto",
    data: DataCsv = None,
    smiles_col: SmilesCol = "smiles",
    label_cols: LabelCols = None,
    task_type: TaskTypeOpt = "classification",
    save_dir: Annotated[Optional[Path], typer.Option("--save-dir", help="Keep each seed's best model here (for predict).")] = None,  # noqa: E501
    out: Out = Path("runs/finetune"),
) -> None:
    """Fine-tune on one dataset with the paper's per-task config; test ROC-AUC per seed."""
    from smiexlm.moleculenet.finetune import Backbone, run_finetune

    cfg = _config(None if data else task, split, epochs, max_train_steps, batch_size, lr,
                  no_canonicalize, device)  # fmt: skip
    (df,) = _frames([task], data, smiles_col, label_cols, task_type)
    results = run_finetune(df, cfg, Backbone(checkpoint, preset, objective), seeds, save_dir)
    _print_report(results, out, f"Fine-tuning {df.attrs['name']}")


def benchmark(
    tasks: Annotated[list[str], typer.Option("--tasks", help="Dataset names, or 'all' (the paper's seven).")] = ["all"],  # noqa: E501
    checkpoint: Checkpoint = None,
    seeds: Seeds = [0, 1, 2],
    preset: Preset = "tiny",
    objective: Objective = "mlm",
    split: Split = "scaffold",
    epochs: Epochs = None,
    max_train_steps: MaxSteps = None,
    device: Device = "auto",
    with_baseline: Annotated[bool, typer.Option("--with-baseline", help="Also run the RF-ECFP4 baseline (500 trees).")] = False,  # noqa: E501
    out: Out = Path("runs/benchmark"),
) -> None:
    """Fine-tune on several datasets x seeds and write one report next to the paper's numbers."""
    from smiexlm.moleculenet.baseline import BaselineConfig, run_baseline
    from smiexlm.moleculenet.finetune import Backbone, run_finetune

    backbone, results = Backbone(checkpoint, preset, objective), []
    for df in _frames(tasks, None, "smiles", None, "classification"):
        cfg = _config(df.attrs["name"], split, epochs, max_train_steps, None, None, False, device)
        results += run_finetune(df, cfg, backbone, seeds)
        if with_baseline:
            results += run_baseline(df, seeds, BaselineConfig(split=split))
    _print_report(results, out, f"MoleculeNet benchmark: {backbone.name}")


def predict(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="A fine-tuned folder (from finetune --save-dir).")],  # noqa: E501
    input: Annotated[Path, typer.Option("--input", help="CSV with a SMILES column.")],
    smiles_col: SmilesCol = "smiles",
    output: Annotated[Path, typer.Option("--output", help="Predictions CSV.")] = Path("predictions.csv"),  # noqa: E501
) -> None:
    """Predict with a fine-tuned model: one row per input, NaN for unparsable SMILES."""
    import pandas as pd

    from smiexlm.errors import DataError
    from smiexlm.moleculenet.finetune import predict as run_predict

    frame = pd.read_csv(input)
    if smiles_col not in frame.columns:
        raise DataError(f"--smiles-col {smiles_col!r} not in {input.name} columns {list(frame.columns)[:10]}")
    preds = run_predict(checkpoint, frame[smiles_col].astype(str).str.strip().tolist())
    preds.to_csv(output, index=False)
    typer.echo(f"wrote {len(preds)} rows ({int((~preds['valid']).sum())} unparsable) to {output}")


def register(app: typer.Typer) -> None:
    app.command()(finetune)
    app.command()(benchmark)
    app.command()(baseline)
    app.command()(predict)
