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
MOVED: dict[str, str | tuple[str, ...]] = {
    "smiexlm.moleculenet.configs": "smiexlm.finetuning.config",
    # the layers drawn: loose modules grouped by layer (docs/architecture.md)
    "smiexlm.featurizer": "smiexlm.embedding.featurizer",
    "smiexlm.featurize_report": "smiexlm.embedding.report",
    "smiexlm.embed": "smiexlm.embedding.embed",
    "smiexlm.integrations": "smiexlm.embedding.integrations",
    "smiexlm.search": "smiexlm.embedding.search",
    "smiexlm.whitening.corpus": "smiexlm.embedding.whitening_fit",
    "smiexlm.whitening.file": "smiexlm.modelio.whitening_file",
    "smiexlm.serving.graph": "smiexlm.embedding.onnx_graph",
    "smiexlm.serving.onnx_export": "smiexlm.embedding.onnx_export",
    "smiexlm.serving.onnx_runtime": (
        "smiexlm.embedding.onnx_runtime",
        "smiexlm.serving.onnx_predictor",
    ),
    "smiexlm.fingerprints": "smiexlm.chemistry.fingerprints",
    "smiexlm.descriptor_stats": "smiexlm.chemistry.descriptor_stats",
    "smiexlm.chemistry_coverage": "smiexlm.chemistry.coverage",
    "smiexlm.lazy": "smiexlm.core.lazy",
    "smiexlm.demo": "smiexlm.cli.demo",
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: object = None, target: object = None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec) -> None:
        return None  # a plain module, filled by exec_module

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED[module.__name__]
        homes = (new,) if isinstance(new, str) else new  # a module split in two: both halves
        warnings.warn(f"{module.__name__} moved to {' and '.join(homes)}: import it from there "
                      "(the old path goes in a later release)", DeprecationWarning, stacklevel=2)  # fmt: skip
        for home in homes:
            target = importlib.import_module(home)
            module.__dict__.update(
                {k: v for k, v in vars(target).items() if not k.startswith("__")}
            )
        module.__doc__ = importlib.import_module(homes[0]).__doc__


def install() -> None:
    """Put the finder last on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Moved) for f in sys.meta_path):
        sys.meta_path.append(_Moved())
