"""``smiexlm pretrain`` and ``smiexlm plot-run``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("pretrain")(pretrain)
    app.command("plot-run")(plot_run)
    app.command("export")(export)


Overrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="Config overrides as key=value, e.g. lr=3e-4 model.k=4", show_default=False
    ),
]
ConfigName = Annotated[
    str | None,
    typer.Option(
        help="Config file (TOML/YAML) or a shipped config name, e.g. mol_tiny_exlm. "
        "Required (unless --list-configs).",
        show_default=False,
    ),
]
DatasetDir = Annotated[
    Path | None,
    typer.Option(
        help="Dataset folder built by `smiexlm preprocess`. Required (unless --list-configs).",
        show_default=False,
    ),
]
RunOut = Annotated[
    Path | None,
    typer.Option(
        help="Run folder: metrics.jsonl, checkpoints/. Required (unless --list-configs).",
        show_default=False,
    ),
]
MaxSteps = Annotated[int | None, typer.Option(help="Stop after this many updates")]
Resume = Annotated[bool, typer.Option(help="Continue from the newest checkpoint in --out")]
SkipBadCheckpoints = Annotated[
    bool,
    typer.Option(
        help="With --resume: a truncated or corrupted newest checkpoint is "
        "skipped for the newest good one (default: stop and name it)"
    ),
]
Nproc = Annotated[
    int | None,
    typer.Option(
        help="Processes for a CPU run (DDP over gloo). Each accumulates update_freq / N "
        "micro-batches, so the global batch stays the config's. Default: the largest "
        "divisor of update_freq that fits in the free cores. Several GPUs: use torchrun.",
        show_default=False,
    ),
]
ListConfigs = Annotated[bool, typer.Option(help="List the shipped configs and exit")]


def pretrain(
    overrides: Overrides = None,
    config: ConfigName = None,
    data: DatasetDir = None,
    out: RunOut = None,
    max_steps: MaxSteps = None,
    resume: Resume = False,
    skip_bad_checkpoints: SkipBadCheckpoints = False,
    nproc: Nproc = None,
    list_configs: ListConfigs = False,
) -> None:
    """Pre-train an MLM / ExLM / MAE-LM model (one CPU, GPUs, or torchrun DDP)."""
    from smiexlm.pretraining.config import describe_shipped_configs
    from smiexlm.pretraining.launch import PretrainJob

    if list_configs:
        return typer.echo("\n".join(describe_shipped_configs()))
    if config is None or data is None or out is None:
        raise typer.BadParameter("--config, --data and --out are required (or --list-configs)")
    job = PretrainJob(config, data, out, list(overrides or []), max_steps, resume,
                      skip_bad_checkpoints, nproc)  # fmt: skip
    _report(job.run(), out)


def _report(outcome, out: Path) -> None:
    """Record the command in the run folder when the job asks for it, echo its message, and
    exit with its code."""
    from smiexlm.pretraining.launch import record_command

    if outcome.record:
        record_command(out, ["smiexlm", *sys.argv[1:]])
    if outcome.message:
        typer.echo(outcome.message)
    if outcome.code:
        raise typer.Exit(code=outcome.code)


def plot_run(
    run_dirs: Annotated[
        list[Path],
        typer.Argument(
            help="Run folders holding metrics.jsonl (or the .jsonl files); several share one plot"
        ),
    ],
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="PNG path (default RUN_DIR/loss.png for one run)",
            show_default=False,
        ),
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", hidden=True)] = None,  # old name
) -> None:
    """Draw the training and validation loss curves of one run, or several side by side, to PNG."""
    from smiexlm.pretraining.plot import plot_run as draw

    typer.echo(str(draw(run_dirs, out if out is not None else output)))


def export(
    run_dir: Annotated[Path, typer.Argument(help="Run folder of `smiexlm pretrain`")],
    out: Annotated[Path, typer.Option(help="Model folder to write")],
    checkpoint: Annotated[str, typer.Option(help="Checkpoint name: last, best or step_N")] = "last",
    data: Annotated[
        Path | None,
        typer.Option(
            help="The run's dataset folder (for the card's data section and the "
            "tokens it trained, corpus_tokens.json)"
        ),
    ] = None,
    fp16: Annotated[bool, typer.Option(help="Store the weights in fp16")] = True,
    pooling: Annotated[
        str,
        typer.Option(
            help="The embedding's pooling when a caller names none: cls, mean, max, "
            "or several joined by + (cls+max)."
        ),
    ] = "cls",
    onnx: Annotated[
        bool, typer.Option(help="Also write encoder.onnx for onnxruntime (the onnx extra)")
    ] = False,
) -> None:
    """Package a run's checkpoint as a model folder with normalization.json and MODEL_CARD.md."""
    from smiexlm.pretraining.export import export_run

    if onnx:  # fail before the export, not after it
        from smiexlm.embedding.onnx_export import require_exporter

        require_exporter()
    commands = run_dir / "command.txt"
    command = commands.read_text().strip() if commands.is_file() else None
    typer.echo(str(export_run(run_dir, out, checkpoint, data, fp16, command, pooling)))
    if onnx:
        from smiexlm.embedding.onnx_export import export_onnx

        typer.echo(str(export_onnx(out, "encoder")))
