"""``smiexlm embed`` (a file of SMILES -> embeddings) and ``smiexlm demo``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Checkpoint = Annotated[
    Path | None,
    typer.Option(
        "--checkpoint", "-c", help="Model folder (default: the model shipped inside smiexlm)."
    ),
]


def embed(
    input: Annotated[
        Path, typer.Argument(help="CSV/TSV/Parquet table or .smi file (optionally .gz).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output file: .parquet or .npy.")],
    smiles_col: Annotated[str, typer.Option(help="Column holding the SMILES.")] = "smiles",
    id_cols: Annotated[
        str | None, typer.Option(help="Comma-separated columns to keep (default: all but SMILES).")
    ] = None,
    checkpoint: Checkpoint = None,
    pooling: Annotated[str, typer.Option(help="cls, mean or max.")] = "cls",
    errors: Annotated[str, typer.Option(help="nan: NaN rows for bad SMILES; raise: stop.")] = "nan",
    canonicalize: Annotated[
        bool,
        typer.Option(
            "--canonicalize/--no-canonicalize",
            help="Canonicalize each SMILES with RDKit first (--no-canonicalize: as written).",
        ),
    ] = True,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
) -> None:
    """Embed every SMILES of INPUT; .npy output puts the id columns in <out>.ids.csv."""
    from smiexlm.embed import embed_file
    from smiexlm.errors import shorten

    cols = [c.strip() for c in id_cols.split(",") if c.strip()] if id_cols is not None else None
    result = embed_file(input, out, smiles_col, cols, checkpoint, pooling, errors,  # type: ignore[arg-type]
                        canonicalize, device=device)  # fmt: skip
    report = result.report
    typer.echo(f"{report.summary()}")
    for index, smiles, reason in report.failed:
        typer.echo(f"  row {index}: {shorten(smiles)!r} ({reason})", err=True)
    if report.n_failed > len(report.failed):
        typer.echo(f"  ... and {report.n_failed - len(report.failed):,} more (NaN rows)", err=True)
    extra = f" (+ ids in {result.ids_path})" if result.ids_path else ""
    typer.echo(f"wrote {result.out}: {result.n_rows} x {result.dim}{extra}")


def demo(
    checkpoint: Checkpoint = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
) -> None:
    """Embed 21 well-known drugs and show each one's nearest neighbour."""
    from smiexlm.embed import format_demo, run_demo

    typer.echo(format_demo(run_demo(checkpoint, device)))


def register(app: typer.Typer) -> None:
    app.command("embed")(embed)
    app.command("demo")(demo)
