"""``smiexlm widen``: a SMILES corpus -> the same corpus plus widened products."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

_STEPS = "brics,protonate,salts,tautomers,stereo,elements"


def widen(
    input: Annotated[
        Path, typer.Argument(help="SMILES file: .smi/.txt/.csv/.tsv (.gz), .parquet.")
    ],
    out: Annotated[Path, typer.Argument(help="Output .smi.gz (rejects and report beside it).")],
    steps: Annotated[
        str, typer.Option(help=f"Comma-separated steps, in order: {_STEPS}.")
    ] = _STEPS,
    per_molecule: Annotated[
        int, typer.Option(help="Products each step tries to make per input molecule.")
    ] = 1,
    fraction: Annotated[
        float, typer.Option(help="Share of the input molecules each step runs on (seeded).")
    ] = 1.0,
    max_molecules: Annotated[
        int | None, typer.Option(help="Read only the first N input rows.")
    ] = None,
    seed: Annotated[
        int, typer.Option(help="Seed: the same seed and --part-size give the same output.")
    ] = 0,
    smiles_col: Annotated[
        str | None, typer.Option(help="SMILES column of CSV/TSV/Parquet (default: guess).")
    ] = None,
    part_size: Annotated[
        int,
        typer.Option(
            help="Input rows per resumable part, each the BRICS "
            "step's fragment pool: keep it to resume or to reproduce."
        ),
    ] = 5000,
    progress: Annotated[bool, typer.Option("--progress/--no-progress")] = True,
) -> None:
    """Add larger, charged, salted, tautomeric, stereo and element-substituted variants of
    each molecule (never a MoleculeNet molecule); an interrupted run resumes."""
    from smiexlm.data.widen.chem import vocabulary_tokens
    from smiexlm.data.widen.exclusion import exclusion_keys
    from smiexlm.data.widen.run import check_arguments
    from smiexlm.data.widen.run import widen as run
    from smiexlm.data.widen.steps import WidenConfig
    from smiexlm.moleculenet.loaders import evaluation_sets

    config = WidenConfig(steps=tuple(s.strip() for s in steps.split(",") if s.strip()),
                         per_molecule=per_molecule, seed=seed, fraction=fraction)  # fmt: skip
    check_arguments(input, out, part_size, max_molecules)  # before the keys, minutes long
    report = run(input, out, config, exclusion_keys(evaluation_sets(), progress), vocabulary_tokens(),
                 smiles_col, max_molecules, part_size, progress)  # fmt: skip
    typer.echo(f"{report['inputs']:,} rows in, {report['rejected_inputs']:,} rejected, "
               f"{report['originals_written']:,} originals + {report['products_written']:,} "
               f"products written to {out} in {report['seconds']:.0f} s")  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("widen")(widen)
