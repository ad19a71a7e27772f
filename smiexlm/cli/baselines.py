"""The MoleculeNet commands that train no network: ``probe`` (a linear model on the frozen
model's embeddings) and ``baseline`` (random forests on fingerprints or descriptors).

Heavy imports happen inside the command bodies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from smiexlm.cli.moleculenet import (
    Checkpoint,
    DataCsv,
    LabelCols,
    Out,
    Overwrite,
    Resume,
    Seeds,
    SmilesCol,
    Split,
    TaskArg,
    Tasks,
    TaskTypeOpt,
    ValidFromTrain,
    _check_outputs,
    _load_tasks,
    _print_report,
    _seeds,
)
from smiexlm.cli.options import multi_value
from smiexlm.cli.params import Device, Pooling

Whiten = Annotated[
    bool | None,
    typer.Option("--whiten/--no-whiten", show_default=False, help="Apply the model folder's "
                 "corpus whitening first (default: as its embedding.json says, where it stores "
                 "a whitening of the chosen pooling and blocks)."),
]  # fmt: skip
Tta = Annotated[
    int,
    typer.Option("--tta", min=0, help="Each embedding the mean over the canonical and K random "
                 "SMILES of the molecule (default 0)."),
]  # fmt: skip
Layers = Annotated[
    int | None,
    typer.Option("--layers", min=1, show_default=False, help="Pool the outputs of the last N "
                 "blocks and put them side by side (default: the model's own, embedding.json)."),
]  # fmt: skip
ProbeSaveDir = Annotated[
    Path | None,
    typer.Option("--save-dir", help="Keep the fitted probe as a folder predict serves "
                 "(DIR/seed<k>: one per distinct fit, so one for a deterministic split). A seed "
                 "folder that exists already is refused unless --overwrite."),
]  # fmt: skip
ProbeFeatures = Annotated[
    str | None,
    typer.Option("--features", help="ecfp4 | rdkit2d | both: concatenate to the pooled "
                 "embedding (normalised on the train split)."),
]  # fmt: skip


def probe(
    task: TaskArg,
    checkpoint: Checkpoint = None,
    seeds: Seeds = None,
    split: Split = "scaffold",
    features: ProbeFeatures = None,
    device: Device = "auto",
    data: DataCsv = None,
    smiles_col: SmilesCol = "smiles",
    label_cols: LabelCols = None,
    task_type: TaskTypeOpt = None,
    valid_from_train: ValidFromTrain = None,
    out: Out = Path("runs/probe"),
    whiten: Whiten = None,
    pooling: Pooling = None,
    tta: Tta = 0,
    layers: Layers = None,
    save_dir: ProbeSaveDir = None,
    overwrite: Overwrite = False,
) -> None:
    """Linear probe: logistic/ridge regression on the frozen model's pooled embeddings
    (regularisation chosen on valid). Seconds, next to minutes for fine-tuning."""
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.probe import ProbeConfig, run_probe

    _check_outputs(out, save_dir)
    backbone = Backbone(checkpoint)
    if whiten is None:  # the model's own embedding, as pooling and layers default to it
        whiten = backbone.folder is not None and backbone.folder.serves_whitened(
            pooling or backbone.pooling, layers or backbone.layers
        )
    cfg = ProbeConfig(pooling=pooling, split=split, features=features, device=device, whiten=whiten,
                      tta=tta, layers=layers)  # fmt: skip
    seeds = _seeds(seeds)
    (loaded,) = _load_tasks([task], data, smiles_col, label_cols, task_type, split,
                            valid_from_train)  # fmt: skip
    results = run_probe(loaded, backbone, seeds, cfg, save_dir=save_dir, overwrite=overwrite)
    _print_report(results, out, f"Linear probe {loaded.name}")


def baseline(
    tasks: Tasks = None,
    seeds: Seeds = None,
    features: Annotated[
        str, typer.Option("--features", help="ecfp4 (default) | rdkit2d | both.")
    ] = "ecfp4",
    n_trees: Annotated[int, typer.Option("--n-trees", help="Trees per forest.")] = 500,
    class_weight: Annotated[
        str, typer.Option("--class-weight", help="balanced (default) | none.")
    ] = "balanced",
    split: Split = "scaffold",
    data: DataCsv = None,
    smiles_col: SmilesCol = "smiles",
    label_cols: LabelCols = None,
    task_type: TaskTypeOpt = None,
    valid_from_train: ValidFromTrain = None,
    out: Out = Path("runs/baseline"),
    resume: Resume = False,
) -> None:
    """RandomForest on ECFP4 bits, RDKit 2D descriptors or both, same splits and seeds. Each
    (set, seed) keeps its predictions and result in --out: a stopped run goes on with
    --resume."""
    from smiexlm.forests.baseline import BaselineConfig, run_baseline
    from smiexlm.moleculenet.report import write_report

    _check_outputs(out)
    cfg = BaselineConfig(features, n_trees=n_trees, split=split, class_weight=class_weight)
    title = f"{cfg.model_name.split(' (')[0]} baseline"
    results, seeds = [], _seeds(seeds)
    for loaded in _load_tasks(tasks, data, smiles_col, label_cols, task_type, split,
                              valid_from_train):  # fmt: skip
        results += run_baseline(loaded, seeds, cfg, run_root=out / "runs", resume=resume)
        write_report(results, out, title)  # partial results survive an interrupt
    _print_report(results, out, title)


def register(app: typer.Typer) -> None:
    lists = multi_value("--seeds", "--tasks", "--label-cols")
    app.command(cls=lists)(probe)
    app.command(cls=lists)(baseline)
