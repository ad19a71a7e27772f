"""What the featurizers take as SMILES: :func:`smiles_list` for
:meth:`~smiexlm.embedding.featurizer.Featurizer.featurize` (a sequence of SMILES, and nothing
that only looks like one), :func:`table_smiles` for the scikit-learn transformer (also the
one column of a table, as a pipeline hands it over)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from smiexlm.errors import DataError


def refuse_non_sequence(smiles: Any, who: str = "featurize") -> None:
    """DataError for one SMILES, or a table or a mapping (whose iteration gives its column
    names or keys), where a sequence of SMILES is expected (by ``who``)."""
    if isinstance(smiles, (str, bytes)) or getattr(smiles, "ndim", 1) == 0:
        raise DataError(f"{who} expects a sequence of SMILES, got one {str(smiles)[:40]!r}: "
                        "wrap it in a list")  # fmt: skip
    if isinstance(smiles, Mapping) or getattr(smiles, "ndim", 1) > 1:
        kind = type(smiles).__name__
        raise DataError(f"{who} expects a sequence of SMILES, got a {kind} (it would be "
                        "read by its keys or column names): pass its SMILES column")  # fmt: skip


def smiles_list(smiles: Any, who: str = "featurize") -> list[Any]:
    """The SMILES of a list, tuple, iterator, 1-D array or Series; DataError for what
    :func:`refuse_non_sequence` refuses, or for what is no sequence at all."""
    refuse_non_sequence(smiles, who)
    if hasattr(smiles, "tolist") and hasattr(smiles, "dtype"):  # pandas Series, numpy array
        return list(smiles.tolist())
    try:
        return list(smiles)
    except TypeError:
        raise DataError(f"{who} expects a sequence of SMILES, got {type(smiles).__name__} "
                        f"{str(smiles)[:40]!r}") from None  # fmt: skip


def table_smiles(X: Any) -> list[Any]:
    """SMILES from a list, a 1-D array, a Series, or a one-column 2-D array / DataFrame."""
    if hasattr(X, "iloc") and getattr(X, "ndim", 1) == 2:  # DataFrame
        if X.shape[1] != 1:
            raise DataError(
                f"ExLMTransformer got a table with {X.shape[1]} columns: expected one SMILES "
                "column (select it, or use a ColumnTransformer)"
            )
        X = X.iloc[:, 0]
    if isinstance(X, np.ndarray) and X.ndim == 2:
        if X.shape[1] != 1:
            raise DataError(f"ExLMTransformer got an array of {X.shape[1]} columns: expected "
                            "one SMILES column (select it, or use a ColumnTransformer)")  # fmt: skip
        X = X[:, 0]
    return smiles_list([X] if isinstance(X, str) else X, "ExLMTransformer")
