"""``smiexlm embed`` (a file of SMILES -> embeddings), ``smiexlm whiten`` (a model's corpus
whitening) and ``smiexlm demo``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from smiexlm.cli.params import (
    Canonicalize,
    Device,
    ModelFolder,
    PartRows,
    Pooling,
    RayAddress,
    SmilesCol,
    Threads,
    columns,
)

EmbedInput = Annotated[
    Path, typer.Argument(help="CSV/TSV/Parquet table or .smi file (optionally .gz).")
]
EmbedOut = Annotated[
    Path,
    typer.Option(
        "--out",
        "-o",
        help="Output file (.parquet or .npy), or a folder (a name without suffix) of "
        "resumable Parquet parts with a manifest.json: for large inputs and torchrun.",
    ),
]
IdCols = Annotated[
    str | None, typer.Option(help="Comma-separated columns to keep (default: all but SMILES).")
]
Errors = Annotated[str, typer.Option(help="nan: NaN rows for bad SMILES; raise: stop.")]
Backend = Annotated[
    str, typer.Option(help="torch, or onnx: the folder's encoder.onnx with onnxruntime.")
]
Whiten = Annotated[
    bool | None,
    typer.Option(
        "--whiten/--no-whiten",
        help="Apply the model's corpus whitening (default: as its embedding.json says).",
    ),
]
Int8 = Annotated[
    bool,
    typer.Option(help="Linear layers in int8 on the CPU: faster, still the same for a molecule "
                 "in any batch, close to (not equal to) the fp32 embedding."),
]  # fmt: skip
EmbedLayers = Annotated[
    int | None,
    typer.Option(
        "--layers",
        min=1,
        help="Pool the last N blocks side by side (default: as its embedding.json says).",
        show_default=False,
    ),
]


def embed(
    input: EmbedInput,
    out: EmbedOut,
    smiles_col: SmilesCol = "smiles",
    id_cols: IdCols = None,
    checkpoint: ModelFolder = None,
    pooling: Pooling = None,
    errors: Errors = "nan",
    canonicalize: Canonicalize = True,
    device: Device = "auto",
    backend: Backend = "torch",
    part_rows: PartRows = None,
    threads: Threads = None,
    whiten: Whiten = None,
    layers: EmbedLayers = None,
    int8: Int8 = False,
    ray: RayAddress = None,
) -> None:
    """Embed every SMILES of INPUT; .npy output puts the id columns in <out>.ids.csv. A folder
    --out is written part by part and resumed by the same command; run it under `torchrun
    --nproc_per_node N` to share the parts among N processes, or give --ray to run it on a
    Ray cluster."""
    from smiexlm.embedding.embed import embed_file, embed_parts
    from smiexlm.parts.job import DEFAULT_PART_ROWS, wants_parts
    from smiexlm.training.workers import detect

    cols = columns(id_cols)
    how = dict(checkpoint=checkpoint, pooling=pooling, errors=errors, canonicalize=canonicalize,
               device=device, backend=backend, whiten=whiten, layers=layers, int8=int8)  # fmt: skip
    parts = wants_parts(out, part_rows)  # refuses --part-rows 0 (None: the default)
    rows = DEFAULT_PART_ROWS if part_rows is None else part_rows
    if ray is not None:
        from smiexlm.embedding.on_ray import embed_parts_on_ray

        ray_needs_parts(parts, out)
        return echo_parts(embed_parts_on_ray(input, out, ray, smiles_col, cols, part_rows=rows,
                                             **how))  # fmt: skip
    if parts:
        return echo_parts(embed_parts(input, out, smiles_col, cols, threads=threads,
                                      part_rows=rows, **how))  # fmt: skip
    if threads is not None:
        detect(threads)
    echo_embedded(embed_file(input, out, smiles_col, cols, **how))


def ray_needs_parts(parts: bool, out: Path) -> None:
    """--ray writes a folder of parts: a DataError for a file --out."""
    from smiexlm.errors import DataError

    if not parts:
        raise DataError(f"--out {str(out)!r} is a file name, but --ray writes a folder of "
                        "parts: expected a folder name (no suffix)")  # fmt: skip


def echo_embedded(result) -> None:
    """The report of a one-file embedding, its first bad rows on stderr."""
    from smiexlm.errors import shorten

    typer.echo(f"{result.report.summary()}")
    for index, smiles, reason in result.report.failed:
        typer.echo(f"  row {index}: {shorten(smiles)!r} ({reason})", err=True)
    if result.report.n_failed > len(result.report.failed):
        more = result.report.n_failed - len(result.report.failed)
        typer.echo(f"  ... and {more:,} more (NaN rows)", err=True)
    if result.report.n_failed:
        typer.echo(f"  every bad row, with its reason: {result.rejects_path}", err=True)
    extra = f" (+ ids in {result.ids_path})" if result.ids_path else ""
    typer.echo(f"wrote {result.out}: {result.n_rows} x {result.dim}{extra}")


def echo_parts(result, shown: int = 10) -> None:
    """The summary of a folder of parts and its first ``shown`` rejects (rank 0 only)."""
    import csv

    from smiexlm.data.readers import allow_long_fields
    from smiexlm.errors import shorten
    from smiexlm.parts.job import REJECTS
    from smiexlm.training.ranks import detect

    if not detect().is_main:
        return
    allow_long_fields()
    for reason in result.parts_damaged.values():
        typer.echo(f"  {reason}: written again", err=True)
    with open(result.out / REJECTS, encoding="utf-8", newline="") as handle:
        for n, row in enumerate(csv.DictReader(handle)):
            if n == shown:
                typer.echo(f"  ... and {result.n_failed - shown:,} more (NaN rows)", err=True)
                break
            typer.echo(
                f"  row {row['row']}: {shorten(row['smiles'])!r} ({row['reason']})", err=True
            )
    typer.echo(result.summary())


def demo(
    checkpoint: ModelFolder = None,
    device: Device = "auto",
) -> None:
    """Embed 21 well-known drugs and show each one's nearest neighbour."""
    from smiexlm.cli.demo import format_demo, run_demo

    typer.echo(format_demo(run_demo(checkpoint, device)))


