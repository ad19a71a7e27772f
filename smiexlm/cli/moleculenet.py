"""MoleculeNet commands: finetune, benchmark, baseline, probe (predict: :mod:`smiexlm.cli.predict`).

Heavy imports (torch, RDKit, pandas) happen inside the command bodies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from smiexlm.cli.options import multi_value

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
    float | None,
    typer.Option("--valid-from-train", help="With --split column:NAME whose column holds no "
                 "valid rows: this share of its train rows, by scaffold (seed 0), is the "
                 "validation part; 0 refuses such a column instead. [default: 0.1]"),
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
    from smiexlm.errors import check_distinct
    from smiexlm.moleculenet.registry import PAPER_TASKS, get_spec

    tasks = tasks or ["all"]
    names = [t.strip().lower() for t in tasks if t.strip()]
    if names == ["all"]:
        return list(PAPER_TASKS)
    sets = [get_spec(name).name for name in names]  # every name checked before any set is read
    check_distinct("--tasks", sets, "set")  # lipo and lipophilicity are one set
    return names


def _load_tasks(
    tasks: list[str] | None, data: Path | None, smiles_col: str, label_cols,
    task_type: str | None, split: str = "scaffold", valid_from_train: float | None = None,
):  # fmt: skip
    """The MoleculeTasks to run: the user's table (``--data``, with its own split column for
    ``--split column:NAME``) or the MoleculeNet sets named."""
    from smiexlm.errors import ConfigError
    from smiexlm.moleculenet import load_task, read_task
    from smiexlm.moleculenet.splits import VALID_FROM_TRAIN, check_split_kind, split_column

    column = split_column(check_split_kind(split, "--split"))
    if valid_from_train is not None and (data is None or column is None):  # never ignored
        raise ConfigError("--valid-from-train", valid_from_train, "it only with --data and "
                          "--split column:NAME (a validation part carved from the train rows of "
                          "your table's own split)")  # fmt: skip
    if valid_from_train is None:
        valid_from_train = VALID_FROM_TRAIN
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

    from smiexlm.training.distributed import relaunch

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
    from smiexlm.training.ranks import detect

    if not detect().is_main:
        return
    paths = write_report(results, out, title, command="smiexlm " + " ".join(sys.argv[1:]))
    typer.echo(f"split: {describe_splits(results)}")
    typer.echo(markdown_table(results))
    if more := more_markdown(results):
        typer.echo("\nbeside the score (test):\n" + more)
    typer.echo(f"wrote {', '.join(str(p) for p in paths.values())}")


Checkpoint = Annotated[
    Path | None,
    typer.Option("--checkpoint", help="Pretrained folder (config.json, vocab.json, "
                 "model.safetensors), or a shipped model's name (exlm, mlm, ...). Default: the shipped "
                 "default model."),
]  # fmt: skip
RandomInit = Annotated[
    bool, typer.Option("--random-init", help="Train a random init of --preset (tiny) with "
                       "--objective (mlm) instead of a pretrained model.")
]  # fmt: skip
Preset = Annotated[str, typer.Option(help="Preset for --random-init.", hidden=True)]
Objective = Annotated[
    str, typer.Option(help="Objective of the random init (mlm, exlm, maelm).", hidden=True)
]
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
ConfigFile = Annotated[
    Path | None,
    typer.Option("--config", help="TOML of flat settings (such as hpopt's best.toml, or what "
                 "`smiexlm settings finetune TASK` prints) on top of the task's Table 8 row."),
]  # fmt: skip

#: the settings ``finetune`` and ``benchmark`` list in their help (the rest: ``--set``)
FINETUNE_SHOWN = ("split", "epochs", "lr", "device")
BENCHMARK_SHOWN = ("split", "epochs", "max_train_steps", "device")


def _config(task: str | None, config: Path | None, settings: dict[str, Any]):
    """The task's Table 8 row, then ``--config``, then the settings given."""
    from smiexlm.finetuning.config import finetune_config

    return finetune_config(task, config_file=config, **settings)


