"""``smiexlm preprocess``: raw SMILES files -> a sharded token dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def preprocess(
    inputs: Annotated[
        list[Path], typer.Argument(help="SMILES files: .smi/.txt/.csv/.tsv (.gz), .parquet, LMDB.")
    ],
    out: Annotated[Path, typer.Option("--out", help="Output dataset folder.")],
    workers: Annotated[
        int, typer.Option(help="Worker processes (output is identical for any N).")
    ] = 1,
    canonicalize: Annotated[
        bool,
        typer.Option(
            "--canonicalize/--no-canonicalize", help="RDKit canonical SMILES, stereo kept."
        ),
    ] = True,
    resume: Annotated[
        bool, typer.Option("--resume", help="Finish an interrupted run in --out.")
    ] = False,
    valid_input: Annotated[
        list[Path] | None,
        typer.Option(
            "--valid-input", help="File whose molecules all go to the valid split (repeatable)."
        ),
    ] = None,
    valid_fraction: Annotated[
        float, typer.Option(help="Fraction of the other inputs sent to valid, by hash.")
    ] = 0.01,
    smiles_col: Annotated[
        str | None, typer.Option(help="SMILES column of CSV/TSV/Parquet (default: guess 'smiles').")
    ] = None,
    vocab: Annotated[
        Path | None, typer.Option(help="Vocabulary JSON (default: the shipped one).")
    ] = None,
    max_heavy_atoms: Annotated[
        int | None, typer.Option(help="Reject molecules with more heavy atoms.")
    ] = None,
    max_length: Annotated[
        int, typer.Option(help="Reject molecules with more tokens (BOS/EOS included).")
    ] = 512,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens", hidden=True)] = None,  # old name
    strip_salts: Annotated[
        bool, typer.Option("--strip-salts", help="Keep only the largest fragment.")
    ] = False,
    shard_size: Annotated[int, typer.Option(help="Molecules per shard.")] = 1_000_000,
    descriptors: Annotated[
        str | None,
        typer.Option(
            help="Descriptor targets per molecule, stored beside the tokens: rdkit2d (every "
            "RDKit 2D descriptor, about 5-10 ms per molecule and core)."
        ),
    ] = None,
    progress: Annotated[
        bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")
    ] = True,
) -> None:
    """Normalise, deduplicate, tokenize and shard SMILES into DIR (manifest.json, rejects.csv)."""
    from smiexlm.data.pipeline import PreprocessConfig
    from smiexlm.data.pipeline import preprocess as run

    config = PreprocessConfig(
        canonicalize=canonicalize, strip_salts=strip_salts, max_heavy_atoms=max_heavy_atoms,
        max_length=max_length if max_tokens is None else max_tokens,
        valid_fraction=valid_fraction, smiles_col=smiles_col, shard_size=shard_size,
        descriptors=descriptors,
    )  # fmt: skip
    result = run(inputs, out, config, valid_inputs=valid_input or (), vocab=vocab,
                 workers=workers, resume=resume, progress=progress)  # fmt: skip
    typer.echo(result.summary())


def register(app: typer.Typer) -> None:
    app.command("preprocess")(preprocess)
