"""``smiexlm preprocess``: raw SMILES files -> a sharded token dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from smiexlm.cli.params import Canonicalize, Progress

Inputs = Annotated[
    list[Path], typer.Argument(help="SMILES files: .smi/.txt/.csv/.tsv (.gz), .parquet, LMDB.")
]
DatasetOut = Annotated[Path, typer.Option("--out", help="Output dataset folder.")]
Workers = Annotated[int, typer.Option(help="Worker processes (output is identical for any N).")]
Resume = Annotated[bool, typer.Option("--resume", help="Finish an interrupted run in --out.")]
ValidInput = Annotated[
    list[Path] | None,
    typer.Option(
        "--valid-input", help="File whose molecules all go to the valid split (repeatable)."
    ),
]
ValidFraction = Annotated[
    float, typer.Option(help="Fraction of the other inputs sent to valid, by hash.")
]
TableSmilesCol = Annotated[
    str | None, typer.Option(help="SMILES column of CSV/TSV/Parquet (default: guess 'smiles').")
]
Vocab = Annotated[Path | None, typer.Option(help="Vocabulary JSON (default: the shipped one).")]
MaxHeavyAtoms = Annotated[int | None, typer.Option(help="Reject molecules with more heavy atoms.")]
MaxLength = Annotated[
    int, typer.Option(help="Reject molecules with more tokens (BOS/EOS included).")
]
MaxTokens = Annotated[
    int | None, typer.Option("--max-tokens", hidden=True)
]  # --max-length's old name
StripSalts = Annotated[bool, typer.Option("--strip-salts", help="Keep only the largest fragment.")]
StripStereo = Annotated[
    bool,
    typer.Option("--strip-stereo", help="Drop tetrahedral and double-bond stereo (isotopes kept)."),
]
ShardSize = Annotated[
    int | None,
    typer.Option(
        help="About this many molecules per shard: a shard closes at the end of the chunk of "
        "4,096 input rows that fills it; progress is committed a shard at a time (default "
        "1000000, 50000 with --descriptors)."
    ),
]
Descriptors = Annotated[
    str | None,
    typer.Option(
        help="Descriptor targets per molecule, stored beside the tokens: rdkit2d (every "
        "RDKit 2D descriptor, about 7 ms of a core per MOSES molecule, more for larger ones) "
        "or mordred (Mordred's 1,613 2D descriptors, about 100 ms a molecule; "
        "pip install 'smiexlm[mordred]')."
    ),
]

MaxUnknown = Annotated[
    float | None,
    typer.Option(help="Refuse, before writing anything, a --vocab that leaves more than this "
                 "share of the tokens of the inputs' first 5,000 molecules unknown ([UNK]; "
                 "default 0.01)."),
]  # fmt: skip


def preprocess(
    inputs: Inputs,
    out: DatasetOut,
    workers: Workers = 1,
    canonicalize: Canonicalize = True,
    resume: Resume = False,
    valid_input: ValidInput = None,
    valid_fraction: ValidFraction = 0.01,
    smiles_col: TableSmilesCol = None,
    vocab: Vocab = None,
    max_heavy_atoms: MaxHeavyAtoms = None,
    max_length: MaxLength = 512,
    max_tokens: MaxTokens = None,
    strip_salts: StripSalts = False,
    strip_stereo: StripStereo = False,
    shard_size: ShardSize = None,
    descriptors: Descriptors = None,
    max_unknown: MaxUnknown = None,
    progress: Progress = True,
) -> None:
    """Normalise, deduplicate, tokenize and shard SMILES into DIR (manifest.json, rejects.csv)."""
    from smiexlm.data.pipeline import PreprocessConfig
    from smiexlm.data.pipeline import preprocess as run

    config = PreprocessConfig(
        canonicalize=canonicalize, strip_salts=strip_salts, strip_stereo=strip_stereo,
        max_heavy_atoms=max_heavy_atoms,
        max_length=max_length if max_tokens is None else max_tokens,
        valid_fraction=valid_fraction, smiles_col=smiles_col, shard_size=shard_size,
        descriptors=descriptors,
    )  # fmt: skip
    result = run(inputs, out, config, valid_inputs=valid_input or (), vocab=vocab,
                 workers=workers, resume=resume, progress=progress,
                 **({} if max_unknown is None else {"max_unknown": max_unknown}))  # fmt: skip
    typer.echo(result.summary())


def register(app: typer.Typer) -> None:
    app.command("preprocess")(preprocess)
