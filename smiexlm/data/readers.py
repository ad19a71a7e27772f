"""Streamed readers of raw SMILES files, yielding fixed-size chunks of rows.

Formats (a ``.gz`` suffix or gzip magic bytes is decompressed on the fly):

- ``.smi`` / ``.smiles`` / ``.txt``: one SMILES per line, the first whitespace-separated field;
  chunks carry raw bytes so that UTF-8 decoding (and its failures) happen in the workers.
- ``.csv`` / ``.tsv``: a header row and a named SMILES column.
- ``.parquet``: a named string column, read one record batch at a time.
- Uni-Mol LMDB archives (a ``.lmdb`` file or a folder holding ``data.mdb``), behind the
  optional ``lmdb`` extra. Uni-Mol stores each record as a Python pickle, and unpickling can
  run arbitrary code: only read archives you trust. Nothing else is ever unpickled.

A chunk is ``(lines, items)``: 1-based line (or row/record) numbers and the raw values
(``bytes`` for text files, ``str | None`` otherwise). Chunks never mix sources.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import re
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Literal

from smiexlm.errors import DataError

Format = Literal["smi", "csv", "tsv", "parquet", "lmdb"]
Chunk = tuple[list[int], list]

_SUFFIXES: dict[str, Format] = {
    ".smi": "smi",
    ".smiles": "smi",
    ".txt": "smi",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".lmdb": "lmdb",
}


_FIELD_SEPARATOR = re.compile(r"[ \t]+")


def split_smiles_line(line: str) -> tuple[str, str]:
    """``(smiles, name)`` of one line of a SMILES file, the same for every command.

    Surrounding whitespace (``str.strip``) is removed; the SMILES runs up to the first space
    or tab and the rest is its name. A blank line gives ``("", "")``."""
    parts = _FIELD_SEPARATOR.split(line.strip(), maxsplit=1)
    return parts[0], parts[1] if len(parts) > 1 else ""


def detect_format(path: Path) -> Format:
    """The input format of ``path`` from its suffix (a trailing ``.gz`` is ignored)."""
    if path.is_dir() and (path / "data.mdb").is_file():
        return "lmdb"
    if path.is_dir():
        raise DataError(
            f"input {str(path)!r} is a directory: expected a SMILES file (or an LMDB folder "
            "holding data.mdb)"
        )
    name = path.name.lower()
    if name.endswith(".gz"):
        name = name[:-3]
    suffix = Path(name).suffix
    if suffix not in _SUFFIXES:
        raise DataError(
            f"input {str(path)!r} has suffix {suffix!r}: expected one of "
            f"{sorted(_SUFFIXES)} (optionally + .gz) or an LMDB folder"
        )
    return _SUFFIXES[suffix]


def file_sha256(path: Path) -> str:
    """sha256 of a file (of ``data.mdb`` for an LMDB folder); raises DataError if unreadable."""
    target = path / "data.mdb" if path.is_dir() else path
    digest = hashlib.sha256()
    try:
        with open(target, "rb") as handle:
            while block := handle.read(1 << 22):
                digest.update(block)
    except OSError as err:
        raise DataError(f"input {str(path)!r} cannot be read: {err.strerror or err}") from None
    return digest.hexdigest()


def _open_binary(path: Path) -> io.BufferedIOBase:
    handle = open(path, "rb")  # noqa: SIM115 - returned to the caller
    if handle.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=handle, mode="rb")  # type: ignore[return-value]
    return handle


def read_chunks(
    path: Path, chunk_size: int, smiles_col: str | None = None, fmt: Format | None = None
) -> Iterator[Chunk]:
    """Chunks of ``chunk_size`` rows of ``path``; raises DataError for unreadable input."""
    fmt = fmt or detect_format(path)
    try:
        if fmt == "smi":
            yield from _smi_chunks(path, chunk_size)
        elif fmt in ("csv", "tsv"):
            yield from _csv_chunks(path, chunk_size, smiles_col, "\t" if fmt == "tsv" else ",")
        elif fmt == "parquet":
            yield from _parquet_chunks(path, chunk_size, smiles_col)
        else:
            yield from _lmdb_chunks(path, chunk_size, smiles_col)
    except (OSError, EOFError, gzip.BadGzipFile, csv.Error) as err:
        raise DataError(f"input {str(path)!r} is unreadable or truncated: {err}") from None


def iter_smiles(path: Path, smiles_col: str | None = None, chunk_size: int = 8192) -> Iterator[str]:
    """The SMILES of every line (row, record) of ``path``, in order; ``""`` where there is none.

    Any format :func:`read_chunks` reads; a text line is split by :func:`split_smiles_line`,
    a table cell is stripped. A line that is not UTF-8 raises DataError naming it."""
    for lines, items in read_chunks(Path(path), chunk_size, smiles_col):
        for line, item in zip(lines, items, strict=True):
            if isinstance(item, bytes):
                try:
                    item = item.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise DataError(
                        f"input {str(path)!r} line {line} is not UTF-8 text (byte offset "
                        f"{err.start}): expected one SMILES per line"
                    ) from None
                yield split_smiles_line(item)[0]
            else:
                yield item.strip() if item else ""


def _smi_chunks(path: Path, chunk_size: int) -> Iterator[Chunk]:
    with _open_binary(path) as handle:
        line = 1
        while rows := list(islice(handle, chunk_size)):
            yield list(range(line, line + len(rows))), rows
            line += len(rows)


def _pick_column(columns: list[str], wanted: str | None, path: Path) -> int:
    names = [wanted] if wanted else ["smiles", "SMILES", "Smiles", "mol", "canonical_smiles", "smi"]
    for name in names:
        if name in columns:
            return columns.index(name)
    lowered = [c.lower() for c in columns]
    for name in names:
        if lowered.count(name.lower()) == 1:
            return lowered.index(name.lower())
    raise DataError(
        f"input {str(path)!r} has no SMILES column {wanted or 'smiles'!r}: its columns are "
        f"{columns[:20]!r}; pass --smiles-col with one of them"
    )


def _csv_chunks(path: Path, chunk_size: int, col: str | None, delimiter: str) -> Iterator[Chunk]:
    # surrogateescape keeps undecodable bytes visible; the worker rejects them as non-UTF-8.
    with io.TextIOWrapper(
        _open_binary(path), encoding="utf-8-sig", errors="surrogateescape", newline=""
    ) as text:
        reader = csv.reader(text, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            raise DataError(f"input {str(path)!r} is empty: expected a header row")
        index = _pick_column(header, col, path)
        lines: list[int] = []
        items: list[str | None] = []
        for row in reader:
            lines.append(reader.line_num)
            items.append(row[index] if index < len(row) else None)
            if len(items) == chunk_size:
                yield lines, items
                lines, items = [], []
        if items:
            yield lines, items


def _parquet_chunks(path: Path, chunk_size: int, col: str | None) -> Iterator[Chunk]:
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types for a bad file
        raise DataError(f"input {str(path)!r} is not a readable Parquet file: {err}") from None
    index = _pick_column(handle.schema_arrow.names, col, path)
    name = handle.schema_arrow.names[index]
    row = 1
    for batch in handle.iter_batches(batch_size=chunk_size, columns=[name]):
        values = batch.column(0).to_pylist()
        items = [v if isinstance(v, str) or v is None else str(v) for v in values]
        yield list(range(row, row + len(items))), items
        row += len(items)


def _lmdb_chunks(path: Path, chunk_size: int, col: str | None) -> Iterator[Chunk]:
    try:
        import lmdb
    except ImportError:
        raise DataError(
            f"input {str(path)!r} is an LMDB archive: install the optional extra "
            "(pip install 'smiexlm[lmdb]')"
        ) from None
    import pickle

    key = col or "smi"
    env = lmdb.open(str(path), subdir=path.is_dir(), readonly=True, lock=False, readahead=False)
    try:
        with env.begin() as txn:
            lines: list[int] = []
            items: list[str | None] = []
            for record, (_, value) in enumerate(txn.cursor(), start=1):
                # Uni-Mol archives are pickled dicts: trusted input only (see module doc).
                entry = pickle.loads(value)  # noqa: S301
                smiles = entry.get(key) if isinstance(entry, dict) else None
                lines.append(record)
                items.append(smiles if isinstance(smiles, str) else None)
                if len(items) == chunk_size:
                    yield lines, items
                    lines, items = [], []
            if items:
                yield lines, items
    finally:
        env.close()
