"""Module paths that moved to another layer, still importable for one release.

``import smiexlm.moleculenet.configs`` (a path users may have written) finds the module under
its new name, warns once with a :class:`DeprecationWarning` naming it, and gives a module that
holds the same objects (``FinetuneConfig`` is the one class either way). One finder serves
every move of :data:`MOVED`; it is asked only after the real modules were not found.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

#: old module path -> where it lives now (the old path goes in the release after the next)
MOVED = {"smiexlm.moleculenet.configs": "smiexlm.finetuning.config"}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: object = None, target: object = None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec) -> None:
        return None  # a plain module, filled by exec_module

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED[module.__name__]
        warnings.warn(f"{module.__name__} moved to {new}: import it from there (the old path "
                      "goes in a later release)", DeprecationWarning, stacklevel=2)  # fmt: skip
        target = importlib.import_module(new)
        module.__dict__.update({k: v for k, v in vars(target).items() if not k.startswith("__")})
        module.__doc__ = target.__doc__


def install() -> None:
    """Put the finder last on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Moved) for f in sys.meta_path):
        sys.meta_path.append(_Moved())
