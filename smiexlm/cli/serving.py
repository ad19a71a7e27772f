"""``smiexlm export-onnx``: a model folder's ONNX graph, for onnxruntime serving."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("export-onnx")(export_onnx)


def export_onnx(
    folder: Annotated[
        Path,
        typer.Argument(
            help="Model folder: from `smiexlm export`, a fine-tuned seed folder (an "
            "ensemble's: each of its networks) or a `finetune --save-dir` folder (each seed)"
        ),
    ],
    kind: Annotated[
        str | None,
        typer.Option(
            help="encoder (pooled features) or predictor (a fine-tuned model's logits); "
            "default: predictor for a fine-tuned folder, else encoder",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Write FOLDER/encoder.onnx (or predictor.onnx) and record its sha256 in onnx.json.

    Serve it with Featurizer.from_pretrained(FOLDER, backend="onnx") or
    `smiexlm predict --backend onnx`. Needs the onnx extra (onnx, onnxscript, onnxruntime)."""
    from smiexlm.embedding.onnx_export import export_onnx as write_graph
    from smiexlm.finetuning.ensemble import network_folders
    from smiexlm.finetuning.folder import seed_folders

    for seed in seed_folders(folder) or [folder]:  # a --save-dir folder: each seed's
        for each in network_folders(seed) or [seed]:  # an ensemble: each network member's
            typer.echo(str(write_graph(each, kind)))  # type: ignore[arg-type]
