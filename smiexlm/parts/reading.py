"""Reading a complete folder of parts back: its manifest, its files (each checked against the
size and sha256 recorded when it was written), one table in input order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from smiexlm.errors import DataError
from smiexlm.paths import file_problem, read_json_file

MANIFEST = "manifest.json"
PARTS_FORMAT = "smiexlm-parts/1"


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a complete folder of parts; DataError for an unfinished one."""
    directory = Path(directory)
    if not (directory / MANIFEST).is_file():
        raise DataError(
            f"{str(directory)!r} has no {MANIFEST}: expected a folder of parts written by "
            "`smiexlm embed`/`predict` with a folder --out"
        )
    _, doc = read_json_file(directory / MANIFEST, "parts manifest", PARTS_FORMAT)
    if not doc.get("complete"):
        have = len(list(directory.glob("part-*.parquet")))
        raise DataError(
            f"parts folder {str(directory)!r} is unfinished ({have} parts written): run the "
            "same command again to resume it"
        )
    return doc


def part_files(directory: Path) -> list[Path]:
    """The Parquet files of a complete folder of parts, in input order, each checked against
    the size and sha256 its manifest records; DataError naming the first missing, truncated
    or damaged one."""
    directory = Path(directory)
    files = []
    for entry in read_manifest(directory)["parts"]:
        path = directory / entry["file"]
        problem = file_problem(path, entry)
        if problem:
            raise DataError(
                f"part {str(path)!r} {problem}: expected the part its folder's {MANIFEST} "
                "records; run the command that wrote the folder again to write it anew"
            )
        files.append(path)
    return files


def read_parts(directory: Path, columns: list[str] | None = None) -> Any:
    """The parts of ``directory`` as one ``pyarrow.Table``, in input order (``.to_pandas()``
    for a DataFrame); ``columns`` picks some columns."""
    import pyarrow.dataset as ds

    files = part_files(directory)
    return ds.dataset([str(f) for f in files], format="parquet").to_table(columns=columns)


def iter_parts(directory: Path, columns: list[str] | None = None) -> Iterator[Any]:
    """The parts of ``directory`` one ``pyarrow.Table`` at a time, in input order."""
    import pyarrow.parquet as pq

    for path in part_files(directory):
        yield pq.read_table(path, columns=columns)
