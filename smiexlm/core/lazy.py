"""Names a package imports on first use (PEP 562), so that importing it, and the CLI's start,
stay cheap: ``__getattr__ = lazy_names(__name__, {"Name": "package.module", ...})``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports each name of ``homes`` from its module when it is
    first asked for; AttributeError for any other name."""

    def __getattr__(name: str) -> Any:
        if name in homes:
            return getattr(importlib.import_module(homes[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
