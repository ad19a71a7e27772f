"""Where smiexlm finds data and caches.

``SMIEXLM_DATA`` points at a folder laid out like the project's shared data
(``moleculenet/``, ``pretrain/``, ``glue/``, ``text/``). ``SMIEXLM_CACHE`` (default
``~/.cache/smiexlm``) holds downloads made when online.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from smiexlm.errors import DataError

PACKAGE_DIR = Path(__file__).resolve().parent
ASSETS_DIR = PACKAGE_DIR / "assets"


def data_dir(required: bool = True) -> Path | None:
    """The folder named by ``SMIEXLM_DATA``, or None when it is unset and not required."""
    value = os.environ.get("SMIEXLM_DATA")
    if not value:
        if required:
            raise DataError(
                "SMIEXLM_DATA is not set: expected the path of a data folder "
                "(moleculenet/, pretrain/, glue/, text/)"
            )
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DataError(f"SMIEXLM_DATA={value!r}: expected an existing directory")
    return path


def cache_dir() -> Path:
    path = Path(os.environ.get("SMIEXLM_CACHE", Path.home() / ".cache" / "smiexlm")).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def read_json_file(
    path: str | Path, what: str, expected_format: str | None = None
) -> tuple[Path, dict[str, Any]]:
    """``(path, document)`` of a JSON file; a folder means its ``vocab.json``.

    ``what`` names the file in errors ("vocabulary file"); a missing or malformed file, or a
    ``format`` other than ``expected_format``, raises DataError."""
    path = Path(path)
    if path.is_dir():
        path = path / "vocab.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{what} {str(path)!r} does not exist") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{what} {str(path)!r} is not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise DataError(f"{what} {str(path)!r}: expected a JSON object")
    if expected_format is not None and doc.get("format") != expected_format:
        raise DataError(
            f"{what} {str(path)!r} has format {doc.get('format')!r}: expected {expected_format!r}"
        )
    return path, doc


def json_safe(value: Any) -> Any:
    """JSON-safe values: NaN/inf become null, Paths become strings, tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(doc: dict[str, Any], path: str | Path) -> Path:
    """Write ``doc`` (made JSON-safe) as indented UTF-8 JSON, creating the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(doc), indent=1) + "\n", encoding="utf-8")
    return path
