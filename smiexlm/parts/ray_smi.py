"""Ray Data's reader of SMILES files for ``--ray``: the lines of each file as a run without
Ray reads them, streamed in blocks.

Ray's own ``read_text`` reads a whole file into one block and splits it with
``str.splitlines``, which also ends a line at a form feed, a lone carriage return or a
Unicode line separator: a file of 10^8 molecules would sit whole in one process, and a line
holding such a character would become two rows that a run without Ray reads as one. Here a
file is read a mebibyte at a time and split at ``\\n`` only (as
:func:`~smiexlm.data.readers.iter_smiles` splits it), the byte-order mark of its first line
dropped, and a line that is not UTF-8 is the same DataError, naming the file and the line.
Imported only where Ray is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from ray.data.datasource import FileBasedDatasource

from smiexlm.data.read_errors import decode_line
from smiexlm.data.readers import BOM

BLOCK_LINES = 65536  # lines of one block
READ_BYTES = 1 << 20  # bytes read at a time


class SmiLines(FileBasedDatasource):
    """The lines of SMILES files (``ray.data.read_datasource(SmiLines(paths, ...))``): one
    ``text`` column, a row a line, in the files' order; blank lines kept, as the reader
    without Ray yields them, for the caller to drop."""

    def _read_stream(self, f: Any, path: str) -> Iterator[pa.Table]:
        lines = []
        for number, raw in enumerate(_raw_lines(f), start=1):
            if number == 1 and raw.startswith(BOM):
                raw = raw[len(BOM) :]
            lines.append(decode_line(raw, number, Path(path), "input"))
            if len(lines) == BLOCK_LINES:
                yield pa.table({"text": pa.array(lines, pa.string())})
                lines = []
        if lines:
            yield pa.table({"text": pa.array(lines, pa.string())})


def _raw_lines(f: Any) -> Iterator[bytes]:
    """Each line of the stream ``f`` without its ``\\n``; a last line without one too."""
    rest = b""
    while data := f.read(READ_BYTES):
        *whole, rest = (rest + data).split(b"\n")
        yield from whole
    if rest:
        yield rest
