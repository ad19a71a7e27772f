"""The text tokenizer: a subword vocabulary behind the same interface as the SMILES one.

The model core only ever sees ids, so a text model differs from a SMILES model by its
tokenizer and its data. :class:`TextTokenizer` keeps every contract of
:class:`~smiexlm.tokenizer.SmilesTokenizer`: special ids ``[PAD]=0 [BOS]=1 [EOS]=2
[MASK]=3 [UNK]=4``, ``encode`` framing ``[BOS] ... [EOS]``, ``encode_batch`` returning a
:class:`~smiexlm.tokenizer.BatchEncoding`, and a JSON file with a content hash.

Three ways to get one:

* ``TextTokenizer.build(texts, vocab_size=8000, kind="bpe")`` trains a byte-level BPE
  (GPT-2/RoBERTa style: no unknown tokens, exact round trip) with the ``tokenizers`` library;
* ``kind="wordpiece"`` trains a lower-cased BERT-style WordPiece vocabulary instead
  (unknown pieces become ``[UNK]``; decoding is not exact around punctuation);
* ``TextTokenizer.from_gpt2_files(vocab_json, merges_txt)`` loads a GPT-2/RoBERTa BPE from
  its local files. Their own special tokens (``<s>``, ``</s>``, ``<|endoftext|>``, ...) are
  replaced by smiexlm's five, placed at ids 0-4; the other tokens keep their relative order.

Special tokens spelled inside the text (someone writes ``[MASK]`` in a sentence) are plain
text, never the special token itself, as for SMILES.

Sentence pairs follow RoBERTa's convention with smiexlm's ids:
``[BOS] a ... [EOS] [EOS] b ... [EOS]`` (``<s> A </s></s> B </s>``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from smiexlm.atomic import write_text_atomic
from smiexlm.errors import ConfigError, DataError
from smiexlm.paths import VOCAB_NAME, read_json_file
from smiexlm.tokenizer.padding import pad_rows
from smiexlm.tokenizer.smiles import BatchEncoding, Truncation
from smiexlm.tokenizer.special import (
    BOS_ID,
    EOS_ID,
    MASK_ID,
    N_SPECIAL_TOKENS,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
)

TEXT_VOCAB_FORMAT = "smiexlm-text-vocab/1"
TokenizerKind = Literal["bpe", "wordpiece", "gpt2"]
#: Special tokens of GPT-2 / RoBERTa vocabularies, dropped when loading their files.
FOREIGN_SPECIALS = ("<|endoftext|>", "<s>", "</s>", "<pad>", "<unk>", "<mask>")


def text_vocabulary_hash(tokens: Sequence[str]) -> str:
    """sha256 of the token list (order matters: it fixes the ids)."""
    payload = json.dumps({"format": TEXT_VOCAB_FORMAT, "tokens": list(tokens)}, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _content_hash(spec: dict) -> str:
    """sha256 of the whole tokenizer definition (vocabulary, merges, normalizer, ...)."""
    payload = json.dumps(spec, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _without_added_tokens(tokenizer):
    """The same tokenizer with no "added tokens": specials then live only in the model
    vocabulary, so text that spells ``[MASK]`` is tokenized as ordinary characters."""
    from tokenizers import Tokenizer

    spec = json.loads(tokenizer.to_str())
    spec["added_tokens"] = []
    spec["post_processor"] = None
    spec["truncation"] = None
    spec["padding"] = None
    return Tokenizer.from_str(json.dumps(spec))


class TextTokenizer:
    """Subword tokenizer for English text with smiexlm's special ids.

    ``n_unk`` and ``n_truncated`` accumulate over the tokenizer's lifetime, as for SMILES.
    """

    pad_id, bos_id, eos_id, mask_id, unk_id = PAD_ID, BOS_ID, EOS_ID, MASK_ID, UNK_ID
    special_tokens = tuple(SPECIAL_TOKENS)

    def __init__(self, backend, kind: TokenizerKind):
        """Wrap a ``tokenizers.Tokenizer`` whose model vocabulary starts with the specials."""
        backend = _without_added_tokens(backend)
        size = backend.get_vocab_size(with_added_tokens=False)
        tokens = [backend.id_to_token(i) for i in range(size)]
        if tokens[:N_SPECIAL_TOKENS] != SPECIAL_TOKENS:
            raise DataError(
                f"text vocabulary starts with {tokens[:N_SPECIAL_TOKENS]!r}: expected the special "
                f"tokens {SPECIAL_TOKENS} at ids 0-4"
            )
        if any(t is None for t in tokens):
            raise DataError("text vocabulary has gaps in its ids: expected ids 0..size-1")
        if size > 65535:
            raise DataError(f"vocabulary size {size}: expected at most 65,535 (uint16 ids)")
        self.kind = kind
        self.tokens = tokens
        self.vocab = {tok: i for i, tok in enumerate(tokens)}
        self.vocab_hash = text_vocabulary_hash(tokens)
        self._backend = backend
        self._spec = json.loads(backend.to_str())
        self.content_hash = _content_hash(self._spec)
        self.n_unk = 0
        self.n_truncated = 0

    # ------------------------------------------------------------------ construction
    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"TextTokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"

    @classmethod
    def build(
        cls,
        texts: Iterable[str],
        vocab_size: int = 8000,
        min_freq: int = 2,
        kind: Literal["bpe", "wordpiece"] = "bpe",
        show_progress: bool = False,
    ) -> TextTokenizer:
        """Train a vocabulary of at most ``vocab_size`` tokens (specials included) on
        ``texts`` (one document or line per item)."""
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

        if vocab_size <= N_SPECIAL_TOKENS + 1:
            raise ConfigError("vocab_size", vocab_size, f"an integer > {N_SPECIAL_TOKENS + 1}")
        if vocab_size > 65535:
            raise ConfigError("vocab_size", vocab_size, "at most 65,535 (uint16 ids)")
        if min_freq < 1:
            raise ConfigError("min_freq", min_freq, "an integer >= 1")
        if kind == "bpe":
            backend = Tokenizer(models.BPE())
            backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            backend.decoder = decoders.ByteLevel()
            trainer = trainers.BpeTrainer(
                vocab_size=vocab_size,
                min_frequency=min_freq,
                special_tokens=list(SPECIAL_TOKENS),
                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                show_progress=show_progress,
            )
        elif kind == "wordpiece":
            backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
            backend.normalizer = normalizers.BertNormalizer(lowercase=True)
            backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            backend.decoder = decoders.WordPiece()
            trainer = trainers.WordPieceTrainer(
                vocab_size=vocab_size,
                min_frequency=min_freq,
                special_tokens=list(SPECIAL_TOKENS),
                show_progress=show_progress,
            )
        else:
            raise ConfigError("kind", kind, "'bpe' or 'wordpiece'")
        backend.train_from_iterator((t for t in texts if t), trainer)
        return cls(backend, kind)

    @classmethod
    def from_gpt2_files(cls, vocab_json: str | Path, merges_txt: str | Path) -> TextTokenizer:
        """Load a GPT-2/RoBERTa byte-level BPE from its ``vocab.json`` and ``merges.txt``."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        vocab_json, merges_txt = Path(vocab_json), Path(merges_txt)
        for path in (vocab_json, merges_txt):
            if not path.is_file():
                raise DataError(f"BPE file {str(path)!r} does not exist")
        try:
            foreign = json.loads(vocab_json.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise DataError(f"{str(vocab_json)!r} is not valid JSON: {err}") from None
        if not isinstance(foreign, dict):
            raise DataError(f"{str(vocab_json)!r}: expected a JSON object token -> id")
        ordered = sorted(foreign, key=lambda t: foreign[t])
        dropped = set(FOREIGN_SPECIALS) | set(SPECIAL_TOKENS)
        tokens = list(SPECIAL_TOKENS) + [t for t in ordered if t not in dropped]
        merges = []
        for number, line in enumerate(merges_txt.read_text(encoding="utf-8").split("\n"), 1):
            if not line or line.startswith("#version"):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                raise DataError(
                    f"{str(merges_txt)!r} line {number}: expected 'left right', got {line!r}"
                )
            merges.append((parts[0], parts[1]))
        model = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
        backend = Tokenizer(model)
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        return cls(backend, "gpt2")

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the tokenizer as one JSON file (a directory gets ``vocab.json``)."""
        path = Path(path)
        if path.is_dir():
            path = path / VOCAB_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "format": TEXT_VOCAB_FORMAT,
            "kind": self.kind,
            "hash": self.vocab_hash,
            "content_hash": self.content_hash,
            "special_tokens": {tok: i for i, tok in enumerate(SPECIAL_TOKENS)},
            "vocab_size": self.vocab_size,
            # The token list (id order) lets any reader check size and hash without the
            # ``tokenizers`` library; the full definition below is what encodes.
            "tokens": self.tokens,
            "tokenizer": self._spec,
        }
        write_text_atomic(path, json.dumps(doc, ensure_ascii=False) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> TextTokenizer:
        """Read a file written by :meth:`save`; both hashes are checked."""
        from tokenizers import Tokenizer

        path, doc = read_json_file(path, "tokenizer file", TEXT_VOCAB_FORMAT)
        spec = doc["tokenizer"]
        if _content_hash(spec) != doc.get("content_hash"):
            raise DataError(
                f"tokenizer file {str(path)!r} records content hash {doc.get('content_hash')!r} "
                f"but its definition hashes to {_content_hash(spec)!r}: edited or corrupted"
            )
        tok = cls(Tokenizer.from_str(json.dumps(spec)), doc.get("kind", "bpe"))
        if tok.vocab_hash != doc.get("hash") or doc.get("tokens", tok.tokens) != tok.tokens:
            raise DataError(
                f"tokenizer file {str(path)!r} records hash {doc.get('hash')!r} but its tokens "
                f"hash to {tok.vocab_hash!r}: edited or corrupted"
            )
        return tok

    # ------------------------------------------------------------------ one text
    def tokenize(self, text: str) -> list[str]:
        """Subword tokens of ``text`` (byte-level BPE shows a leading space as ``Ġ``)."""
        return self._backend.encode(self._check(text), add_special_tokens=False).tokens

    @staticmethod
    def _check(text: object) -> str:
        if not isinstance(text, str):
            raise DataError(f"text {text!r}: expected str, got {type(text).__name__}")
        return text

    def _ids(self, text: str) -> list[int]:
        ids = self._backend.encode(self._check(text), add_special_tokens=False).ids
        self.n_unk += ids.count(UNK_ID)
        return ids

    def encode(
        self,
        text: str,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: Truncation = "error",
    ) -> list[int]:
        """Ids of one text, ``[BOS] ... [EOS]`` by default; ``max_length`` counts the specials.

        Over-long input raises (``truncation="error"``) or keeps its first tokens and the
        final EOS (``"truncate"``, counted in ``n_truncated``)."""
        ids = self._ids(text)
        if add_special_tokens:
            ids = [BOS_ID, *ids, EOS_ID]
        if max_length is not None and len(ids) > max_length:
            self._check_truncation(truncation, len(ids), max_length, text)
            self.n_truncated += 1
            ids = [*ids[: max_length - 1], EOS_ID] if add_special_tokens else ids[:max_length]
        return ids

    def encode_pair(
        self,
        text_a: str,
        text_b: str,
        max_length: int | None = None,
        truncation: Truncation = "error",
    ) -> list[int]:
        """``[BOS] a [EOS] [EOS] b [EOS]``. Truncation removes tokens from the end of the
        longer segment first, one at a time, until the pair fits ``max_length``."""
        a, b = self._ids(text_a), self._ids(text_b)
        if max_length is not None and len(a) + len(b) + 4 > max_length:
            self._check_truncation(truncation, len(a) + len(b) + 4, max_length, text_a)
            budget = max_length - 4
            if budget < 0:
                raise ConfigError("max_length", max_length, "at least 4 for a sentence pair")
            self.n_truncated += 1
            while len(a) + len(b) > budget:
                if len(a) >= len(b):
                    a.pop()
                else:
                    b.pop()
        return [BOS_ID, *a, EOS_ID, EOS_ID, *b, EOS_ID]

    @staticmethod
    def _check_truncation(truncation: str, length: int, max_length: int, text: str) -> None:
        if truncation == "error":
            raise DataError(
                f"text {text[:60]!r}... has {length} tokens, over max_length={max_length}: "
                "expected shorter input or truncation='truncate'"
            )
        if truncation != "truncate":
            raise ConfigError("truncation", truncation, "'error' or 'truncate'")

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """The text spelled by ``ids``; specials are dropped unless asked for."""
        pieces: list[str] = []
        run: list[int] = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.tokens):
                raise DataError(f"token id {i}: expected 0 <= id < {len(self.tokens)}")
            if i < N_SPECIAL_TOKENS:
                if run:
                    pieces.append(self._backend.decode(run, skip_special_tokens=False))
                    run = []
                if not skip_special_tokens:
                    pieces.append(self.tokens[i])
            else:
                run.append(i)
        if run:
            pieces.append(self._backend.decode(run, skip_special_tokens=False))
        return "".join(pieces)

    # ------------------------------------------------------------------ batches
    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids (with BOS/EOS) of many texts, unpadded, through the batched Rust path."""
        if isinstance(texts, str):
            raise DataError("encode_many expects a sequence of texts, got one str")
        texts = [self._check(t) for t in texts]
        rows = [enc.ids for enc in self._backend.encode_batch(texts, add_special_tokens=False)]
        self.n_unk += sum(row.count(UNK_ID) for row in rows)
        return [[BOS_ID, *row, EOS_ID] for row in rows]

    def encode_batch(
        self,
        texts: Sequence[str],
        max_length: int | None = None,
        truncation: Truncation = "error",
        return_tensors: Literal["pt", "np"] = "pt",
    ) -> BatchEncoding:
        """Pad a batch to its longest member: ``input_ids`` (B, T), ``attention_mask`` (B, T)."""
        unk_before = self.n_unk
        rows = self.encode_many(texts)
        n_truncated = 0
        if max_length is not None:
            for i, row in enumerate(rows):
                if len(row) > max_length:
                    self._check_truncation(truncation, len(row), max_length, texts[i])
                    rows[i] = [*row[: max_length - 1], EOS_ID]
                    n_truncated += 1
        self.n_truncated += n_truncated
        return _batch_encoding(rows, n_truncated, self.n_unk - unk_before, return_tensors)

    def encode_pair_batch(
        self,
        texts_a: Sequence[str],
        texts_b: Sequence[str],
        max_length: int | None = None,
        truncation: Truncation = "error",
        return_tensors: Literal["pt", "np"] = "pt",
    ) -> BatchEncoding:
        """Padded batch of sentence pairs, each ``[BOS] a [EOS] [EOS] b [EOS]``."""
        if len(texts_a) != len(texts_b):
            raise DataError(f"{len(texts_a)} first sentences but {len(texts_b)} second ones")
        unk_before, trunc_before = self.n_unk, self.n_truncated
        rows = [
            self.encode_pair(a, b, max_length=max_length, truncation=truncation)
            for a, b in zip(texts_a, texts_b, strict=True)
        ]
        return _batch_encoding(
            rows, self.n_truncated - trunc_before, self.n_unk - unk_before, return_tensors
        )


def _batch_encoding(
    rows: list[list[int]], n_truncated: int, n_unk: int, return_tensors: str = "pt"
) -> BatchEncoding:
    """Right-pad id rows with PAD = 0 into a :class:`BatchEncoding`."""
    ids, mask = pad_rows(rows, PAD_ID)
    if return_tensors == "np":
        return BatchEncoding(ids, mask, n_truncated, n_unk)
    import torch

    return BatchEncoding(torch.from_numpy(ids), torch.from_numpy(mask), n_truncated, n_unk)
