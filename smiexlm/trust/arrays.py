"""Checks and a per-task summary shared by calibration and conformal prediction.

Arrays are ``(N, T)`` (molecules by tasks; a 1-D array is one task). A NaN label is a
missing label and is masked per task; a NaN score is a molecule without a prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from smiexlm.errors import ConfigError


@dataclass(frozen=True)
class PerTask:
    """A figure pooled over every counted (molecule, task) entry, the same per task (NaN for
    a task with no entry), and how many entries each task counted."""

    pooled: float
    per_task: np.ndarray  # (T,)
    count: np.ndarray  # (T,) int


def as_2d(field: str, values: object) -> np.ndarray:
    """``values`` as a float64 ``(N, T)`` array; ConfigError naming ``field`` otherwise."""
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(field, type(values).__name__, "an array of numbers") from None
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise ConfigError(field, f"shape {array.shape}", "an (N,) or (N, T) array")
    return array


def check_same_shape(field: str, array: np.ndarray, expected: tuple[int, ...], of: str) -> None:
    """ConfigError unless ``array`` has the shape ``expected`` (that of ``of``)."""
    if array.shape != tuple(expected):
        raise ConfigError(field, f"shape {array.shape}", f"the shape of {of}, {tuple(expected)}")


def check_binary(field: str, labels: np.ndarray) -> None:
    """ConfigError unless every non-NaN label is 0 or 1."""
    known = labels[~np.isnan(labels)]
    odd = known[(known != 0) & (known != 1)]
    if odd.size:
        raise ConfigError(field, float(odd[0]), "0 or 1 (NaN = missing label)")


def check_probabilities(field: str, probs: np.ndarray) -> None:
    """ConfigError unless every non-NaN value lies in [0, 1]."""
    known = probs[~np.isnan(probs)]
    odd = known[(known < 0) | (known > 1)]
    if odd.size:
        raise ConfigError(field, float(odd[0]), "probabilities in [0, 1] (NaN = no score)")


def check_alpha(alpha: object) -> float:
    """``alpha`` as a float when it lies strictly between 0 and 1; ConfigError otherwise."""
    ok = isinstance(alpha, (int, float, np.floating)) and not isinstance(alpha, bool)
    if not ok or not math.isfinite(float(alpha)) or not 0.0 < float(alpha) < 1.0:  # type: ignore[arg-type]
        raise ConfigError("alpha", alpha, "a number strictly between 0 and 1 (the error rate)")
    return float(alpha)  # type: ignore[arg-type]


def check_positive_spread(field: str, spread: np.ndarray, where: np.ndarray) -> None:
    """ConfigError unless ``spread`` is finite and > 0 wherever ``where`` is True."""
    bad = where & ~(np.isfinite(spread) & (spread > 0))
    if bad.any():
        row, task = (int(i) for i in np.argwhere(bad)[0])
        raise ConfigError(
            field, float(spread[row, task]),
            f"a finite spread > 0 for every scored molecule ({int(bad.sum())} are not; the "
            f"first is row {row}, task {task})",
        )  # fmt: skip


def per_task(values: np.ndarray, counted: np.ndarray) -> PerTask:
    """The mean of ``values`` (N, T) over the ``counted`` entries: pooled and per task."""
    count = counted.sum(axis=0).astype(np.int64)
    sums = np.where(counted, values, 0.0).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(count > 0, sums / np.maximum(count, 1), np.nan)
    pooled = float(sums.sum() / count.sum()) if count.sum() else math.nan
    return PerTask(pooled, means, count)
