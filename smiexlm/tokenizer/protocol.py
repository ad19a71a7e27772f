"""What every tokenizer offers (:class:`Tokenizer`), and :func:`load_tokenizer` for either kind.

The model core sees ids only, so the SMILES and the text tokenizer are interchangeable
behind this interface: a dataset's ``vocab.json`` holds one or the other, and training,
export and fine-tuning work with whichever :func:`load_tokenizer` returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from smiexlm.errors import DataError
from smiexlm.paths import read_json_file
from smiexlm.tokenizer.smiles import (
    VOCAB_FORMAT,
    BatchEncoding,
    SmilesTokenizer,
    Truncation,
    vocabulary_hash,
)
from smiexlm.tokenizer.text import TEXT_VOCAB_FORMAT, TextTokenizer, text_vocabulary_hash


@runtime_checkable
class Tokenizer(Protocol):
    """Ids with ``[PAD]=0 [BOS]=1 [EOS]=2 [MASK]=3 [UNK]=4``, a token list and its hash."""

    tokens: list[str]
    vocab_hash: str  # sha256 of the token list; datasets and checkpoints record it
    n_unk: int  # tokens mapped to [UNK] so far
    n_truncated: int  # inputs cut to max_length so far

    @property
    def vocab_size(self) -> int: ...

    def __len__(self) -> int: ...

    def tokenize(self, text: str, /) -> list[str]: ...

    def encode(
        self,
        text: str,
        /,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: Truncation = "error",
    ) -> list[int]: ...

    def encode_many(self, texts: Sequence[str], /) -> list[list[int]]: ...

    def encode_batch(
        self,
        texts: Sequence[str],
        /,
        max_length: int | None = None,
        truncation: Truncation = "error",
        return_tensors: Literal["pt", "np"] = "pt",
    ) -> BatchEncoding: ...

    def decode(self, ids: Iterable[int], /, skip_special_tokens: bool = True) -> str: ...

    def save(self, path: str | Path, /) -> Path: ...


def load_tokenizer(path: str | Path) -> Tokenizer:
    """A SMILES or text tokenizer, whichever format the JSON file (or folder) holds."""
    file, doc = read_json_file(path, "tokenizer file")
    fmt = doc.get("format")
    return TextTokenizer.load(file) if fmt == TEXT_VOCAB_FORMAT else SmilesTokenizer.load(file)


def vocabulary_file_hash(path: str | Path) -> tuple[Path, int, str]:
    """``(file, size, hash)`` of a SMILES or text vocabulary JSON (a folder means its
    ``vocab.json``), the hash computed from its tokens, never taken from the file: a ``hash``
    the file records must agree with them, and a file without one is hashed all the same."""
    file, doc = read_json_file(path, "vocabulary file")
    fmt, tokens = doc.get("format"), doc.get("tokens")
    if fmt not in (VOCAB_FORMAT, TEXT_VOCAB_FORMAT):
        raise DataError(f"vocabulary file {str(file)!r} has format {fmt!r}: expected "
                        f"{VOCAB_FORMAT!r} or {TEXT_VOCAB_FORMAT!r}")  # fmt: skip
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise DataError(f"vocabulary file {str(file)!r}: expected a 'tokens' list of strings")
    found = text_vocabulary_hash(tokens) if fmt == TEXT_VOCAB_FORMAT else vocabulary_hash(tokens)
    if doc.get("hash") not in (None, found):
        raise DataError(
            f"vocabulary file {str(file)!r} records hash {doc['hash']!r} but its tokens hash "
            f"to {found!r}: the file was edited or corrupted"
        )
    return file, len(tokens), found
