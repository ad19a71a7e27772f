"""The SMILES tokenizer: the regular expression of Schwaller et al. (2018) and a saved vocabulary.

Special tokens have the fixed ids of :mod:`smiexlm.tokenizer.special`.

Nothing is dropped silently. ``re.findall`` skips characters that the pattern does not
match; here a SMILES whose tokens do not join back to the input raises
:class:`~smiexlm.errors.InvalidSmilesError` with the character position. A token that the
pattern accepts but the vocabulary lacks becomes ``[UNK]`` and is counted. A token spelled
like a special token (``[MASK]`` written inside a SMILES) is treated as unknown, never as
the special token itself.

Batches go through a vectorised encoder (:mod:`smiexlm.tokenizer.fast`) that splits a whole
chunk of SMILES with numpy and hands every row it does not fully understand to the exact
Python path, so both paths give identical ids or the same error.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np

from smiexlm.atomic import write_text_atomic
from smiexlm.errors import ConfigError, DataError, InvalidSmilesError
from smiexlm.paths import ASSETS_DIR, VOCAB_NAME, read_json_file
from smiexlm.tokenizer.fast import ChunkEncoder, EncodedChunk
from smiexlm.tokenizer.padding import pad_flat
from smiexlm.tokenizer.special import BOS_ID, EOS_ID, MASK_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID

if TYPE_CHECKING:  # pragma: no cover
    import torch

#: The tokenizing pattern of Schwaller et al. (2018), as DeepChem's BasicSmilesTokenizer uses it.
SMILES_REGEX = (
    r"(\[[^\]]+]|Br?|Cl?|N|O|S|P|F|I|b|c|n|o|s|p|\(|\)|\.|=|#|-|\+|\\|\/|:|~|@|\?|>>?|\*|\$"
    r"|\%[0-9]{2}|[0-9])"
)
_PATTERN = re.compile(SMILES_REGEX)

VOCAB_FORMAT = "smiexlm-vocab/1"
_CHUNK = 2048  # SMILES per call of the vectorised encoder
DEFAULT_VOCAB_PATH = ASSETS_DIR / VOCAB_NAME

Truncation = Literal["error", "truncate"]


def split_smiles(smiles: str) -> list[str]:
    """Split one SMILES into regex tokens; raise if any character would be lost."""
    tokens = _PATTERN.findall(smiles)
    if sum(map(len, tokens)) != len(smiles):
        position = 0
        for match in _PATTERN.finditer(smiles):
            if match.start() != position:
                break
            position = match.end()
        raise InvalidSmilesError(
            smiles, position, "character not matched by the SMILES token pattern"
        )
    return tokens


def vocabulary_hash(tokens: Sequence[str]) -> str:
    """sha256 of the token list (order matters: it fixes the ids)."""
    payload = json.dumps({"format": VOCAB_FORMAT, "regex": SMILES_REGEX, "tokens": list(tokens)})
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


@dataclass
class BatchEncoding:
    """A padded batch. ``input_ids`` (B, T) long, PAD = 0; ``attention_mask`` (B, T) bool,
    True = real token (BOS and EOS included)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    n_truncated: int = 0
    n_unk: int = 0

    @property
    def lengths(self) -> torch.Tensor:
        return self.attention_mask.sum(dim=1)


