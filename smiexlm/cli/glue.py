"""``smiexlm glue TASK --checkpoint PATH`` and ``smiexlm glue all --checkpoint PATH``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from smiexlm.cli.options import multi_value
from smiexlm.cli.params import Device


def glue(
    task: Annotated[
        str, typer.Argument(help="CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI or 'all'.")
    ],
    checkpoint: Annotated[
        Path, typer.Option(help="Pre-trained folder (config.json, vocab.json, model.safetensors).")
    ],
    seeds: Annotated[
        list[int] | None,
        typer.Option(help="Seeds, one run each; the median is reported (default: 1 2 3 4 5)."),
    ] = None,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 2e-5,
    batch_size: Annotated[int, typer.Option(help="Examples per update.")] = 16,
    epochs: Annotated[int, typer.Option(help="Training epochs.")] = 10,
    warmup_ratio: Annotated[float, typer.Option(help="Warm-up share of the updates.")] = 0.06,
    max_length: Annotated[int, typer.Option(help="Tokens per example (pairs truncated).")] = 128,
    max_steps: Annotated[int | None, typer.Option(help="Cap on updates per seed.")] = None,
    max_train_rows: Annotated[int | None, typer.Option(help="Use the first N train rows.")] = None,
    max_eval_rows: Annotated[int | None, typer.Option(help="Score the first N dev rows.")] = None,
    grid: Annotated[bool, typer.Option(help="Search Table 11's grid (slow).")] = False,
    out: Annotated[Path | None, typer.Option(help="Folder for one JSON result per task.")] = None,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads.")] = None,
    device: Device = "auto",
) -> None:
    """Fine-tune a checkpoint on GLUE and print dev scores (median over seeds) next to the
    majority-class baseline. 'all' runs every task whose train and dev files are present."""
    from smiexlm.glue.finetune import run_tasks

    settings = dict(lr=lr, batch_size=batch_size, epochs=epochs, warmup_ratio=warmup_ratio,
                    seeds=tuple(seeds) if seeds else None, max_length=max_length,
                    max_steps=max_steps, max_train_rows=max_train_rows,
                    max_eval_rows=max_eval_rows, threads=threads, device=device)  # fmt: skip
    for name, result, skipped in run_tasks(task, checkpoint, settings, grid, out):
        if skipped:
            typer.echo(f"{name}: {skipped}", err=True)
        else:
            typer.echo(result.summary())


def register(app: typer.Typer) -> None:
    app.command("glue", cls=multi_value("--seeds"))(glue)
