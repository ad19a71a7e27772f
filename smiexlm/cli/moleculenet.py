"""MoleculeNet commands: finetune, benchmark, baseline, probe (predict: :mod:`smiexlm.cli.predict`).

Heavy imports (torch, RDKit, pandas) happen inside the command bodies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from smiexlm.cli.options import given, multi_value
from smiexlm.cli.params import Device, Pooling

Seeds = Annotated[
    list[int] | None, typer.Option("--seeds", help="Training seeds, one run each (default: 0 1 2).")
]
Tasks = Annotated[
    list[str] | None,
    typer.Option("--tasks", help="Dataset names (repeat or comma-separate), or 'all' (the paper's "
                 "seven; default: all)."),
]  # fmt: skip
SaveDir = Annotated[
    Path | None,
    typer.Option("--save-dir", help="Keep each seed's best model here (DIR/seed0, ...; for "
                 "predict). A seed folder that exists already is refused unless --overwrite."),
]  # fmt: skip
Overwrite = Annotated[
    bool, typer.Option("--overwrite", help="Replace the seed folders --save-dir holds already.")
]
WithBaseline = Annotated[
    bool, typer.Option("--with-baseline", help="Also run the RF-ECFP4 baseline (500 trees).")
]
TaskArg = Annotated[
    str, typer.Argument(help="Dataset name (bbbp, tox21, ...); any name with --data.")
]
Split = Annotated[
    str,
    typer.Option(help="scaffold (DeepChem-equal, no seed) | scaffold_chiral | balanced_scaffold "
                 "(seeded) | random (seeded) | column:NAME (your table's own split: its column "
                 "NAME says train, valid or test in each row)."),
]  # fmt: skip
Out = Annotated[Path, typer.Option("--out", help="Folder for results.csv, report.md, report.png.")]
DataCsv = Annotated[
    Path | None,
    typer.Option("--data", help="Your own table (CSV/TSV/Parquet) instead of a MoleculeNet set."),
]
SmilesCol = Annotated[str, typer.Option("--smiles-col", help="SMILES column of --data.")]
LabelCols = Annotated[
    list[str] | None, typer.Option("--label-cols", help="Label column(s) of --data.")
]
ValidFromTrain = Annotated[
    float,
    typer.Option("--valid-from-train", help="With --split column:NAME whose column holds no "
                 "valid rows: this share of its train rows, by scaffold (seed 0), is the "
                 "validation part; 0 refuses such a column instead."),
]  # fmt: skip
TaskTypeOpt = Annotated[
    str | None,
    typer.Option("--task-type", help="Of --data: classification (0/1, blank = missing; the "
                 "default) | regression. A MoleculeNet set has its own."),
]  # fmt: skip


def _seeds(seeds: list[int] | None) -> list[int]:
    from smiexlm.moleculenet.task import check_seeds

    seeds = seeds or [0, 1, 2]
    check_seeds(seeds)  # before any data is read or model built
    return seeds


def _tasks(tasks: list[str] | None) -> list[str]:
    from smiexlm.moleculenet.registry import PAPER_TASKS

    tasks = tasks or ["all"]
    names = [t.strip().lower() for t in tasks if t.strip()]
    return list(PAPER_TASKS) if names == ["all"] else names


def _load_tasks(
    tasks: list[str] | None, data: Path | None, smiles_col: str, label_cols,
    task_type: str | None, split: str = "scaffold", valid_from_train: float = 0.1,
):  # fmt: skip
    """The MoleculeTasks to run: the user's table (``--data``, with its own split column for
    ``--split column:NAME``) or the MoleculeNet sets named."""
    from smiexlm.errors import ConfigError
    from smiexlm.moleculenet import load_task, read_task
    from smiexlm.moleculenet.splits import check_split_kind, split_column

    column = split_column(check_split_kind(split, "--split"))
    if data is not None:  # one task name given (finetune NAME --data) titles the results
        name = tasks[0] if tasks and len(tasks) == 1 else None
        labels = label_cols or []
        kind = task_type or "classification"
        return [read_task(data, smiles_col, labels, kind, name, column,  # type: ignore[arg-type]
                          valid_from_train=valid_from_train)]  # fmt: skip
    if column is not None:
        raise ConfigError("--split", split, "a computed split for a MoleculeNet set (column:NAME "
                          "reads the split column of your own table, --data)")  # fmt: skip
    if task_type is not None:  # never silently ignored
        from smiexlm.moleculenet.registry import get_spec

        own = ", ".join(f"{name}: {get_spec(name).task_type}" for name in _tasks(tasks))
        raise ConfigError("--task-type", task_type, "it only with --data (your own table); a "
                          f"MoleculeNet set is read with its own type ({own})")  # fmt: skip
    return (load_task(name) for name in _tasks(tasks))  # one set in memory at a time


def _check_outputs(out: Path, save_dir: Path | None = None) -> None:
    """Fail before any compute when the report folder (or --save-dir) cannot be written."""
    from smiexlm.paths import check_output

    check_output(out, "--out", "folder")
    if save_dir is not None:
        check_output(save_dir, "--save-dir", "folder")


def _spread(processes: int, ensemble: str | None = None) -> bool:
    """True when ``processes`` copies of this command ran it (exit with their code when one
    failed); False when this process is to run it itself (see ``distributed.relaunch``).
    A wide ``ensemble`` runs in one process."""
    import sys

    from smiexlm.pretraining.distributed import relaunch

    if ensemble not in (None, "none") and processes > 1:
        from smiexlm.errors import ConfigError

        raise ConfigError("--processes", processes, f"1 with --ensemble {ensemble} (its members "
                          "fine-tune one after the other in one process)")  # fmt: skip

    code = relaunch(processes, [sys.executable, *sys.argv])
    if code:
        raise typer.Exit(code)
    return code is not None


def _print_report(results, out: Path, title: str) -> None:
    import sys

    from smiexlm.moleculenet.report import (
        describe_splits,
        markdown_table,
        more_markdown,
        write_report,
    )
    from smiexlm.ranks import detect

    if not detect().is_main:
        return
    paths = write_report(results, out, title, command="smiexlm " + " ".join(sys.argv[1:]))
    typer.echo(f"split: {describe_splits(results)}")
    typer.echo(markdown_table(results))
    if more := more_markdown(results):
        typer.echo("\nbeside the score (test):\n" + more)
    typer.echo(f"wrote {', '.join(str(p) for p in paths.values())}")


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
    valid_from_train: ValidFromTrain = 0.1,
    out: Out = Path("runs/baseline"),
) -> None:
    """RandomForest on ECFP4 bits, RDKit 2D descriptors or both, same splits and seeds."""
    from smiexlm.moleculenet.baseline import BaselineConfig, run_baseline
    from smiexlm.moleculenet.report import write_report

    _check_outputs(out)
    cfg = BaselineConfig(features, n_trees=n_trees, split=split, class_weight=class_weight)
    title = f"{cfg.model_name.split(' (')[0]} baseline"
    results, seeds = [], _seeds(seeds)
    for loaded in _load_tasks(tasks, data, smiles_col, label_cols, task_type, split,
                              valid_from_train):  # fmt: skip
        results += run_baseline(loaded, seeds, cfg)
        write_report(results, out, title)  # partial results survive an interrupt
    _print_report(results, out, title)


Checkpoint = Annotated[
    Path | None,
    typer.Option("--checkpoint", help="Pretrained folder (config.json, vocab.json, "
                 "model.safetensors), or a shipped model's name (exlm, mlm, ...). Default: the shipped "
                 "default model."),
]  # fmt: skip
RandomInit = Annotated[
    bool, typer.Option("--random-init", help="Train a random init of --preset instead.")
]
Preset = Annotated[str, typer.Option(help="Preset for --random-init.")]
Objective = Annotated[str, typer.Option(help="Objective of the random init (mlm, exlm, maelm).")]
Epochs = Annotated[int | None, typer.Option(help="Override the Table 8 epochs.")]
MaxSteps = Annotated[
    int | None, typer.Option("--max-train-steps", help="Stop each run after N steps.")
]
BatchSize = Annotated[int | None, typer.Option("--batch-size", help="Override batch size.")]
Lr = Annotated[float | None, typer.Option("--lr", help="Override the learning rate.")]
NoCanon = Annotated[
    bool, typer.Option("--no-canonicalize", help="Keep SMILES as written (default: canonical).")
]
Freeze = Annotated[bool, typer.Option("--freeze", help="Train the head only (frozen encoder).")]
FreezeLayers = Annotated[
    int, typer.Option("--freeze-layers", help="Freeze the embeddings and the first N blocks.")
]
Features = Annotated[
    str | None,
    typer.Option("--features", help="ecfp4 | rdkit2d | both: concatenate to the pooled "
                 "embedding (normalised on the train split)."),
]  # fmt: skip
HeadLayers = Annotated[
    int | None,
    typer.Option("--layers", min=1, help="The head reads the pooled outputs of the last N blocks "
                 "side by side, from one pass (default: the blocks the model serves as its "
                 "embedding, the default model's last three; 1 for a folder without embedding.json)."),
]  # fmt: skip
HeadPooling = Annotated[
    str | None,
    typer.Option("--pooling", help="How the head pools each block: cls (Table 8's), mean, max, "
                 "or several joined by + (cls+mean+max), side by side."),
]  # fmt: skip
Patience = Annotated[
    int | None,
    typer.Option("--patience", help="Stop after N epochs without a better valid score "
                 "(default: the whole schedule)."),
]  # fmt: skip
EmaHalfLife = Annotated[
    float | None,
    typer.Option("--ema-half-life", min=0.0, help="Validate and keep a moving average of the "
                 "weights whose updates' weight halves every H epochs (default 0: the raw weights)."),
]  # fmt: skip
HeadEpochs = Annotated[
    int | None,
    typer.Option("--head-epochs", min=0, help="First train the head alone for N epochs on the "
                 "frozen encoder's features, then the whole model (default 0: from a random head)."),
]  # fmt: skip
HeadLr = Annotated[
    float | None,
    typer.Option("--head-lr", min=0.0, help="The learning rate of those epochs, decaying linearly "
                 "to 0 (default 1e-3)."),
]  # fmt: skip
LayerDecay = Annotated[
    float | None,
    typer.Option("--layer-decay", min=0.0, max=1.0, help="Layer-wise learning rates: each encoder "
                 "block learns this times as fast as the one above it (default 1: all at --lr)."),
]  # fmt: skip
Augment = Annotated[
    int | None,
    typer.Option("--augment", help="K random SMILES per training molecule; each epoch trains "
                 "on one of its K + 1 spellings (default 0: the canonical one only)."),
]  # fmt: skip
Tta = Annotated[
    int | None,
    typer.Option("--tta", help="Test-time augmentation: score each test molecule as the mean "
                 "over its canonical and K random SMILES (default 0); epochs are still chosen on "
                 "the canonical ones."),
]  # fmt: skip
AdaptSteps = Annotated[
    int | None,
    typer.Option("--adapt-steps", help="Before fine-tuning, N updates of the backbone's "
                 "descriptor regression (MTR) on the task's training molecules (default 0)."),
]  # fmt: skip
AdaptLr = Annotated[
    float | None, typer.Option("--adapt-lr", help="Learning rate of --adapt-steps (1e-4).")
]
Forest = Annotated[
    str | None,
    typer.Option("--forest", help="auto (the default: rdkit2d, whose blend measured best "
                 "for classification and regression) | none | ecfp4 | rdkit2d | both: "
                 "after training, fit a random forest on these features of the same training "
                 "molecules, keep it in --save-dir and serve the two blended (the model and the "
                 "forest alone are reported beside)."),
]  # fmt: skip
ForestTrees = Annotated[int | None, typer.Option("--forest-trees", help="Trees of --forest (500).")]
Ensemble = Annotated[
    str | None,
    typer.Option("--ensemble", help="none (the default) | wide: fine-tune the model alone and "
                 "with RDKit 2D beside its head, fit forests on RDKit 2D, on both and on ECFP4, "
                 "keep the five in one folder a seed and serve them blended by validation "
                 "quantiles, each member's score and their spread beside (about twice the "
                 "fine-tuning's cost; --forest does not apply)."),
]  # fmt: skip
ForestBlend = Annotated[
    str | None,
    typer.Option("--forest-blend", help="quantile (default: each score's quantile among the "
                 "validation molecules' scores, then averaged) | mean (the scores averaged)."),
]  # fmt: skip
ForestWeight = Annotated[
    float | None,
    typer.Option("--forest-weight", help="The model's weight in the blend, 0 to 1 (0.5)."),
]
ClassWeight = Annotated[
    str | None,
    typer.Option("--class-weight", help="none | balanced: weigh each task's two classes in "
                 "the loss inversely to their frequency on the training molecules "
                 "(classification only). Default: the set's config, balanced for MUV and "
                 "ToxCast, none elsewhere."),
]  # fmt: skip
Resume = Annotated[
    bool,
    typer.Option("--resume", help="Keep the runs already in --out: a finished (set, seed) is "
                 "read back, a stopped one goes on from its last epoch."),
]  # fmt: skip
Processes = Annotated[
    int,
    typer.Option("--processes", min=1, help="Spread each run over N processes (data "
                 "parallel, one core each on a CPU); 1 (default) keeps the one-process results."),
]  # fmt: skip
Precision = Annotated[
    str,
    typer.Option(
        "--precision",
        "--amp",
        help="auto (bf16 autocast on CUDA and bf16-native CPUs) | fp32 | bf16 (--amp off = fp32).",
    ),
]


ConfigFile = Annotated[
    Path | None,
    typer.Option("--config", help="TOML of flat config keys (such as hpopt's best.toml) on top "
                 "of the task's Table 8 row; the options given here still win."),
]  # fmt: skip


def _config(task, no_canonicalize: bool = False, config: Path | None = None, ctx=None, **overrides):
    from smiexlm.moleculenet.configs import finetune_config

    canonicalize = False if no_canonicalize else None
    overrides = given(ctx, overrides)
    return finetune_config(task, config_file=config, canonicalize=canonicalize, **overrides)


def finetune(
    ctx: typer.Context,
    task: TaskArg,
    checkpoint: Checkpoint = None,
    random_init: RandomInit = False,
    seeds: Seeds = None,
    preset: Preset = "tiny",
    objective: Objective = "mlm",
    split: Split = "scaffold",
    epochs: Epochs = None,
    max_train_steps: MaxSteps = None,
    batch_size: BatchSize = None,
    lr: Lr = None,
    no_canonicalize: NoCanon = False,
    device: Device = "auto",
    freeze: Freeze = False,
    freeze_layers: FreezeLayers = 0,
    layers: HeadLayers = None,
    pooling: HeadPooling = None,
    features: Features = None,
    patience: Patience = None,
    ema_half_life: EmaHalfLife = None,
    head_epochs: HeadEpochs = None,
    head_lr: HeadLr = None,
    layer_decay: LayerDecay = None,
    class_weight: ClassWeight = None,
    precision: Precision = "auto",
    data: DataCsv = None,
    smiles_col: SmilesCol = "smiles",
    label_cols: LabelCols = None,
    task_type: TaskTypeOpt = None,
    valid_from_train: ValidFromTrain = 0.1,
    save_dir: SaveDir = None,
    overwrite: Overwrite = False,
    out: Out = Path("runs/finetune"),
    resume: Resume = False,
    processes: Processes = 1,
    augment: Augment = None,
    tta: Tta = None,
    adapt_steps: AdaptSteps = None,
    adapt_lr: AdaptLr = None,
    forest: Forest = None,
    forest_trees: ForestTrees = None,
    forest_blend: ForestBlend = None,
    forest_weight: ForestWeight = None,
    ensemble: Ensemble = None,
    config: ConfigFile = None,
) -> None:
    """Fine-tune the shipped model (or --checkpoint) on one dataset with the paper's per-task
    config (or --config on top of it); test ROC-AUC per seed. Each (set, seed) keeps its state
    in --out after every epoch: a stopped run goes on with --resume."""
    from smiexlm.moleculenet.backbone import Backbone
    from smiexlm.moleculenet.finetune import run_finetune

    _check_outputs(out, save_dir)
    if _spread(processes, ensemble):
        return
    cfg = _config(None if data else task, no_canonicalize, config, ctx, split=split, epochs=epochs,
                  max_train_steps=max_train_steps, batch_size=batch_size, lr=lr, device=device,
                  freeze=freeze, freeze_layers=freeze_layers, layers=layers, pooling=pooling,
                  features=features, patience=patience, ema_half_life=ema_half_life,
                  head_epochs=head_epochs, head_lr=head_lr, layer_decay=layer_decay,
                  class_weight=class_weight, precision=precision, augment=augment, tta=tta, adapt_steps=adapt_steps,
                  adapt_lr=adapt_lr, forest=forest, forest_trees=forest_trees,
                  forest_blend=forest_blend, forest_weight=forest_weight,
                  ensemble=ensemble)  # fmt: skip
    seeds = _seeds(seeds)
    (loaded,) = _load_tasks([task], data, smiles_col, label_cols, task_type, split,
                            valid_from_train)  # fmt: skip
    backbone = Backbone(checkpoint, preset, objective, random_init)
    results = run_finetune(loaded, cfg, backbone, seeds, save_dir, overwrite=overwrite,
                           run_root=out / "runs", resume=resume)  # fmt: skip
    _print_report(results, out, f"Fine-tuning {loaded.name}")


def benchmark(
    ctx: typer.Context,
    tasks: Tasks = None,
    checkpoint: Checkpoint = None,
    random_init: RandomInit = False,
    seeds: Seeds = None,
    preset: Preset = "tiny",
    objective: Objective = "mlm",
    split: Split = "scaffold",
    epochs: Epochs = None,
    max_train_steps: MaxSteps = None,
    device: Device = "auto",
    with_baseline: WithBaseline = False,
    out: Out = Path("runs/benchmark"),
    resume: Resume = False,
    processes: Processes = 1,
    layers: HeadLayers = None,
    forest: Forest = None,
    forest_trees: ForestTrees = None,
    forest_blend: ForestBlend = None,
    forest_weight: ForestWeight = None,
    ensemble: Ensemble = None,
    config: ConfigFile = None,
) -> None:
    """Fine-tune on several datasets x seeds and write one report next to the paper's numbers
    (--config: one file on top of every task's row). Each (set, seed) keeps its state in --out:
    a stopped benchmark goes on with --resume."""
    from smiexlm.moleculenet import runs
    from smiexlm.moleculenet.backbone import Backbone
    from smiexlm.moleculenet.baseline import BaselineConfig, run_baseline
    from smiexlm.moleculenet.finetune import run_finetune
    from smiexlm.moleculenet.report import write_report

    _check_outputs(out)
    if _spread(processes, ensemble):
        return
    backbone, results = Backbone(checkpoint, preset, objective, random_init), []
    seeds = _seeds(seeds)
    for loaded in _load_tasks(tasks, None, "smiles", None, None, split):
        cfg = _config(loaded.name, config=config, ctx=ctx, split=split, epochs=epochs,
                      max_train_steps=max_train_steps, device=device, layers=layers, forest=forest,
                      forest_trees=forest_trees, forest_blend=forest_blend,
                      forest_weight=forest_weight, ensemble=ensemble)  # fmt: skip
        results += run_finetune(loaded, cfg, backbone, seeds, run_root=out / "runs", resume=resume)
        if with_baseline:
            results += run_baseline(loaded, seeds, BaselineConfig(split=split))
        if runs.is_main():
            write_report(results, out, f"MoleculeNet benchmark: {backbone.name}")
    _print_report(results, out, f"MoleculeNet benchmark: {backbone.name}")


def probe(
    task: TaskArg,
    checkpoint: Checkpoint = None,
    seeds: Seeds = None,
    split: Split = "scaffold",
    features: Features = None,
    device: Device = "auto",
    data: DataCsv = None,
    smiles_col: SmilesCol = "smiles",
    label_cols: LabelCols = None,
    task_type: TaskTypeOpt = None,
    valid_from_train: ValidFromTrain = 0.1,
    out: Out = Path("runs/probe"),
    whiten: Annotated[
        bool | None,
        typer.Option(
            "--whiten/--no-whiten",
            help="Apply the model folder's corpus whitening first (default: as its "
            "embedding.json says, where it stores a whitening of the chosen pooling and blocks).",
            show_default=False,
        ),
    ] = None,
    pooling: Pooling = None,
    tta: Annotated[
        int,
        typer.Option(
            "--tta",
            min=0,
            help="Each embedding the mean over the canonical and K "
            "random SMILES of the molecule (default 0).",
        ),
    ] = 0,
    layers: Annotated[
        int | None,
        typer.Option(
            "--layers",
            min=1,
            help="Pool the outputs of the last N blocks and put them side by side (default: "
            "the model's own, embedding.json).",
            show_default=False,
        ),
    ] = None,
    save_dir: Annotated[
        Path | None,
        typer.Option(
            "--save-dir",
            help="Keep the fitted probe as a folder predict serves "
            "(DIR/seed<k>: one per distinct fit, so one for a deterministic split). A "
            "seed folder that exists already is refused unless --overwrite.",
        ),
    ] = None,
    overwrite: Overwrite = False,
) -> None:
    """Linear probe: logistic/ridge regression on the frozen model's pooled embeddings
    (regularisation chosen on valid). Seconds, next to minutes for fine-tuning."""
    from smiexlm.moleculenet.backbone import Backbone
    from smiexlm.moleculenet.probe import ProbeConfig, run_probe

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


def register(app: typer.Typer) -> None:
    lists = multi_value("--seeds", "--tasks", "--label-cols")
    app.command(cls=lists)(finetune)
    app.command(cls=lists)(probe)
    app.command(cls=lists)(benchmark)
    app.command(cls=lists)(baseline)
