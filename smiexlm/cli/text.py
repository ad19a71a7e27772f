"""``smiexlm text vocab`` and ``smiexlm text blocks``: the text side of the corpus pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

text_app = typer.Typer(
    help="Text corpora: subword vocabularies and block datasets.", no_args_is_help=True
)


@text_app.command("vocab")
def vocab(
    inputs: Annotated[
        list[Path], typer.Argument(help=".txt/.txt.gz files, one paragraph per line.")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write the tokenizer JSON.")],
    vocab_size: Annotated[int, typer.Option(help="Vocabulary size, specials included.")] = 8000,
    min_freq: Annotated[int, typer.Option(help="Minimum pair/piece frequency.")] = 2,
    kind: Annotated[str, typer.Option(help="'bpe' (byte-level) or 'wordpiece'.")] = "bpe",
    gpt2_merges: Annotated[
        Path | None, typer.Option(help="Load a GPT-2/RoBERTa BPE: INPUTS is its vocab.json.")
    ] = None,
) -> None:
    """Train a text tokenizer (or load a GPT-2/RoBERTa BPE) and save it as JSON."""
    from smiexlm.text.blocks import read_lines
    from smiexlm.tokenizer.text import TextTokenizer

    if gpt2_merges is not None:
        tok = TextTokenizer.from_gpt2_files(inputs[0], gpt2_merges)
    else:
        lines = (line for path in inputs for line in read_lines(path))
        tok = TextTokenizer.build(lines, vocab_size=vocab_size, min_freq=min_freq, kind=kind)
    tok.save(out)
    typer.echo(
        f"{tok.kind} vocabulary of {tok.vocab_size} tokens (hash {tok.vocab_hash[:12]}) -> {out}"
    )


@text_app.command("blocks")
def blocks(
    train: Annotated[list[Path], typer.Option(help="Training text file (repeat for several).")],
    vocab: Annotated[Path, typer.Option(help="Tokenizer JSON from `smiexlm text vocab`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="New dataset folder.")],
    valid: Annotated[list[Path] | None, typer.Option(help="Validation text file(s).")] = None,
    tokens_per_sample: Annotated[int, typer.Option(help="Block length incl. BOS.")] = 128,
    frame: Annotated[str, typer.Option(help="'bos' (official) or 'bos_eos'.")] = "bos",
) -> None:
    """Cut text into fixed-length blocks (sample-break-mode none) in the shard format."""
    from smiexlm.text.blocks import build_text_dataset
    from smiexlm.tokenizer.text import TextTokenizer

    manifest = build_text_dataset(
        train, valid or [], out, TextTokenizer.load(vocab), tokens_per_sample, frame
    )
    s = manifest["splits"]
    typer.echo(
        f"train {s['train']['molecules']:,} blocks / {s['train']['tokens']:,} tokens, valid "
        f"{s['valid']['molecules']:,} / {s['valid']['tokens']:,} -> {out}"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(text_app, name="text")
