"""Build a SMILES vocabulary from a corpus (``smiexlm vocab build``), and tokenize lines
(``smiexlm tokenize``).

The corpus comes as strings; reading files is the data layer's job
(:func:`smiexlm.data.readers.iter_smiles`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from smiexlm.errors import DataError, InvalidSmilesError
from smiexlm.tokenizer.smiles import SmilesTokenizer, check_vocabulary_size, split_smiles
from smiexlm.tokenizer.special import SPECIAL_TOKENS


def build_vocabulary(
    smiles: Iterable[str],
    min_freq: int = 1,
    max_size: int | None = None,
    canonical: Callable[[str], str | None] | None = None,
) -> tuple[SmilesTokenizer, str]:
    """Count tokens over ``smiles`` and return the tokenizer plus a readable report.

    Blank entries are skipped; SMILES that do not tokenize are counted and left out (never
    silently). With ``canonical`` (e.g. :func:`smiexlm.data.normalize.canonical_smiles`) the
    tokens of each molecule's canonical SMILES are counted too."""
    check_vocabulary_size(min_freq, max_size)  # before a corpus of hours is read
    counts: Counter[str] = Counter()
    n_in = n_bad = n_uncanonical = 0
    for s in smiles:
        if not s:
            continue
        n_in += 1
        try:
            counts.update(split_smiles(s))
        except InvalidSmilesError:
            n_bad += 1
            continue
        if canonical is not None:
            c = canonical(s)
            if c is None:
                n_uncanonical += 1
            elif c != s:
                counts.update(split_smiles(c))
    if not counts:
        raise DataError(
            f"no tokenizable SMILES among the {n_in:,} non-blank entries read"
            f"{f' ({n_bad:,} not tokenizable)' if n_bad else ''}: expected at least one "
            "molecule to build a vocabulary from"
        )
    tok = SmilesTokenizer.from_counts(counts, min_freq, max_size)
    kept = tok.tokens[len(SPECIAL_TOKENS) :]
    total = sum(counts.values())
    covered = sum(counts[t] for t in kept)
    report = (
        f"{n_in:,} SMILES read, {n_bad:,} not tokenizable (left out)"
        + (f", {n_uncanonical:,} rejected by RDKit" if canonical is not None else "")
        + f"\n{len(counts):,} distinct tokens, {tok.vocab_size:,} in the vocabulary "
        f"(incl. {len(SPECIAL_TOKENS)} special); token coverage {covered / max(total, 1):.4%}"
    )
    return tok, report


def tokenized_lines(tokenizer: SmilesTokenizer, smiles: Iterable[str], ids: bool = False) -> Iterator[str]:  # fmt: skip
    """One line per SMILES: its tokens (space-separated) or, with ``ids``, its vocabulary ids
    with BOS and EOS; a blank input gives a blank line, so lines stay aligned. The first
    SMILES that does not tokenize raises InvalidSmilesError."""
    for s in smiles:
        yield (
            ""
            if not s
            else " ".join(map(str, tokenizer.encode(s) if ids else tokenizer.tokenize(s)))
        )
