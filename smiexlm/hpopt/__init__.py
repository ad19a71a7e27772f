"""Hyper-parameter search for MoleculeNet fine-tuning on Optuna: pruned, resumable, budgeted,
and blind to the test split.

``run`` (:func:`run_hpopt`, the search from start to end) over ``search`` (the budget, the
space and one trial), ``study`` (the Optuna study in its SQLite file) and ``report`` (what
the search leaves in its folder); ``config`` (:class:`HpoptConfig`, the search's settings).
``from smiexlm.hpopt import run_hpopt, HpoptConfig`` is the entry point; names load lazily.
"""

from __future__ import annotations

from smiexlm.core.lazy import lazy_names

_LAZY = {"run_hpopt": "smiexlm.hpopt.run", "HpoptConfig": "smiexlm.hpopt.config"}

__all__ = sorted(_LAZY)

__getattr__ = lazy_names(__name__, _LAZY)
