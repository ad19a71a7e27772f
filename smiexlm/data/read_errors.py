"""How reading a user's file fails, said in one line naming it (the errors of
:mod:`smiexlm.data.readers`)."""

from __future__ import annotations

import csv
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from smiexlm.errors import DataError, first_line


def decode_line(raw: bytes, line: int, path: Path, what: str) -> str:
    """``raw`` (line ``line`` of ``path``) as text; a DataError naming both if not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"{what} {str(path)!r} line {line} is not UTF-8 text (byte offset {err.start}): "
            "expected one SMILES per line"
        ) from None


def empty_message(path: Path, what: str) -> str:
    return f"{what} {str(path)!r} is empty: expected a header row and at least one SMILES"


@contextmanager
def reading(path: Path, what: str) -> Iterator[None]:
    """Every way reading ``path`` fails, as one DataError naming the file."""
    try:
        yield
    except UnicodeDecodeError as err:
        raise DataError(
            f"{what} {str(path)!r} is not UTF-8 text (byte {err.object[err.start : err.start + 1]!r} "
            f"at offset {err.start}): expected a CSV/TSV/.smi text file"
        ) from None
    except (EOFError, OSError, zlib.error, csv.Error) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{what} {str(path)!r} is unreadable or truncated: {err}") from None
    except parse_errors() as err:
        raise DataError(f"{what} {str(path)!r} cannot be parsed: {first_line(err)}") from None


def parse_errors() -> tuple[type[BaseException], ...]:
    import pandas as pd
    import pyarrow as pa

    return (pd.errors.ParserError, pd.errors.EmptyDataError, pa.ArrowException)
