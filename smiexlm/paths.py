"""Where smiexlm finds data and caches.

``SMIEXLM_DATA`` points at a folder laid out like the project's shared data
(``moleculenet/``, ``pretrain/``, ``glue/``, ``text/``). ``SMIEXLM_CACHE`` (default
``~/.cache/smiexlm``) holds downloads made when online.
"""

from __future__ import annotations

import os
from pathlib import Path

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
