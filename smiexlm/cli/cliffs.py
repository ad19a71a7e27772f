"""``smiexlm cliffs``: the activity cliffs of a table, for a chemist to look at
(:mod:`smiexlm.moleculenet.cliffs`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Measures = Annotated[
    str,
    typer.Option(
        help="The similarities that make a pair, comma-separated: ecfp4, scaffold (ECFP4 of the "
        "generic Murcko scaffolds: every one-ring molecule is the same core), smiles (edit "
        "similarity)."
    ),
]


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
        float, typer.Option(help="Least similarity by one of --measures.")
    ] = 0.9,  # fmt: skip
    gap: Annotated[
        float,
        typer.Option(
            help="The values of a cliff differ by more than this (1: tenfold in a log "
            "unit; 1.36 for kcal/mol at 25 °C; another for other units)."
        ),
    ] = 1.0,  # fmt: skip
    measures: Measures = "ecfp4,scaffold,smiles",
) -> None:
    """List the pairs of near-identical molecules whose values differ by more than --gap
    (activity cliffs): their rows, SMILES, values and similarities. Rows without a parsable
    SMILES or a finite value take part in no pair and are listed with the reason in
    OUT.rejects.csv."""
    from smiexlm.atomic import atomic_paths
    from smiexlm.data.readers import write_table
    from smiexlm.moleculenet.cliffs import cliff_pairs
    from smiexlm.paths import check_output, rejects_beside, write_rejects

    out = check_output(out, "--out")
    listed = check_output(rejects_beside(out), "--out rejects file")
    smiles, values, rejects = _table(table, smiles_col, label_col)
    pairs = cliff_pairs(smiles, values, similarity, gap, measures.split(","))
    with atomic_paths(out, listed) as (tmp, tmp_listed):
        write_table(pairs, tmp)
        write_rejects(rejects, tmp_listed)
    molecules = len(set(pairs["i"]) | set(pairs["j"]))
    typer.echo(f"{len(pairs):,} cliff pairs among {len(smiles):,} molecules ({molecules:,} "
               f"molecules in at least one) -> {out}"
               + (f"; {len(rejects):,} rows in no pair -> {listed}" if rejects else ""))  # fmt: skip


def _table(table: Path, smiles_col: str, label_col: str) -> tuple[list[str], list[float], list]:
    """The table's SMILES, values (NaN where a row takes part in no pair) and rejected rows;
    DataError for a missing column or a table none of whose rows can take part."""
    from smiexlm.data.normalize import text_cells
    from smiexlm.data.readers import read_table
    from smiexlm.errors import DataError

    frame = read_table(table, smiles_col, "TABLE")  # a Parquet file's missing cells: None
    if label_col not in frame.columns:
        raise DataError(f"--label-col {label_col!r} is not a column of {str(table)!r}: "
                        f"expected one of its columns {list(map(str, frame.columns))[:20]!r}")  # fmt: skip
    smiles = text_cells(frame[smiles_col]).str.strip().tolist()
    values, rejects = _values(smiles, text_cells(frame[label_col]).str.strip().tolist(), label_col)
    if len(rejects) == len(frame):
        first = "; ".join(f"row {r}: {why}" for r, _, why in rejects[:3])
        raise DataError(f"{str(table)!r}: none of its {len(frame):,} rows has a parsable SMILES "
                        f"and a finite {label_col!r} ({first}); expected a column of numbers")  # fmt: skip
    return smiles, values, rejects


def _values(smiles: list[str], cells: list[str], label_col: str) -> tuple[list[float], list]:
    """Each row's value (NaN where it takes part in no pair) and the rejected rows as
    (row, SMILES, reason)."""
    import math

    from smiexlm.chemistry.fingerprints import _parse
    from smiexlm.data.normalize import text_problem

    values, rejects = [], []
    for row, (text, cell) in enumerate(zip(smiles, cells, strict=True)):
        try:
            value = float(cell)
        except ValueError:
            value = math.nan
        if not text:
            reason = "no SMILES"
        elif problem := text_problem(text):  # RDKit would read a shortened molecule
            reason = problem
        elif _parse(text) is None:
            reason = "RDKit cannot parse the SMILES"
        elif cell.lower() in ("", "nan", "none", "null", "na", "n/a"):
            reason = f"no value in {label_col!r}"
        elif not math.isfinite(value):
            reason = f"{label_col!r} = {cell!r}: expected a finite number"
        else:
            reason = None
        values.append(math.nan if reason else value)
        if reason:
            rejects.append((row, text, reason))
    return values, rejects


def register(app: typer.Typer) -> None:
    app.command("cliffs")(cliffs)
