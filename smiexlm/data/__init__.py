"""Corpus pipeline: raw SMILES -> deduplicated, sharded uint16 token datasets, and readers.

``preprocess`` builds a dataset folder; ``TokenDataset`` reads one split with random access;
``TokenBudgetSampler`` batches by token budget; ``collate`` pads a batch. Names load lazily.
:mod:`smiexlm.data.readers` reads every table of molecules the package is given.
"""

from __future__ import annotations

from smiexlm.core.lazy import lazy_names

_LAZY = {
    "preprocess": "smiexlm.data.pipeline",
    "PreprocessConfig": "smiexlm.data.pipeline",
    "PreprocessResult": "smiexlm.data.pipeline",
    "TokenDataset": "smiexlm.data.shards",
    "TokenBudgetSampler": "smiexlm.data.sampler",
    "HashSet64": "smiexlm.data.dedup",
}

# Eager: the submodule of the same name would otherwise shadow the function.
from smiexlm.data.collate import collate  # noqa: E402

__all__ = [*_LAZY, "collate"]

__getattr__ = lazy_names(__name__, _LAZY)
