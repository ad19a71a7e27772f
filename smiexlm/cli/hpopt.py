"""``smiexlm hpopt``: hyper-parameter search for fine-tuning, on Optuna
(:mod:`smiexlm.hpopt.run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from smiexlm.cli.moleculenet import (
    Checkpoint,
    ConfigFile,
    DataCsv,
    LabelCols,
    SmilesCol,
    TaskArg,
    TaskTypeOpt,
    ValidFromTrain,
    _config,
    _load_tasks,
)
from smiexlm.cli.options import multi_value

SearchOut = Annotated[
    Path | None,
    typer.Option("--out", help="Folder of the study (study.sqlite) and of best.toml, "
                 "trials.csv, history.png, report.md (default: runs/hpopt/TASK); the same "
                 "command resumes it."),
]  # fmt: skip

#: the settings ``hpopt`` lists in its help: the search's budget and seed, and the base
#: config's (the rest of both: ``--set``)
SHOWN = (
    "trials",
    "cpu_minutes",
    "storage",
    "workers",
    "seed",
    "split",
    "max_train_steps",
    "precision",
    "device",
)


def hpopt(
    task: TaskArg,
    checkpoint: Checkpoint = None,
    data: DataCsv = None,
    smiles_col: SmilesCol = "smiles",
    label_cols: LabelCols = None,
    task_type: TaskTypeOpt = None,
    valid_from_train: ValidFromTrain = None,
    out: SearchOut = None,
    config: ConfigFile = None,
    settings: dict[str, Any] | None = None,
) -> None:
    """Search the fine-tuning config around the task's Table 8 row (learning rate, epochs,
    dropouts, pooling, hybrid features, frozen blocks) on the validation split, with pruning;
    the test split is never read. Writes OUT/best.toml for `finetune --config`; run again to
    resume (a trial cut short is marked failed and run anew)."""
    import sys

    import optuna

    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.config import read_config_file
    from smiexlm.hpopt.config import HpoptConfig
    from smiexlm.hpopt.run import run_hpopt
    from smiexlm.settings import settings_of

    search = {s.key for s in settings_of(HpoptConfig)}
    # the settings given win over --config's (what `smiexlm settings hpopt` prints)
    given = (read_config_file(config, tuple(search)) if config else {}) | (settings or {})
    hp = HpoptConfig(**{k: v for k, v in given.items() if k in search})  # checked first
    base = _config(None if data else task, None,
                   {k: v for k, v in given.items() if k not in search})  # fmt: skip
    (loaded,) = _load_tasks([task], data, smiles_col, label_cols, task_type, base.split,
                            valid_from_train)  # fmt: skip
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial is ours
    out = out if out is not None else Path("runs/hpopt") / task
    result = run_hpopt(loaded, base, out, hp, Backbone(checkpoint), progress=True,
                       on_trial=typer.echo, command=_recorded_command(sys.argv[1:]))  # fmt: skip
    _echo_result(result, task, data is not None)


def _recorded_command(argv: list[str]) -> str:
    """The command line as the report records it: a storage URL without its credentials."""
    from smiexlm.hpopt.storage import shown

    def clean(arg: str) -> str:
        head, sep, url = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        return head + sep + shown(url) if "://" in url else arg

    return " ".join(["smiexlm", *map(clean, argv)])


def _echo_result(result, task: str, own_data: bool) -> None:
    from smiexlm.hpopt.report import BEST_NAME, PARAMS

    typer.echo(f"stopped by --{result.stopped_by}: {result.counted} trials counted, "
               f"{result.failed} failed, {result.cpu_seconds / 60:.1f} CPU minutes")  # fmt: skip
    if result.best_config is None:
        typer.echo("no trial has completed yet")
        return
    values = {k: result.best_config.get(k) for k in PARAMS}
    chosen = ", ".join(f"{k} = {v:.3g}" if isinstance(v, float) else f"{k} = {v}" for k, v in values.items())  # fmt: skip
    typer.echo(f"best: trial {result.best_number}, validation {result.best_value:.4g}: {chosen}")
    best = result.out / BEST_NAME
    if not best.is_file():  # a shared study: the worker that ends its last trial writes it
        typer.echo(f"{best} is written by the worker that ends the study's last trial (run "
                   "the same command again once the study is over to write it here)")  # fmt: skip
        return
    same = " with the same --data options" if own_data else ""
    typer.echo(f"next: smiexlm finetune {task} --config {best}{same}")


def register(app: typer.Typer) -> None:
    from smiexlm.cli.settings import with_settings
    from smiexlm.finetuning import config as configs
    from smiexlm.hpopt.config import HpoptConfig
    from smiexlm.settings import settings_of

    specs = [*settings_of(HpoptConfig), *configs.FinetuneConfig.settings()]
    command = with_settings(hpopt, specs, SHOWN, "hpopt")
    app.command("hpopt", cls=multi_value("--label-cols"))(command)
