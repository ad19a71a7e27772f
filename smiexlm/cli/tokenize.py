"""``smiexlm tokenize``, ``smiexlm vocab build`` and ``smiexlm vocab corpus``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

vocab_app = typer.Typer(help="Build and inspect SMILES vocabularies.", no_args_is_help=True)


def tokenize(
    smiles: Annotated[list[str] | None, typer.Argument(help="SMILES strings to tokenize.")] = None,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            help="Read SMILES from this file: one per line (.smi/.txt) "
            "or a table's SMILES column (.csv/.tsv/.parquet), optionally .gz.",
        ),
    ] = None,
    ids: Annotated[bool, typer.Option("--ids", help="Print token ids (with BOS/EOS).")] = False,
    vocab: Annotated[
        Path | None, typer.Option(help="Vocabulary JSON (default: the shipped one).")
    ] = None,
) -> None:
    """Split SMILES into regex tokens (space-separated) or vocabulary ids, one line each; a
    blank line of --file gives a blank line, an empty SMILES argument is an error."""
    from smiexlm.data.readers import iter_smiles
    from smiexlm.errors import DataError, InvalidSmilesError
    from smiexlm.tokenizer import SmilesTokenizer
    from smiexlm.tokenizer.vocab import tokenized_lines

    for number, text in enumerate(smiles or [], 1):
        if not text.strip():
            raise DataError(f"SMILES argument {number} is {text!r}: expected a non-empty SMILES")
    tok = SmilesTokenizer.load(vocab) if vocab else SmilesTokenizer()
    items = list(smiles or []) + ([] if file is None else list(iter_smiles(file, what="--file")))
    if not items and file is not None:
        raise DataError(f"--file {str(file)!r} holds no SMILES: expected one per line, or a "
                        "table with a SMILES column")  # fmt: skip
    if not items:
        raise typer.BadParameter("give SMILES as arguments or with --file")
    lines = []  # all first: an invalid SMILES is one error line naming it, nothing printed
    for number, item in enumerate(items, 1):
        try:
            lines.extend(tokenized_lines(tok, [item], ids))
        except InvalidSmilesError as err:
            given = len(smiles or [])
            where = (f"SMILES argument {number}" if number <= given
                     else f"--file {str(file)!r} SMILES {number - given} (counting from 1)")  # fmt: skip
            raise DataError(f"{where}: {err}") from None
    typer.echo("\n".join(lines))
    if tok.n_unk:
        typer.echo(f"{tok.n_unk} token(s) mapped to [UNK]", err=True)


@vocab_app.command("build")
def vocab_build(
    inputs: Annotated[list[Path], typer.Argument(help=".smi/.txt/.csv/.tsv files, optionally .gz")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the vocabulary JSON.")],
    smiles_col: Annotated[
        str | None, typer.Option(help="SMILES column of CSV/TSV inputs (default: auto-detect).")
    ] = None,
    min_freq: Annotated[int, typer.Option(help="Keep tokens seen at least this often.")] = 1,
    max_size: Annotated[int | None, typer.Option(help="Cap on the vocabulary size.")] = None,
    with_canonical: Annotated[
        bool, typer.Option(help="Also count tokens of each molecule's RDKit canonical SMILES.")
    ] = False,
) -> None:
    """Build a vocabulary from a corpus and print its size and coverage."""
    from tqdm import tqdm

    from smiexlm.data.normalize import canonical_smiles
    from smiexlm.data.readers import iter_smiles
    from smiexlm.errors import DataError
    from smiexlm.paths import check_output
    from smiexlm.tokenizer.vocab import build_vocabulary

    check_output(out, "--out")  # before the corpus is read: a folder there, a missing parent
    corpus = (s for path in inputs
              for s in tqdm(iter_smiles(path, smiles_col), desc=path.name, unit=" mol"))  # fmt: skip
    try:
        tok, report = build_vocabulary(corpus, min_freq, max_size, canonical_smiles if with_canonical else None)  # fmt: skip
    except DataError as err:
        raise DataError(f"INPUTS {[str(p) for p in inputs]}: {err}") from None
    tok.save(out)
    typer.echo(report)
    typer.echo(f"wrote {out} ({tok.vocab_size} tokens, hash {tok.vocab_hash[:16]})")


@vocab_app.command("corpus")
def vocab_corpus(
    model: Annotated[
        str, typer.Argument(help="Model folder or shipped model name (default: the default model)")
    ] = "default",
    data: Annotated[
        Path | None,
        typer.Option(
            help="The preprocessed dataset the model was pretrained on: record its "
            "training split's token counts in the folder (corpus_tokens.json)"
        ),
    ] = None,
) -> None:
    """Which tokens of a model's vocabulary its weights were trained on, and which never
    occurred (their embeddings are untrained); with --data, record them first."""
    from smiexlm.errors import DataError
    from smiexlm.modelio.folder import ModelFolder
    from smiexlm.modelio.layout import is_shipped
    from smiexlm.modelio.records import write_corpus_tokens
    from smiexlm.pretraining.export import dataset_tokens
    from smiexlm.tokenizer.special import N_SPECIAL_TOKENS

    folder = ModelFolder(model)
    if data is not None:
        if is_shipped(folder.path):
            raise DataError(f"--data: model {model!r} is shipped with smiexlm, which is "
                            "read-only, and keeps its corpus_tokens.json: expected a folder "
                            "of your own")  # fmt: skip
        counts, source = dataset_tokens(folder.tokenizer, data)
        typer.echo(
            f"wrote {write_corpus_tokens(folder.path, folder.tokenizer.tokens, counts, source)}"
        )
    else:
        counts = folder.corpus_tokens
    if counts is None:
        raise DataError(f"model {model!r} keeps no corpus_tokens.json: give --data, the "
                        "preprocessed dataset it was pretrained on")  # fmt: skip
    names = folder.tokenizer.tokens
    ordinary = range(N_SPECIAL_TOKENS, len(names))  # special tokens are not chemistry
    seen = [i for i in ordinary if counts[i] > 0]
    never = [names[i] for i in ordinary if counts[i] == 0]
    typer.echo(f"{len(seen)} of {len(ordinary)} tokens occurred in what {model} was trained on; "
               f"the rarest: " + ", ".join(f"{names[i]} ({counts[i]:,})"
                                          for i in sorted(seen, key=lambda i: counts[i])[:5]))  # fmt: skip
    typer.echo(f"never trained ({len(never)}): {' '.join(never)}")


def register(app: typer.Typer) -> None:
    app.command("tokenize")(tokenize)
    app.add_typer(vocab_app, name="vocab")