def whiten(
    model: Annotated[
        Path,
        typer.Argument(
            help="Model folder (written by `smiexlm export`), or a shipped model's name "
            "(default, exlm, ...; read-only: pass --out)."
        ),
    ],
    corpus: Annotated[
        Path, typer.Option(help="SMILES to fit on: .smi (optionally .gz) or a table.")
    ],
    rows: Annotated[int, typer.Option(help="Corpus molecules to fit on (the first N).")] = 20_000,
    default: Annotated[
        bool,
        typer.Option(
            "--default/--no-default",
            help="Make whitened embeddings the folder's default (embedding.json).",
        ),
    ] = True,
    device: Device = "auto",
    pooling: Annotated[
        str | None,
        typer.Option(
            help="Also fit this combined pooling jointly (such as cls+mean+max) and, "
            "with --default, serve it by default."
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Write a full copy of MODEL with the new whitening to this new (or empty) "
            "folder and leave MODEL untouched. Required for a shipped model.",
            show_default=False,
        ),
    ] = None,
    layers: Annotated[
        int | None,
        typer.Option(
            "--layers",
            min=1,
            help="Also fit the pooling of the last N blocks side by side, jointly, and, with "
            "--default, serve those N blocks (default: the folder's own, embedding.json).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Fit the whitening of MODEL's embeddings (each pooling) on a corpus and store it in the
    folder, or in a copy of it with --out (whitening.safetensors): cosine neighbours in the
    corpus's own units."""
    from smiexlm.embedding.whitening_fit import whiten_model

    record = whiten_model(model, corpus, rows, default, device=device, pooling=pooling, out=out,
                          layers=layers)  # fmt: skip
    blocks = f", last {record['layers']} blocks" if record["layers"] > 1 else ""
    typer.echo(
        f"{record['folder']}: whitening fitted on {record['rows']:,} molecules of "
        f"{record['corpus']}; directions kept {record['rank']}; "
        f"{'the default' if default else 'not the default'} for its embeddings"
        + (f" ({record['pooling']} pooling{blocks})" if default else "")
    )


def register(app: typer.Typer) -> None:
    app.command("embed")(embed)
    app.command("whiten")(whiten)
    app.command("demo")(demo)
