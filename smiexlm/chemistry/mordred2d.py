"""Mordred's 2D descriptors (``preprocess --descriptors mordred``), the wider regression target.

About 1,600 descriptors a molecule (mordredcommunity's ``Calculator`` with its 3D ones left
out), where RDKit's 2D set has about 200: autocorrelations, topological charge and distance
indices, fragment and ring counts, information contents. They cost more too: about 10
molecules a CPU second on a MOSES molecule, against about 140 for RDKit's. Mordred is an
optional extra (``pip install 'smiexlm[mordred]'``), imported inside the functions.

A value Mordred cannot compute (its ``Missing`` and ``Error`` results) is NaN, as is a value
beyond ``DESCRIPTOR_LIMIT``; a SMILES RDKit cannot parse gets a row of NaN. Booleans are 0/1.
"""

from __future__ import annotations

import functools
import numbers
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np

from smiexlm.errors import ConfigError

INSTALL_HINT = "pip install 'smiexlm[mordred]'"


@functools.cache
def _calculator() -> Any:
    try:
        from mordred import Calculator, descriptors
    except ImportError:
        raise ConfigError(
            "descriptors", "mordred", f"mordredcommunity installed ({INSTALL_HINT})"
        ) from None
    return Calculator(descriptors, ignore_3D=True)


def mordred_names() -> list[str]:
    """The columns, in the calculator's order (``ABC``, ``ABCGG``, ``nAcid``, ...)."""
    return [str(d) for d in _calculator().descriptors]


def mordred_version() -> str:
    """The library's version, which decides the columns and their values."""
    from importlib.metadata import version

    _calculator()
    return f"mordredcommunity {version('mordredcommunity')}"


def mordred_descriptors(mols: Iterable[Any], n: int, limit: float) -> np.ndarray:
    """(n, D) float64 Mordred 2D descriptors of the RDKit molecules ``mols`` (``n`` of them,
    parsed one at a time by the caller), NaN where not computable or beyond ±``limit``, and a
    row of NaN for a molecule that is None (a SMILES RDKit cannot parse)."""
    calc = _calculator()
    out = np.full((n, len(calc.descriptors)), np.nan)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # numpy's, from descriptors of odd molecules
        for i, mol in enumerate(mols):
            if mol is None:
                continue
            # Missing and Error results are objects, not numbers: they stay NaN
            out[i] = [v if isinstance(v, (numbers.Real, np.bool_)) else np.nan
                      for v in calc(mol)]  # fmt: skip
    with np.errstate(invalid="ignore"):
        out[~(np.abs(out) <= limit)] = np.nan  # inf and beyond the limit
    return out
