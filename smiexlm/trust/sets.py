"""What conformal prediction gives (:mod:`smiexlm.trust.conformal`): sets of classes and
intervals of values, and what is measured of them against labels: coverage, mean set size,
mean interval width, pooled over tasks and per task."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smiexlm.trust.arrays import PerTask, as_2d, check_same_shape, per_task


@dataclass(frozen=True)
class PredictionSets:
    """Conformal sets of each molecule and task at ``alpha``.

    ``members`` (N, T, 2) bool: ``[..., c]`` is True when class ``c`` is in the set.
    ``defined`` (N, T) bool: False where the score was NaN (no prediction, no set)."""

    members: np.ndarray
    defined: np.ndarray
    alpha: float
    mondrian: bool

    @property
    def size(self) -> np.ndarray:
        """(N, T) set sizes 0, 1 or 2 (NaN where not defined)."""
        return np.where(self.defined, self.members.sum(axis=-1), np.nan)

    def labels(self) -> np.ndarray:
        """(N, T) strings ``"{0}"``, ``"{1}"``, ``"{0,1}"``, ``"{}"``; ``""`` where not
        defined, so that an empty set and a missing prediction stay apart in a CSV."""
        names = np.array(["{}", "{1}", "{0}", "{0,1}"], dtype=object)
        code = 2 * self.members[..., 0].astype(int) + self.members[..., 1].astype(int)
        return np.where(self.defined, names[code], "")


@dataclass(frozen=True)
class Intervals:
    """Conformal intervals ``[low, high]`` (N, T) at ``alpha``; NaN where there is no value."""

    low: np.ndarray
    high: np.ndarray
    alpha: float
    normalised: bool

    @property
    def width(self) -> np.ndarray:
        return self.high - self.low


def coverage(labels: object, predicted: PredictionSets | Intervals) -> PerTask:
    """The share of labelled entries whose label lies in its set (interval): pooled over
    tasks and per task. Entries without a label or a prediction are not counted."""
    if isinstance(predicted, PredictionSets):
        y = _labels_like(labels, predicted.defined.shape)
        counted = ~np.isnan(y) & predicted.defined
        cls = np.where(counted, y, 0).astype(int)
        hit = np.take_along_axis(predicted.members, cls[..., None], axis=-1)[..., 0]
    else:
        y = _labels_like(labels, predicted.low.shape)
        counted = ~np.isnan(y) & ~np.isnan(predicted.low)
        with np.errstate(invalid="ignore"):
            hit = (predicted.low <= y) & (y <= predicted.high)
    return per_task(hit.astype(np.float64), counted)


def mean_set_size(sets: PredictionSets, labels: object | None = None) -> PerTask:
    """The mean set size over the defined entries (only the labelled ones when ``labels``
    are given, to match :func:`coverage`)."""
    counted = sets.defined.copy()
    if labels is not None:
        counted &= ~np.isnan(_labels_like(labels, counted.shape))
    return per_task(np.nan_to_num(sets.size), counted)


def mean_width(intervals: Intervals, labels: object | None = None) -> PerTask:
    """The mean interval width over the entries with a value (only the labelled ones when
    ``labels`` are given)."""
    counted = ~np.isnan(intervals.low)
    if labels is not None:
        counted &= ~np.isnan(_labels_like(labels, counted.shape))
    return per_task(np.where(counted, intervals.width, 0.0), counted)


def _labels_like(labels: object, shape: tuple[int, ...]) -> np.ndarray:
    y = as_2d("labels", labels)
    check_same_shape("labels", y, shape, "the predictions")
    return y
