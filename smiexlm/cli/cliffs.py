"""``smiexlm cliffs``: the activity cliffs of a table, for a chemist to look at
(:mod:`smiexlm.moleculenet.cliffs`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def cliffs(
    table: Annotated[Path, typer.Argument(help="A table (CSV/TSV/Parquet) of SMILES and values.")],
    label_col: Annotated[
        str,
        typer.Option(
            "--label-col", help="The column of values (a pKi, a pIC50, ... in log units)."
        ),
    ],  # fmt: skip
    out: Annotated[Path, typer.Option("--out", help="CSV of the pairs, largest gap first.")],
    smiles_col: Annotated[str, typer.Option("--smiles-col", help="SMILES column.")] = "smiles",
    similarity: Annotated[
        float, typer.Option(help="Least similarity by ECFP4, generic scaffold or SMILES edit.")
    ] = 0.9,  # fmt: skip
    gap: Annotated[
        float,
        typer.Option(
            help="Least difference of the values (1: tenfold in a "
            "log unit; another for other units)."
        ),
    ] = 1.0,  # fmt: skip
) -> None:
    """List the pairs of near-identical molecules whose values differ by more than --gap
    (activity cliffs): their rows, SMILES, values and similarities."""
    import pandas as pd

    from smiexlm.atomic import atomic_path
    from smiexlm.data.readers import read_table
    from smiexlm.errors import DataError
    from smiexlm.moleculenet.cliffs import cliff_pairs

    frame = read_table(table, smiles_col, "TABLE", infer_types=True)
    if label_col not in frame.columns:
        raise DataError(f"--label-col {label_col!r} is not a column of {str(table)!r}: "
                        f"expected one of its columns {list(map(str, frame.columns))[:20]!r}")  # fmt: skip
    values = pd.to_numeric(frame[label_col], errors="coerce").to_numpy(dtype=float)
    pairs = cliff_pairs(frame[smiles_col].astype(str).tolist(), values, similarity, gap)
    with atomic_path(out) as tmp:
        pairs.to_csv(tmp, index=False)
    molecules = len(set(pairs["i"]) | set(pairs["j"]))
    typer.echo(f"{len(pairs):,} cliff pairs among {len(frame):,} molecules ({molecules:,} "
               f"molecules in at least one) -> {out}")  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("cliffs")(cliffs)
