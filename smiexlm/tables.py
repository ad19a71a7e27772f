"""Reading a user's table of molecules in chunks: CSV/TSV/Parquet or a ``.smi`` file.

``iter_table`` yields pandas DataFrames of at most ``chunk_rows`` rows, so a caller such as
``smiexlm embed`` holds one chunk at a time, whatever the file size. Every way a file can be
unusable (missing, empty, header only, not UTF-8, truncated, not the format its suffix
says, no SMILES column) raises one :class:`~smiexlm.errors.DataError` naming the file and
the problem.

CSV/TSV cells are read as text exactly as written (``"007"`` stays ``"007"``, a blank cell
is ``""``), so id columns round-trip and a blank SMILES cell is an empty string, which the
featurizer reports as a failed row. A ``.smi`` line is ``SMILES [name]``, split by
:func:`~smiexlm.data.readers.split_smiles_line` as in preprocessing; blank lines are skipped.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

from smiexlm.data.readers import split_smiles_line
from smiexlm.errors import DataError
from smiexlm.paths import check_input_file

TABLE_SUFFIXES = (".csv", ".tsv", ".parquet", ".smi", ".txt")


def iter_table(path: Path, smiles_col: str, chunk_rows: int = 8192) -> Iterator[Any]:
    """DataFrames of up to ``chunk_rows`` rows of ``path``; at least one, none empty."""
    path = check_input_file(path)
    name = path.name.lower().removesuffix(".gz")
    if not name.endswith(TABLE_SUFFIXES):
        raise DataError(
            f"input {str(path)!r}: expected a .csv, .tsv, .parquet or .smi file (optionally .gz)"
        )
    if name.endswith(".parquet"):
        chunks = _parquet_chunks(path, chunk_rows)
    elif name.endswith((".csv", ".tsv")):
        chunks = _csv_chunks(path, "\t" if name.endswith(".tsv") else ",", chunk_rows)
    else:
        chunks = _smi_chunks(path, smiles_col, chunk_rows)
    seen = False
    try:
        for frame in chunks:
            if not seen and smiles_col not in frame.columns:
                raise DataError(
                    f"input {str(path)!r} has no column {smiles_col!r}: expected one of "
                    f"{list(frame.columns)[:20]} (choose it with --smiles-col)"
                )
            if len(frame):
                seen = True
                yield frame
    except UnicodeDecodeError as err:
        raise DataError(
            f"input {str(path)!r} is not UTF-8 text (byte {err.object[err.start : err.start + 1]!r} "
            f"at offset {err.start}): expected a CSV/TSV/.smi text file"
        ) from None
    except (EOFError, OSError, zlib.error, gzip.BadGzipFile) as err:
        raise DataError(f"input {str(path)!r} is unreadable or truncated: {err}") from None
    except _parse_errors() as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"input {str(path)!r} cannot be parsed: {first}") from None
    if not seen:
        raise DataError(f"input {str(path)!r} has no rows: expected at least one SMILES")


def read_table(path: Path, smiles_col: str) -> Any:
    """The whole table as one DataFrame (for inputs that fit in memory)."""
    import pandas as pd

    return pd.concat(list(iter_table(path, smiles_col)), ignore_index=True)


def _parse_errors() -> tuple[type[BaseException], ...]:
    import pandas as pd

    errors: list[type[BaseException]] = [pd.errors.ParserError, pd.errors.EmptyDataError]
    try:
        import pyarrow as pa

        errors.append(pa.ArrowException)
    except ImportError:  # pragma: no cover - pyarrow comes with the Parquet support
        pass
    return tuple(errors)


def _csv_chunks(path: Path, sep: str, chunk_rows: int) -> Iterator[Any]:
    import pandas as pd

    try:
        reader = pd.read_csv(
            path, sep=sep, chunksize=chunk_rows, dtype=str, keep_default_na=False,
            encoding="utf-8-sig",
        )  # fmt: skip
    except pd.errors.EmptyDataError:
        raise DataError(
            f"input {str(path)!r} is empty: expected a header row and at least one SMILES"
        ) from None
    with reader:
        yield from reader


def _smi_chunks(path: Path, smiles_col: str, chunk_rows: int) -> Iterator[Any]:
    import pandas as pd

    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        while lines := list(islice(handle, chunk_rows)):
            rows = [split_smiles_line(line) for line in lines]
            rows = [row for row in rows if row[0]]
            yield pd.DataFrame({smiles_col: [r[0] for r in rows], "name": [r[1] for r in rows]})


def _parquet_chunks(path: Path, chunk_rows: int) -> Iterator[Any]:
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises several types for a file that is not Parquet
        raise DataError(f"input {str(path)!r} is not a readable Parquet file: {err}") from None
    for batch in handle.iter_batches(batch_size=chunk_rows):
        yield batch.to_pandas()
