"""Writing an analysis's figures: a CSV of its rows and a JSON with rows, settings and tables."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    """JSON-safe values: NaN/inf become null, Paths become strings."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_rows(rows: list[dict[str, Any]], path: Path) -> Path:
    """One CSV row per dict; columns in first-seen order across all rows."""
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _clean(row.get(c)) for c in columns})
    return path


def write_json(doc: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(doc), indent=1) + "\n")
    return path
