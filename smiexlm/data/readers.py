"""Reading a user's table of molecules: the one home of the input formats.

One suffix table (:data:`SUFFIXES`; a trailing ``.gz`` is ignored, and gzip magic bytes are
decompressed on the fly) and one SMILES-column rule (:func:`smiles_column`) serve two readers:

- :func:`iter_table` / :func:`read_table`: pandas DataFrames of at most ``chunk_rows`` rows,
  for embed, predict, search and fine-tuning on a user's table. CSV/TSV cells are text exactly
  as written (``"007"`` stays ``"007"``, a blank cell is ``""``), unless ``infer_types`` asks
  pandas to type them as a label table needs.
- :func:`read_chunks` / :func:`iter_smiles`: raw rows for preprocessing. A chunk is
  ``(lines, items)``: 1-based line (or row/record) numbers and the raw values (``bytes`` for
  text files, so that UTF-8 decoding and its failures happen in the workers; ``str | None``
  otherwise). Chunks never mix sources.

Formats:

- ``.smi`` / ``.smiles`` / ``.txt``: a line is ``SMILES [name]``, split by
  :func:`split_smiles_line`; only a line feed ends a line. The DataFrame reader skips blank
  lines and names the columns ``<smiles_col>`` and ``name``.
- ``.csv`` / ``.tsv``: a header row and a SMILES column.
- ``.parquet`` / ``.pq``: read one record batch at a time.
- Uni-Mol LMDB archives (a ``.lmdb`` file or a folder holding ``data.mdb``; preprocessing
  only), behind the optional ``lmdb`` extra (:mod:`smiexlm.data.lmdb_input`).

Every way a file can be unusable (missing, a folder, an unknown suffix, empty, header only,
not UTF-8, truncated, not the format its suffix says, no SMILES column, a column name given
twice) raises one :class:`~smiexlm.errors.DataError` naming the file, the problem and what
was expected. :func:`table_header` gives a CSV/TSV's header as written (Ray's reader too).
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from collections.abc import Iterator, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, Literal

from smiexlm.data.read_errors import decode_line, empty_message, reading
from smiexlm.errors import DataError

Format = Literal["smi", "csv", "tsv", "parquet", "lmdb"]
Chunk = tuple[list[int], list]

SUFFIXES: dict[str, Format] = {
    ".smi": "smi",
    ".smiles": "smi",
    ".txt": "smi",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".lmdb": "lmdb",
}
# Tried in order when no SMILES column is named: as written, then in any case (if unique).
SMILES_COLUMNS = ("smiles", "SMILES", "Smiles", "mol", "canonical_smiles", "smi")

_FIELD_SEPARATOR = re.compile(r"[ \t]+")
BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark, which some editors put first


def write_table(frame: Any, path: Path) -> None:
    """Write ``frame`` (a DataFrame, no index) to ``path`` in the format its suffix names (an
    atomic temporary keeps the final name's): Parquet for ``.parquet``, tab-separated for
    ``.tsv``, CSV otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix == ".parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_csv(path, index=False, sep="\t" if suffix == ".tsv" else ",")


def allow_long_fields() -> None:
    """Let Python's csv module read a field of any length (its default stops at 131,072
    characters): a SMILES may be megabytes long, and a rejects list keeps it whole."""
    csv.field_size_limit(2**31 - 1)


_UNDECODED = re.compile(r"[\udc80-\udcff]")  # bytes that surrogateescape kept undecoded


def split_smiles_line(line: str) -> tuple[str, str]:
    """``(smiles, name)`` of one line of a SMILES file, the same for every command.

    Surrounding whitespace (``str.strip``) is removed; the SMILES runs up to the first space
    or tab and the rest is its name. A blank line gives ``("", "")``."""
    parts = _FIELD_SEPARATOR.split(line.strip(), maxsplit=1)
    return parts[0], parts[1] if len(parts) > 1 else ""


def detect_format(path: Path, what: str = "input", lmdb: bool = True) -> Format:
    """The format of ``path`` from its suffix (a trailing ``.gz`` is ignored); DataError for
    a missing file, a folder (but an LMDB one, when ``lmdb``) or a suffix not in the table."""
    path = Path(path)
    if lmdb and path.is_dir() and (path / "data.mdb").is_file():
        return "lmdb"
    if path.is_dir():
        kind = "a SMILES file (or an LMDB folder holding data.mdb)" if lmdb else "a file"
        raise DataError(f"{what} {str(path)!r} is a directory: expected {kind}")
    if not path.is_file():
        raise DataError(f"{what} {str(path)!r} does not exist")
    formats = {s: f for s, f in SUFFIXES.items() if lmdb or f != "lmdb"}
    suffix = Path(path.name.lower().removesuffix(".gz")).suffix
    if suffix not in formats:
        raise DataError(f"{what} {str(path)!r} has suffix {suffix!r}: expected one of "
                        f"{sorted(formats)} (optionally + .gz){' or an LMDB folder' if lmdb else ''}")  # fmt: skip
    return formats[suffix]


def smiles_column(
    header: Sequence[Any], wanted: str | None, path: Path, what: str = "input"
) -> str:
    """The SMILES column of a table with the column names ``header`` (as written: DataError for
    a name given twice, which pandas would read as ``y`` and ``y.1``): ``wanted`` exactly as
    written when given, else the first of :data:`SMILES_COLUMNS` present as written, else the
    first present in any case (when only one column matches it)."""
    columns = [str(c) for c in header]
    _check_unique(columns, path, what)
    names = [wanted] if wanted else list(SMILES_COLUMNS)
    for name in names:
        if name in columns:
            return name
    lowered = [c.lower() for c in columns]
    for name in [] if wanted else names:
        if lowered.count(name.lower()) == 1:
            return columns[lowered.index(name.lower())]
    raise DataError(f"{what} {str(path)!r} has no SMILES column {wanted or 'smiles'!r}: not "
                    f"found among its columns {columns[:20]!r}; pass --smiles-col with one of them")  # fmt: skip


def _check_unique(names: list[str], path: Path, what: str) -> None:
    """DataError naming the first name of two columns, and where (blank ones are no names:
    pandas calls each ``Unnamed: <i>``)."""
    for name in dict.fromkeys(n for n in names if n.strip()):
        if len(places := [i for i, n in enumerate(names, start=1) if n == name]) > 1:
            where = ", ".join(map(str, places[:-1])) + f" and {places[-1]}"
            raise DataError(f"{what} {str(path)!r}: its header names the column {name!r} "
                            f"{len(places)} times (columns {where}, counting from 1): expected "
                            "each name once; rename or drop the repeats")  # fmt: skip


# ---------------------------------------------------------------------- DataFrames
def iter_table(
    path: Path, smiles_col: str = "smiles", chunk_rows: int = 8192, what: str = "input"
) -> Iterator[Any]:
    """DataFrames of up to ``chunk_rows`` rows of ``path``; at least one, none empty. A
    Parquet column keeps its type in every chunk (:func:`kept_arrow_type`), so that the parts
    written from the chunks share one schema."""
    return _frames(Path(path), smiles_col, chunk_rows, what, infer_types=False, keep_types=True)


def read_table(
    path: Path, smiles_col: str = "smiles", what: str = "input", infer_types: bool = False
) -> Any:
    """The whole table as one DataFrame (for inputs that fit in memory).

    ``infer_types`` lets pandas type the CSV/TSV columns of the whole file at once (numbers
    as numbers, its missing-value markers such as ``NA`` as NaN), as label tables need."""
    import pandas as pd

    frames = list(_frames(Path(path), smiles_col, 8192, what, infer_types))
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def kept_arrow_type(arrow_type: Any) -> Any:
    """The pandas dtype of a Parquet column read in chunks (``types_mapper``): Arrow's own,
    where NumPy's would change with the chunk (a bool or an integer column with a null is
    object or float there, and one all null in a chunk would be written as Arrow's null
    type); text stays Python strings, which the SMILES checks read."""
    import pandas as pd
    import pyarrow as pa

    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return None
    return None if pa.types.is_dictionary(arrow_type) else pd.ArrowDtype(arrow_type)


def _frames(path: Path, smiles_col: str, chunk_rows: int, what: str, infer_types: bool,
            keep_types: bool = False):  # fmt: skip
    fmt = detect_format(path, what, lmdb=False)
    seen = False
    with reading(path, what):
        if fmt == "parquet":
            frames = _parquet_frames(path, smiles_col, chunk_rows, what, keep_types)
        elif fmt == "smi":
            frames = _smi_frames(path, smiles_col, chunk_rows, what)
        else:
            rows = None if infer_types else chunk_rows
            frames = _csv_frames(path, "\t" if fmt == "tsv" else ",", smiles_col, rows, what)
        for frame in frames:
            if len(frame):
                seen = True
                yield frame
    if not seen:
        raise DataError(f"{what} {str(path)!r} has no rows: expected at least one SMILES")


def _csv_frames(
    path: Path, sep: str, smiles_col: str, chunk_rows: int | None, what: str
) -> Iterator[Any]:
    """Text cells in chunks of ``chunk_rows``, or (``None``) the whole file typed by pandas."""
    import pandas as pd

    if chunk_rows is None:
        options: dict[str, Any] = {"low_memory": False}
    else:
        options = {"chunksize": chunk_rows, "dtype": str, "keep_default_na": False}
    header = table_header(path, sep)
    with _open_binary(path) as handle:
        try:
            read = pd.read_csv(handle, sep=sep, encoding="utf-8-sig", **options)
        except pd.errors.EmptyDataError:
            raise DataError(empty_message(path, what)) from None
        frames = [read] if chunk_rows is None else read
        try:
            for number, frame in enumerate(frames):
                if number == 0:
                    smiles_column(header, smiles_col, path, what)
                if not isinstance(frame.index, pd.RangeIndex):  # pandas' index of extra fields
                    raise DataError(
                        f"{what} {str(path)!r}: its rows hold more fields than its header's "
                        f"{len(header)} ({', '.join(header)}); expected one field a column (a "
                        "column without a name in the header, or a delimiter inside a field?)"
                    )
                yield frame
        finally:
            if chunk_rows is not None:
                read.close()


def table_header(path: Path, sep: str) -> list[str]:
    """A CSV/TSV's header as written (not as pandas renames it), past blank lines as pandas."""
    allow_long_fields()
    with io.TextIOWrapper(_open_binary(path), "utf-8-sig", "surrogateescape", newline="") as text:
        return next((r for r in csv.reader(text, delimiter=sep) if _filled(r)), [])


def _filled(row: list[str]) -> bool:
    """Whether a CSV row is more than a blank line (a header's first row, as pandas finds it)."""
    return len(row) > 1 or bool("".join(row).strip())


def parquet_header(path: Path, what: str = "input") -> list[str]:
    """A Parquet file's column names (its schema alone is read)."""
    return list(_parquet_file(path, what).schema_arrow.names)


def _smi_frames(path: Path, smiles_col: str, chunk_rows: int, what: str) -> Iterator[Any]:
    import pandas as pd

    for lines, raw in _smi_chunks(path, chunk_rows):
        rows = [
            split_smiles_line(decode_line(item, n, path, what))
            for n, item in zip(lines, raw, strict=True)
        ]
        rows = [row for row in rows if row[0]]
        yield pd.DataFrame({smiles_col: [r[0] for r in rows], "name": [r[1] for r in rows]})


def _parquet_frames(path: Path, smiles_col: str, chunk_rows: int, what: str,
                    keep_types: bool) -> Iterator[Any]:  # fmt: skip
    handle = _parquet_file(path, what)
    smiles_column(handle.schema_arrow.names, smiles_col, path, what)
    mapper = kept_arrow_type if keep_types else None
    for batch in handle.iter_batches(batch_size=chunk_rows):
        yield batch.to_pandas(types_mapper=mapper)


# ---------------------------------------------------------------------- raw chunks
def read_chunks(
    path: Path,
    chunk_size: int,
    smiles_col: str | None = None,
    fmt: Format | None = None,
    what: str = "input",
) -> Iterator[Chunk]:
    """Chunks of ``chunk_size`` rows of ``path``; raises DataError for unreadable input."""
    path = Path(path)
    fmt = fmt or detect_format(path, what)
    with reading(path, what):
        if fmt == "smi":
            yield from _smi_chunks(path, chunk_size)
        elif fmt in ("csv", "tsv"):
            sep = "\t" if fmt == "tsv" else ","
            yield from _csv_chunks(path, chunk_size, smiles_col, sep, what)
        elif fmt == "parquet":
            yield from _parquet_chunks(path, chunk_size, smiles_col, what)
        else:
            from smiexlm.data.lmdb_input import lmdb_chunks

            yield from lmdb_chunks(path, chunk_size, smiles_col)


def iter_smiles(
    path: Path, smiles_col: str | None = None, chunk_size: int = 8192, what: str = "input"
) -> Iterator[str]:
    """The SMILES of every line (row, record) of ``path``, in order; ``""`` where there is none.

    Any format :func:`read_chunks` reads; a text line is split by :func:`split_smiles_line`,
    a table cell is stripped. A line that is not UTF-8 raises DataError naming it."""
    for lines, items in read_chunks(Path(path), chunk_size, smiles_col, what=what):
        for line, item in zip(lines, items, strict=True):
            if isinstance(item, bytes):
                yield split_smiles_line(decode_line(item, line, path, what))[0]
            else:
                yield item.strip() if item else ""


def _smi_chunks(path: Path, chunk_size: int) -> Iterator[Chunk]:
    with _open_binary(path) as handle:
        line = 1
        while rows := list(islice(handle, chunk_size)):
            if line == 1 and rows[0].startswith(BOM):  # as utf-8-sig reads a CSV
                rows[0] = rows[0][len(BOM) :]
            yield list(range(line, line + len(rows))), rows
            line += len(rows)


def _csv_chunks(
    path: Path, chunk_size: int, col: str | None, delimiter: str, what: str
) -> Iterator[Chunk]:
    # surrogateescape keeps undecodable bytes visible; the worker rejects them as non-UTF-8.
    with io.TextIOWrapper(
        _open_binary(path), encoding="utf-8-sig", errors="surrogateescape", newline=""
    ) as text:
        allow_long_fields()
        reader = csv.reader(text, delimiter=delimiter)
        # past blank lines, as pandas reads it (and as the DataFrame reader does)
        header = next((r for r in reader if _filled(r)), None)
        if header is None:
            raise DataError(empty_message(path, what))
        if any(_UNDECODED.search(name) for name in header):
            _check_utf8_header(path, what)
        index = header.index(smiles_column(header, col, path, what))
        lines: list[int] = []
        items: list[str | None] = []
        for row in reader:
            if not row:  # a blank line holds no row, as pandas reads it
                continue
            if len(row) > len(header):  # pandas refuses it too: the columns have shifted
                raise DataError(
                    f"{what} {str(path)!r} line {reader.line_num} has {len(row)} fields where "
                    f"its header names {len(header)}: expected a field a column (quote a "
                    f"field that holds {delimiter!r})"
                )
            lines.append(reader.line_num)
            items.append(row[index] if index < len(row) else None)
            if len(items) == chunk_size:
                yield lines, items
                lines, items = [], []
        if items:
            yield lines, items


def _parquet_chunks(path: Path, chunk_size: int, col: str | None, what: str) -> Iterator[Chunk]:
    handle = _parquet_file(path, what)
    name = smiles_column(handle.schema_arrow.names, col, path, what)
    row = 1
    for batch in handle.iter_batches(batch_size=chunk_size, columns=[name]):
        values = batch.column(0).to_pylist()
        items = [v if isinstance(v, str) or v is None else str(v) for v in values]
        yield list(range(row, row + len(items))), items
        row += len(items)


# ---------------------------------------------------------------------- shared plumbing
def _open_binary(path: Path) -> io.BufferedIOBase:
    handle = open(path, "rb")  # noqa: SIM115 - returned to the caller
    if handle.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=handle, mode="rb")  # type: ignore[return-value]
    return handle


def _parquet_file(path: Path, what: str) -> Any:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types for a file that is not Parquet
        raise DataError(f"{what} {str(path)!r} is not a readable Parquet file: {err}") from None


def _check_utf8_header(path: Path, what: str) -> None:
    """The not-UTF-8 DataError of :func:`~smiexlm.data.read_errors.reading`, for a header
    row that is not UTF-8."""
    with _open_binary(path) as handle, reading(path, what):
        handle.readline().decode("utf-8")