def finetune(
    task: TaskArg,
    checkpoint: Checkpoint = None,
    random_init: RandomInit = False,
    preset: Preset = "tiny",
    objective: Objective = "mlm",
    seeds: Seeds = None,
    data: DataCsv = None,
    smiles_col: SmilesCol = "smiles",
    label_cols: LabelCols = None,
    task_type: TaskTypeOpt = None,
    valid_from_train: ValidFromTrain = None,
    save_dir: SaveDir = None,
    overwrite: Overwrite = False,
    out: Out = Path("runs/finetune"),
    resume: Resume = False,
    processes: Processes = 1,
    config: ConfigFile = None,
    settings: dict[str, Any] | None = None,
) -> None:
    """Fine-tune the shipped model (or --checkpoint) on one dataset with the paper's per-task
    config (or --config and --set on top of it); test ROC-AUC per seed. Each (set, seed) keeps
    its state in --out after every epoch: a stopped run goes on with --resume."""
    from smiexlm.finetuning.adapter import run_finetune
    from smiexlm.finetuning.backbone import Backbone

    _check_outputs(out, save_dir)
    cfg = _config(None if data else task, config, settings or {})
    if _spread(processes, cfg.ensemble):
        return
    seeds = _seeds(seeds)
    (loaded,) = _load_tasks([task], data, smiles_col, label_cols, task_type, cfg.split,
                            valid_from_train)  # fmt: skip
    backbone = Backbone(checkpoint, preset, objective, random_init)
    results = run_finetune(loaded, cfg, backbone, seeds, save_dir, overwrite=overwrite,
                           run_root=out / "runs", resume=resume)  # fmt: skip
    _print_report(results, out, f"Fine-tuning {loaded.name}")


#: where ``benchmark --with-baseline`` keeps the forests' (set, seed) runs, beside ``runs/``
BASELINE_RUNS = "baseline_runs"


def benchmark(
    tasks: Tasks = None,
    checkpoint: Checkpoint = None,
    random_init: RandomInit = False,
    preset: Preset = "tiny",
    objective: Objective = "mlm",
    seeds: Seeds = None,
    with_baseline: WithBaseline = False,
    out: Out = Path("runs/benchmark"),
    resume: Resume = False,
    processes: Processes = 1,
    config: ConfigFile = None,
    settings: dict[str, Any] | None = None,
) -> None:
    """Fine-tune on several datasets x seeds and write one report next to the paper's numbers
    (--config and --set: on top of every task's row). Each (set, seed) keeps its state in
    --out: a stopped benchmark goes on with --resume."""
    from smiexlm.finetuning.adapter import run_finetune
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.forests.baseline import BaselineConfig, run_baseline
    from smiexlm.moleculenet import runs
    from smiexlm.moleculenet.report import write_report

    _check_outputs(out)
    settings = settings or {}
    split = _config(None, config, settings).split  # checked before any set is read
    if _spread(processes, _config(None, config, settings).ensemble):
        return
    backbone, results = Backbone(checkpoint, preset, objective, random_init), []
    seeds = _seeds(seeds)
    for loaded in _load_tasks(tasks, None, "smiles", None, None, split):
        cfg = _config(loaded.name, config, settings)
        results += run_finetune(loaded, cfg, backbone, seeds, run_root=out / "runs", resume=resume)
        if with_baseline:
            kept = out / BASELINE_RUNS if runs.is_main() else None  # one writer of its cells
            results += run_baseline(loaded, seeds, BaselineConfig(split=split), run_root=kept,
                                    resume=resume)  # fmt: skip
        if runs.is_main():
            write_report(results, out, f"MoleculeNet benchmark: {backbone.name}")
    _print_report(results, out, f"MoleculeNet benchmark: {backbone.name}")


def register(app: typer.Typer) -> None:
    from smiexlm.cli.settings import with_settings
    from smiexlm.finetuning import (
        config as configs,  # looked up now, so a test may give it a new field
    )

    lists = multi_value("--seeds", "--tasks", "--label-cols")
    specs = configs.FinetuneConfig.settings()
    app.command("finetune", cls=lists)(with_settings(finetune, specs, FINETUNE_SHOWN, "finetune"))
    app.command("benchmark", cls=lists)(with_settings(benchmark, specs, BENCHMARK_SHOWN,
                                                      "finetune"))  # fmt: skip
