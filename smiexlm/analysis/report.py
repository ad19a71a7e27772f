"""Writing an analysis's figures: a CSV of its rows (the JSON goes through
:func:`smiexlm.paths.write_json`)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from smiexlm.paths import json_safe


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
            writer.writerow({c: json_safe(row.get(c)) for c in columns})
    return path
