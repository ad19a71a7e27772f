"""Reading a complete folder of parts back: its manifest, its files, one table in input order."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from smiexlm.errors import DataError
from smiexlm.paths import read_json_file

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
    """The Parquet files of a complete folder of parts, in input order."""
    directory = Path(directory)
    files = [directory / p["file"] for p in read_manifest(directory)["parts"]]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise DataError(f"parts folder {str(directory)!r} lacks {missing[:5]}: expected every "
                        "part its manifest lists")  # fmt: skip
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
