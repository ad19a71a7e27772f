"""SMILES to model rows: the one input path of the package.

:class:`ModelInputs` turns the SMILES a user gives into what an encoder reads, in the same
steps for the featurizer, fine-tuning, the linear probe and ``predict``:

1. text checks (missing, not a string, empty, whitespace inside, too long for RDKit);
2. the model's corpus normalisation (:func:`~smiexlm.data.normalize.normalize_smiles`, the
   preprocessing code path: RDKit canonical SMILES and salt stripping as the model folder's
   ``normalization.json`` says);
3. tokenization into BOS ... EOS rows;
4. the length rule: a row longer than the model's positions is rejected, or, when the caller
   gives ``max_length``, cut to it keeping EOS (fine-tuning's rule) and counted.

A row may still hold tokens the weights never trained: the vocabulary is wider than most
corpora (the shipped one holds charged atoms, stereo marks and 40-odd elements; MOSES holds
none of those). :meth:`ModelInputs.unseen` names them per row, from the folder's
``corpus_tokens.json``, so that callers can say so.

Nothing is dropped silently: every input keeps its row or the reason it has none. Rows are
padded into batches by :func:`smiexlm.data.collate` (one padder for the whole package); the
ExLM expansion of BOS and EOS is :meth:`ExLMConfig.encoder_length`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from smiexlm.data.normalize import (
    MAX_SMILES_CHARS,
    NormalizeConfig,
    normalize_smiles,
    smiles_problem,
    text_problem,
)
from smiexlm.errors import InvalidSmilesError
from smiexlm.tokenizer.special import N_SPECIAL_TOKENS

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from smiexlm.model.config import ExLMConfig
    from smiexlm.tokenizer import Tokenizer

# Inputs longer than this many characters per model position are rejected before RDKit or
# the tokenizer sees them: twice the longest token of the shipped vocabulary ("[SbH6+3]"),
# so such an input could never fit the model's positions anyway.
CHARS_PER_POSITION = 16


@dataclass
class Prepared:
    """Per input: the SMILES the model reads (None when rejected), its row of ids (BOS ...
    EOS, None when rejected) and the reason of each rejection (None where it worked)."""

    texts: list[str | None]
    reasons: list[str | None]
    rows: list[list[int] | None] = field(default_factory=list)
    n_changed: int = 0  # inputs rewritten by normalisation
    cut: list[int] = field(default_factory=list)  # indices of the rows cut to max_length

    @property
    def n_cut(self) -> int:
        return len(self.cut)

    @property
    def good(self) -> list[int]:
        """Indices of the inputs that have a row."""
        return [i for i, reason in enumerate(self.reasons) if reason is None]

    def first_failure(self) -> tuple[int, str] | None:
        return next(((i, r) for i, r in enumerate(self.reasons) if r is not None), None)

    def require_all(self, smiles: Sequence[Any]) -> Prepared:
        """Itself when every input worked, else InvalidSmilesError naming the first failure
        (for callers whose table was validated when it was read)."""
        failure = self.first_failure()
        if failure is not None:
            i, reason = failure
            raise InvalidSmilesError(str(smiles[i]), None, f"input index {i}: {reason}")
        return self


def normalize_inputs(
    smiles: Sequence[Any],
    normalization: NormalizeConfig,
    canonicalize: bool = True,
    max_chars: int = MAX_SMILES_CHARS,
) -> Prepared:
    """Steps 1 and 2: checked and normalised SMILES (no rows yet)."""
    checked = [check_text(s, max_chars) for s in smiles]
    texts = [text for text, _ in checked]
    reasons = [reason for _, reason in checked]
    changed = 0
    if canonicalize and normalization.rewrites:
        from rdkit import rdBase

        with rdBase.BlockLogs():  # RDKit's parse errors become reasons, not stderr noise
            for i, text in enumerate(texts):
                if text is None:
                    continue
                new = normalize_smiles(text, normalization)[0]
                if new is None:
                    texts[i], reasons[i] = None, "RDKit cannot parse it"
                else:
                    changed += new != text
                    texts[i] = new
    return Prepared(texts, reasons, [None] * len(texts), changed)


def model_texts(
    smiles: Sequence[Any], normalization: NormalizeConfig, canonicalize: bool = True
) -> list[str]:
    """What a model reads, for SMILES already validated where their table was read: each
    normalised as the model's corpus was (as written when not ``canonicalize``); a failure
    raises, naming the input."""
    prepared = normalize_inputs(smiles, normalization, canonicalize)
    return prepared.require_all(smiles).texts  # type: ignore[return-value]


@dataclass
class UnseenTokens:
    """Of ``molecules`` rows, how many hold tokens absent from what the weights were trained on
    (``holding``), and for each such token the number of rows holding it (``tokens``)."""

    molecules: int = 0
    holding: int = 0
    tokens: Counter = field(default_factory=Counter)

    def add(self, unseen: Sequence[Sequence[str]]) -> UnseenTokens:
        """Itself, with the rows of :meth:`ModelInputs.unseen` counted in."""
        self.molecules += len(unseen)
        self.holding += sum(1 for tokens in unseen if tokens)
        self.tokens.update(token for tokens in unseen for token in tokens)
        return self

    def merge(self, other: UnseenTokens) -> UnseenTokens:
        self.molecules += other.molecules
        self.holding += other.holding
        self.tokens.update(other.tokens)
        return self

    def describe(self, shown: int = 5) -> str:
        """``"3 of 10 molecules hold tokens absent from ...: [C@@H] (2), [NH+] (1)"``."""
        listed = ", ".join(f"{token} ({n:,})" for token, n in self.tokens.most_common(shown))
        more = f" and {len(self.tokens) - shown} more" if len(self.tokens) > shown else ""
        return (f"{self.holding:,} of {self.molecules:,} molecules hold tokens absent from what "
                f"the weights were trained on (the model never read them): {listed}{more}")  # fmt: skip


class ModelInputs:
    """SMILES to rows for one model: its tokenizer, normalisation and positions."""

    def __init__(
        self, tokenizer: Tokenizer, config: ExLMConfig, normalization: NormalizeConfig,
        corpus_counts: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        """``corpus_counts``: (V,) how often each token id occurred in what the weights were
        trained on (:func:`~smiexlm.modelio.records.read_corpus_tokens`), or None when unknown."""
        self.tokenizer = tokenizer
        self.config = config
        self.normalization = normalization
        self.corpus_counts = corpus_counts

    @property
    def max_chars(self) -> int:
        """Longest SMILES (characters) accepted; longer ones fail before any parsing."""
        return min(MAX_SMILES_CHARS, CHARS_PER_POSITION * self.config.max_positions)

    def prepare(
        self, smiles: Sequence[Any], canonicalize: bool = True, max_length: int | None = None
    ) -> Prepared:
        """Every step: ``canonicalize=False`` reads the SMILES as written; ``max_length``
        cuts longer rows (keeping EOS) instead of rejecting rows over the model's positions."""
        prepared = normalize_inputs(smiles, self.normalization, canonicalize, self.max_chars)
        return self.encode(prepared, max_length)

    def encode(self, prepared: Prepared, max_length: int | None = None) -> Prepared:
        """Steps 3 and 4 on normalised SMILES, in place."""
        texts, reasons = prepared.texts, prepared.reasons
        good = [i for i, t in enumerate(texts) if t is not None]
        rows: list[list[int] | None] = [None] * len(texts)
        try:
            for i, row in zip(good, self.tokenizer.encode_many([texts[i] for i in good]), strict=True):  # fmt: skip
                rows[i] = row
        except InvalidSmilesError:  # rare: find the culprits one by one
            for i in good:
                try:
                    rows[i] = self.tokenizer.encode(texts[i])
                except InvalidSmilesError as err:
                    reasons[i] = f"untokenizable: {err.reason}"
        limit = self.config.max_positions
        for i, row in enumerate(rows):
            if row is None:
                continue
            if max_length is not None and len(row) > max_length:
                rows[i] = [*row[: max_length - 1], row[-1]]
                prepared.cut.append(i)
            elif max_length is None and len(row) > limit:
                rows[i], reasons[i] = None, f"{len(row)} tokens exceed the model's {limit}"
        prepared.rows = rows
        return prepared

    def texts(self, smiles: Sequence[Any], canonicalize: bool = True) -> list[str]:
        """:func:`model_texts` with this model's normalisation."""
        return model_texts(smiles, self.normalization, canonicalize)

    def rows(self, texts: Sequence[str], max_length: int | None = None) -> tuple[list[list[int]], list[int]]:  # fmt: skip
        """Rows of SMILES already normalised (:meth:`texts`), and the indices of those cut to
        ``max_length``; an untokenizable one raises, naming it."""
        prepared = self.encode(Prepared(list(texts), [None] * len(texts)), max_length)
        return prepared.require_all(texts).rows, prepared.cut  # type: ignore[return-value]

    def unknown(self, rows: Sequence[Sequence[int]]) -> tuple[int, int]:
        """([UNK] tokens, rows holding at least one) among ``rows``: what the model's vocabulary
        lacks, counted so that it is never silent."""
        counts = [list(row).count(self.tokenizer.unk_id) for row in rows]
        return sum(counts), sum(c > 0 for c in counts)

    def unseen(self, rows: Sequence[Sequence[int]]) -> list[list[str]] | None:
        """Per row, the tokens absent from what the weights were trained on, each once in order
        of first appearance (their embeddings are untrained); None when the folder keeps no
        ``corpus_tokens.json``. Special tokens ([UNK] included, counted by :meth:`unknown`)
        are never listed."""
        if self.corpus_counts is None:
            return None
        missing, names = self.corpus_counts == 0, self.tokenizer.tokens
        return [list(dict.fromkeys(names[i] for i in row if i >= N_SPECIAL_TOKENS and missing[i]))
                for row in rows]  # fmt: skip

    def encoder_lengths(self, rows: Sequence[Sequence[int]]) -> list[int]:
        """Positions each row takes in the encoder (for token-budget batching)."""
        return [self.config.encoder_length(len(row)) for row in rows]


def check_text(value: Any, max_chars: int = MAX_SMILES_CHARS) -> tuple[str | None, str | None]:
    """``(stripped SMILES, None)``, or ``(None, reason)`` for a value no parser should see."""
    if not isinstance(value, str):
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return None, "missing value"
        return None, f"expected str, got {type(value).__name__}"
    text = value.strip()
    if not text:
        return None, "empty string"
    if reason := text_problem(text, max_chars):  # too long, or not encodable
        return None, reason
    if any(c.isspace() for c in text):
        return None, "whitespace inside the SMILES"
    return text, None


def readable_smiles(value: Any) -> tuple[str | None, str | None]:
    """``(stripped SMILES, None)`` when RDKit reads ``value``, else ``(None, reason)``: the
    reasons of :func:`check_text`, then RDKit's (the rule of every batch that serves SMILES
    one by one and gives the others a reason)."""
    text, reason = check_text(value)
    if reason is None:
        reason = smiles_problem(text)
    return (None, reason) if reason is not None else (text, None)
