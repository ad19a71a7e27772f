"""The finished cells of a Repeated MLM grid (:mod:`smiexlm.analysis.repeated_mlm`), kept so
that a stopped grid goes on where it stopped.

A cell that has been trained, measured and fine-tuned writes ``cells/k<k>_p<p>/cell.json``:
its row of the grid and what made it (the settings of the grid that decide a cell's numbers,
its k and p, and the sha256 of the dataset's manifest). Run again with ``resume``, a cell
whose record says the same is read back, not trained again; one made otherwise is refused,
naming the setting. Without ``resume``, a folder that holds a finished cell is refused, as
``finetune`` refuses a folder that holds its runs. A cell stopped before its record was written
is trained again from its start.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any

from smiexlm.errors import DataError
from smiexlm.paths import file_sha256, json_safe, read_json_file, write_json

CELL_NAME = "cell.json"
CELL_FORMAT = "smiexlm-repeated-mlm-cell/1"
#: settings of the grid that decide no cell's numbers: which cells there are, where it runs
_NOT_A_CELLS = frozenset({"ks", "ps", "min_ratio", "device", "keep_data"})


def cell_dir(out_dir: Path, k: int, p: float) -> Path:
    return Path(out_dir) / "cells" / f"k{k}_p{p:g}"


def identity(config: Any, data_dir: Path) -> dict[str, Any]:
    """What every cell's numbers depend on: ``config``'s settings (a
    :class:`~smiexlm.analysis.repeated_mlm.RepeatedMLMConfig`) but those of the grid as a
    whole, and the dataset's content; a cell adds its k and p."""
    settings = {key: value for key, value in asdict(config).items() if key not in _NOT_A_CELLS}
    manifest = file_sha256(Path(data_dir) / "manifest.json")
    return json_safe(settings | {"data_manifest_sha256": manifest})


def check_fresh(out_dir: Path, cells: list[tuple[int, float]]) -> None:
    """Refuse a grid folder that holds a finished cell of ``cells`` unless asked to resume."""
    for k, p in cells:
        record = cell_dir(out_dir, k, p) / CELL_NAME
        if record.is_file():
            raise DataError(
                f"--out {str(out_dir)!r} holds the finished cell k={k} p={p:g} "
                f"({str(record)!r}): pass --resume to keep it and go on, or give another --out"
            )


def finished_row(out_dir: Path, k: int, p: float, expected: dict[str, Any]) -> dict | None:
    """The row of the finished cell (k, p), when it was made as ``expected`` says; None when
    it has not finished; DataError naming the first setting that differs otherwise."""
    record = cell_dir(out_dir, k, p) / CELL_NAME
    if not record.is_file():
        return None
    _, doc = read_json_file(record, "Repeated MLM cell", CELL_FORMAT)
    made = doc.get("identity", {})
    for key, want in expected.items():
        if made.get(key) != want:
            raise DataError(
                f"cell {str(record)!r} was made with {key} = {made.get(key)!r}, but this grid "
                f"asks for {key} = {want!r}: give another --out, or the settings it was made with"
            )
    return {key: math.nan if value is None else value for key, value in doc["row"].items()}


def keep_row(out_dir: Path, k: int, p: float, identity_doc: dict[str, Any], row: dict) -> None:
    """Write the finished cell's record (atomically; NaN as null): from now on it is read
    back."""
    doc = {"format": CELL_FORMAT, "identity": identity_doc, "row": row}
    write_json(doc, cell_dir(out_dir, k, p) / CELL_NAME)