class SmilesTokenizer:
    """Regex SMILES tokenizer with a fixed vocabulary.

    ``SmilesTokenizer()`` loads the vocabulary shipped with the package;
    ``SmilesTokenizer.build(smiles)`` makes one from a corpus; ``save``/``load`` use JSON.
    The counters ``n_unk`` and ``n_truncated`` accumulate over the tokenizer's lifetime.
    """

    pad_id, bos_id, eos_id, mask_id, unk_id = PAD_ID, BOS_ID, EOS_ID, MASK_ID, UNK_ID
    special_tokens = tuple(SPECIAL_TOKENS)

    def __init__(self, tokens: Sequence[str] | None = None, counts: dict[str, int] | None = None):
        if tokens is None:
            other = SmilesTokenizer.load(DEFAULT_VOCAB_PATH)
            tokens, counts = other.tokens, other.counts
        tokens = list(tokens)
        if tokens[: len(SPECIAL_TOKENS)] != SPECIAL_TOKENS:
            raise DataError(
                f"vocabulary tokens start with {tokens[:5]!r}: expected the special tokens "
                f"{SPECIAL_TOKENS} at ids 0-4"
            )
        if len(set(tokens)) != len(tokens):
            dupes = [t for t, c in Counter(tokens).items() if c > 1]
            raise DataError(f"vocabulary has repeated tokens {dupes[:5]!r}: expected unique tokens")
        if len(tokens) > 65535:
            raise DataError(f"vocabulary size {len(tokens)}: expected at most 65,535 (uint16 ids)")
        self.tokens = tokens
        self.counts = dict(counts or {})
        self.vocab = {tok: i for i, tok in enumerate(tokens)}
        # Lookup table for text: special tokens spelled inside a SMILES are unknown.
        self._lookup = {tok: i for tok, i in self.vocab.items() if i >= len(SPECIAL_TOKENS)}
        self.vocab_hash = vocabulary_hash(tokens)
        self.n_unk = 0
        self.n_truncated = 0
        self._chunk_encoder = None

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def build(
        cls, smiles: Iterable[str], min_freq: int = 1, max_size: int | None = None
    ) -> SmilesTokenizer:
        """A vocabulary of every token seen at least ``min_freq`` times, most frequent first
        (ties broken alphabetically), capped at ``max_size`` tokens including the specials.
        Invalid SMILES (unmatched characters) raise, naming the input."""
        counts: Counter[str] = Counter()
        for s in smiles:
            counts.update(split_smiles(s))
        return cls.from_counts(counts, min_freq, max_size)

    @classmethod
    def from_counts(
        cls, counts: Counter[str], min_freq: int = 1, max_size: int | None = None
    ) -> SmilesTokenizer:
        """The vocabulary that ``build`` makes, from token counts already gathered."""
        check_vocabulary_size(min_freq, max_size)
        counts = Counter({t: c for t, c in counts.items() if t not in SPECIAL_TOKENS})
        kept = sorted(
            (t for t, c in counts.items() if c >= min_freq), key=lambda t: (-counts[t], t)
        )
        if max_size is not None:
            kept = kept[: max_size - len(SPECIAL_TOKENS)]
        return cls(SPECIAL_TOKENS + kept, {t: counts[t] for t in kept})

    def coverage(self, smiles: Iterable[str]) -> float:
        """Fraction of tokens in ``smiles`` that the vocabulary knows."""
        total = known = 0
        for s in smiles:
            for tok in split_smiles(s):
                total += 1
                known += tok in self._lookup
        return known / total if total else 1.0

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "format": VOCAB_FORMAT,
            "regex": SMILES_REGEX,
            "hash": self.vocab_hash,
            "special_tokens": {tok: i for i, tok in enumerate(SPECIAL_TOKENS)},
            "tokens": self.tokens,
            "counts": self.counts,
        }
        write_text_atomic(path, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> SmilesTokenizer:
        path, doc = read_json_file(path, "vocabulary file", VOCAB_FORMAT)
        tok = cls(doc["tokens"], doc.get("counts"))
        if doc.get("hash") not in (None, tok.vocab_hash):
            raise DataError(
                f"vocabulary file {str(path)!r} records hash {doc['hash']!r} but its tokens hash "
                f"to {tok.vocab_hash!r}: the file was edited or corrupted"
            )
        return tok

    # ------------------------------------------------------------------ one SMILES
    def tokenize(self, smiles: str) -> list[str]:
        """Regex tokens of ``smiles``; raises InvalidSmilesError rather than drop a character."""
        if not isinstance(smiles, str):
            raise InvalidSmilesError(
                repr(smiles), None, f"expected str, got {type(smiles).__name__}"
            )
        return split_smiles(smiles)

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        ids = [self._lookup.get(t, UNK_ID) for t in tokens]
        self.n_unk += ids.count(UNK_ID)
        return ids

    def encode(
        self,
        smiles: str,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: Truncation = "error",
    ) -> list[int]:
        """Token ids of one SMILES, ``[BOS] ... [EOS]`` by default.

        ``max_length`` counts BOS and EOS. Over-long input raises with ``truncation="error"``,
        or keeps the first tokens (and EOS) with ``truncation="truncate"``, counted in
        ``n_truncated``."""
        ids = self.convert_tokens_to_ids(self.tokenize(smiles))
        if add_special_tokens:
            ids = [BOS_ID, *ids, EOS_ID]
        if max_length is not None and len(ids) > max_length:
            ids = self._truncate(smiles, ids, max_length, truncation, add_special_tokens)
        return ids

    def _truncate(
        self, smiles: str, ids: list[int], max_length: int, truncation: str, specials: bool
    ) -> list[int]:
        if truncation == "error":
            raise InvalidSmilesError(
                smiles,
                None,
                f"{len(ids)} tokens exceed max_length={max_length} (truncation='error')",
            )
        if truncation != "truncate":
            raise DataError(f"truncation={truncation!r}: expected 'error' or 'truncate'")
        self.n_truncated += 1
        return [*ids[: max_length - 1], EOS_ID] if specials else ids[:max_length]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """The SMILES spelled by ``ids``; special tokens are dropped unless asked for."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.tokens):
                raise DataError(f"token id {i}: expected 0 <= id < {len(self.tokens)}")
            if i < len(SPECIAL_TOKENS) and skip_special_tokens:
                continue
            out.append(self.tokens[i])
        return "".join(out)

    # ------------------------------------------------------------------ batches
    def _encode_flat(self, smiles: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Ids of many SMILES, concatenated: (sum of lengths,) uint16 and (n,) int64 lengths.

        Runs the vectorised encoder of :mod:`smiexlm.tokenizer.fast`, which hands every row it
        does not fully understand to :meth:`encode`; the first bad row raises, with its index."""
        if isinstance(smiles, str):
            raise DataError("expected a sequence of SMILES, got one str")
        smiles = list(smiles)
        unk_before = self.n_unk  # the exact path's own counting is replaced below
        if self._chunk_encoder is None:
            self._chunk_encoder = ChunkEncoder(self)
        # Chunks of a few thousand SMILES keep the encoder's byte arrays in cache.
        try:
            parts = [
                self._chunk_encoder.encode(smiles[i : i + _CHUNK])
                for i in range(0, len(smiles), _CHUNK)
            ]
        except TypeError:  # joining the chunk met something other than a str
            i, bad = next((i, s) for i, s in enumerate(smiles) if not isinstance(s, str))
            raise InvalidSmilesError(repr(bad), None, f"batch item {i}: expected str") from None
        chunk = _concatenate(parts) if len(parts) != 1 else parts[0]
        if not chunk.ok.all():
            index = int(np.flatnonzero(~chunk.ok)[0])
            try:
                self.encode(smiles[index])
            except InvalidSmilesError as err:
                raise InvalidSmilesError(
                    smiles[index], err.position, f"batch item {index}: {err.reason}"
                ) from None
            raise InvalidSmilesError(smiles[index], None, f"batch item {index}")  # pragma: no cover
        self.n_unk = unk_before + int(np.count_nonzero(chunk.ids == UNK_ID))
        return chunk.ids, chunk.lengths

    def encode_many(self, smiles: Sequence[str]) -> list[list[int]]:
        """Ids (with BOS/EOS) of many SMILES, unpadded; same ids and errors as ``encode``."""
        ids, lengths = self._encode_flat(smiles)
        return (
            [row.tolist() for row in np.split(ids, np.cumsum(lengths)[:-1])] if len(lengths) else []
        )

    def encode_batch(
        self,
        smiles: Sequence[str],
        max_length: int | None = None,
        truncation: Truncation = "error",
        return_tensors: Literal["pt", "np"] = "pt",
    ) -> BatchEncoding:
        """Pad a batch to its longest member: ``input_ids`` (B, T), ``attention_mask`` (B, T).

        The first invalid SMILES raises InvalidSmilesError naming it and its index."""
        if truncation not in ("error", "truncate"):
            raise DataError(f"truncation={truncation!r}: expected 'error' or 'truncate'")
        unk_before = self.n_unk
        flat, lengths = self._encode_flat(smiles)
        ids, mask = pad_flat(flat, lengths)
        width = ids.shape[1]
        n_truncated = 0
        if max_length is not None and width > max_length:
            long_rows = np.flatnonzero(lengths > max_length)
            if truncation == "error":
                i = int(long_rows[0])
                raise InvalidSmilesError(
                    smiles[i],
                    None,
                    f"batch item {i}: {lengths[i]} tokens exceed max_length={max_length} "
                    "(truncation='error')",
                )
            ids, mask = ids[:, :max_length], mask[:, :max_length]
            ids[long_rows, max_length - 1] = EOS_ID
            n_truncated = len(long_rows)
            self.n_truncated += n_truncated
        n_unk = self.n_unk - unk_before
        if return_tensors == "np":
            return BatchEncoding(ids, mask, n_truncated, n_unk)
        import torch

        return BatchEncoding(torch.from_numpy(ids), torch.from_numpy(mask), n_truncated, n_unk)


def _concatenate(parts: list):
    """One EncodedChunk from several, in order (also for zero parts)."""
    if not parts:
        return EncodedChunk(np.zeros(0, bool), np.zeros(0, np.uint16), np.zeros(0, np.int64))
    return EncodedChunk(
        np.concatenate([p.ok for p in parts]),
        np.concatenate([p.ids for p in parts]),
        np.concatenate([p.lengths for p in parts]),
    )


def check_vocabulary_size(min_freq: int, max_size: int | None) -> None:
    """ConfigError naming ``--min-freq`` or ``--max-size`` when a vocabulary cannot be built
    with them: checked before any corpus is read."""
    if isinstance(min_freq, bool) or not isinstance(min_freq, int) or min_freq < 1:
        raise ConfigError("--min-freq", min_freq, "an integer >= 1")
    if max_size is not None and max_size <= len(SPECIAL_TOKENS):
        raise ConfigError("--max-size", max_size, f"more than the {len(SPECIAL_TOKENS)} "
                          "special tokens")  # fmt: skip
