"""The record of a fine-tuned folder, ``finetune.json``, read and checked.

``predict`` trusts nothing it has not checked here: every key it reads is present and of the
right kind, and the sizes agree (one label, target mean and target std per output; a feature
scaler exactly when the head takes features). The weights are checked by
:func:`smiexlm.model.checkpoint.load_module_weights` and ``ExLMModel.from_pretrained``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from smiexlm.errors import DataError
from smiexlm.model.model import POOLINGS
from smiexlm.paths import read_json_file

TASK_TYPES = ("classification", "regression")


def read_finetune_meta(path: Path) -> dict[str, Any]:
    """``finetune.json`` as a dict; DataError naming the file, the key and what was expected."""
    path, meta = read_json_file(path, "fine-tuned model record")

    def bad(key: str, expected: str) -> DataError:
        value = meta.get(key, "missing")
        return DataError(f"{str(path)!r}: key {key!r} is {value!r}: expected {expected}")

    if meta.get("task_type") not in TASK_TYPES:
        raise bad("task_type", f"one of {TASK_TYPES}")
    if meta.get("pooling") not in POOLINGS:
        raise bad("pooling", f"one of {POOLINGS}")
    n = meta.get("n_outputs")
    if type(n) is not int or n < 1:
        raise bad("n_outputs", "a positive integer")
    labels = meta.get("label_cols")
    if (
        not isinstance(labels, list)
        or len(labels) != n
        or not all(isinstance(x, str) for x in labels)
    ):
        raise bad("label_cols", f"a list of n_outputs = {n} column names")
    for key in ("target_mean", "target_std"):
        values = meta.get(key)
        if not isinstance(values, list) or len(values) != n or not all(_finite(v) for v in values):
            raise bad(key, f"a list of n_outputs = {n} finite numbers")
    if not isinstance(meta.get("config"), dict):
        raise bad("config", "an object (the fine-tuning config)")
    n_features = meta.setdefault("n_features", 0)
    if type(n_features) is not int or n_features < 0:
        raise bad("n_features", "a non-negative integer")
    scaler = meta.get("feature_scaler")
    if (n_features > 0) != isinstance(scaler, dict):
        raise bad("feature_scaler", f"an object exactly when n_features ({n_features}) > 0")
    if scaler and not _scaler_fits(scaler, n_features):
        raise DataError(
            f"{str(path)!r}: key 'feature_scaler' is not a scaler of {n_features} features: "
            "expected 'kind', 'clip' and 'median', 'mean', 'std' lists of that length"
        )
    return meta


def _scaler_fits(scaler: dict, n_features: int) -> bool:
    arrays = [scaler.get(key) for key in ("median", "mean", "std")]
    sized = all(isinstance(a, list) and len(a) == n_features for a in arrays)
    return sized and isinstance(scaler.get("kind"), str) and _finite(scaler.get("clip"))


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
