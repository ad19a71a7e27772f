"""Split-conformal prediction sets (classification) and intervals (regression), per task,
calibrated on the validation split.

Scores. Classification: with ``p`` the predicted probability of class 1, the nonconformity
of class ``c`` is ``1 - P(c)``: ``s(x, 1) = 1 - p`` and ``s(x, 0) = p``. Regression:
``|y - y_hat|``, or ``|y - y_hat| / sigma`` when a spread ``sigma`` (e.g. the ensemble
standard deviation) is given (normalised intervals).

Threshold. From the ``n`` calibration scores of a task (its labelled validation molecules;
those of one class only in the class-conditional, Mondrian, variant) ``q`` is the
``ceil((n + 1)(1 - alpha))``-th smallest, that is the ``m``-th largest with
``m = floor(alpha (n + 1))``; crepes computes it. A class is in a molecule's set when its
score is at most ``q``; the interval is ``y_hat -/+ q`` (times ``sigma``). ``m >= 1`` needs
at least :func:`min_calibration` scores (``ceil(1 / alpha) - 1``): with fewer, only the
trivial set ``{0, 1}`` or the infinite interval is valid.

Guarantee. When the calibration and test molecules are exchangeable, the label lies in its
set (interval) with probability at least ``1 - alpha`` and, without tied scores, at most
``1 - alpha + 1 / (n + 1)``: marginally, over the draw of both, not for each molecule. The
Mondrian variant holds the same bounds within each class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from smiexlm.errors import ConfigError, check_choice
from smiexlm.trust.arrays import (
    PerTask,
    as_2d,
    check_alpha,
    check_binary,
    check_positive_spread,
    check_probabilities,
    check_same_shape,
    per_task,
)

TooSmall = Literal["raise", "full"]
# alpha * (n + 1) is read to this absolute precision (0.29 * 100 is 28.999999999999996)
_TOLERANCE = 1e-9


def min_calibration(alpha: float) -> int:
    """The fewest calibration scores that give a finite threshold at ``alpha``."""
    alpha = check_alpha(alpha)
    return max(math.ceil((1.0 - _TOLERANCE) / alpha) - 1, 1)


def conformal_quantile(scores: np.ndarray, alpha: float) -> float:
    """The threshold ``q`` of the module docstring over the 1-D ``scores`` (>= 0); ``inf``
    when there are fewer than :func:`min_calibration` of them."""
    from crepes import ConformalRegressor

    alpha = check_alpha(alpha)
    n = len(scores)
    m = math.floor(alpha * (n + 1) + _TOLERANCE)
    if m < 1:
        return math.inf
    # crepes takes the int((1 - confidence)(n + 1))-th largest: give it the middle of the
    # step of m, where no rounding of 1 - (1 - alpha) can move it to a neighbour
    confidence = 1.0 - (m + 0.5) / (n + 1)
    fitted = ConformalRegressor().fit(np.asarray(scores, dtype=np.float64))
    return float(fitted.predict_int(np.zeros(1), confidence=confidence)[0, 1])


def _threshold(scores: np.ndarray, alpha: float, too_small: TooSmall, what: str) -> float:
    """:func:`conformal_quantile`, or the ConfigError that says the minimum."""
    q = conformal_quantile(scores, alpha)
    if math.isinf(q) and too_small == "raise":
        n = len(scores)
        raise ConfigError(
            "alpha", alpha,
            f"at least 1/(n + 1) = {1 / (n + 1):.3g} for {what}, which has n = {n} "
            f"calibration scores; alpha = {alpha:g} needs at least {min_calibration(alpha)} "
            "(or ask too_small='full' for the trivial set)",
        )  # fmt: skip
    return q


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


class ClassificationCalibrator:
    """Split-conformal sets for multi-label binary tasks, from the validation labels (N, T)
    (0/1, NaN = missing) and the validation probabilities of class 1 (N, T).

    Building one only checks and keeps the two arrays (:meth:`to_arrays`), so it is cheap and
    deterministic to rebuild at predict time; thresholds are computed per call."""

    def __init__(self, labels: object, scores: object):
        y, p = as_2d("labels", labels), as_2d("scores", scores)
        check_same_shape("scores", p, y.shape, "labels")
        check_binary("labels", y)
        check_probabilities("scores", p)
        _check_scored(y, p)
        self.labels, self.scores = y, p

    @property
    def n_tasks(self) -> int:
        return self.labels.shape[1]

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The arrays it is rebuilt from: ``labels`` and ``scores`` (float64, (N, T))."""
        return {"labels": self.labels, "scores": self.scores}

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> ClassificationCalibrator:
        return cls(_array(arrays, "labels"), _array(arrays, "scores"))

    def _calibration(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Task ``t``'s calibration scores ``1 - P(true class)`` and their classes."""
        known = ~np.isnan(self.labels[:, t])
        y, p = self.labels[known, t], self.scores[known, t]
        return np.where(y == 1, 1.0 - p, p), y.astype(int)

    def thresholds(
        self, alpha: float, mondrian: bool = False, too_small: TooSmall = "raise"
    ) -> np.ndarray:
        """(T, 2): the threshold of class 0 and of class 1 for each task (the same two when
        not ``mondrian``); ``inf`` where too few scores and ``too_small="full"``."""
        alpha = check_alpha(alpha)
        check_choice("too_small", too_small, ("raise", "full"))
        out = np.empty((self.n_tasks, 2))
        for t in range(self.n_tasks):
            scores, classes = self._calibration(t)
            if not mondrian:
                out[t] = _threshold(scores, alpha, too_small, f"task {t}")
                continue
            for c in (0, 1):
                out[t, c] = _threshold(scores[classes == c], alpha, too_small,
                                       f"class {c} of task {t}")  # fmt: skip
        return out

    def sets(
        self, scores: object, alpha: float, mondrian: bool = False, too_small: TooSmall = "raise"
    ) -> PredictionSets:
        """The set of each molecule and task for probabilities ``scores`` (N, T)."""
        p = self._test_scores(scores)
        q = self.thresholds(alpha, mondrian, too_small)  # (T, 2)
        nonconformity = _class_scores(p)  # (N, T, 2)
        defined = ~np.isnan(p)
        members = (nonconformity <= q[None]) & defined[..., None]
        return PredictionSets(members, defined, float(alpha), mondrian)

    def p_values(self, scores: object, mondrian: bool = False) -> np.ndarray:
        """(N, T, 2) conformal p-values of class 0 and class 1 (crepes, not smoothed: the
        share of calibration scores at least as large, counting the molecule itself); NaN
        where the score is NaN. Class ``c`` is in the set at ``alpha`` when its p-value
        exceeds ``alpha``. One p-value at a time: slow for many molecules."""
        from crepes import ConformalClassifier

        p = self._test_scores(scores)
        nonconformity = _class_scores(np.nan_to_num(p))
        out = np.empty(nonconformity.shape)
        for t in range(self.n_tasks):
            cal, classes = self._calibration(t)
            fitted = ConformalClassifier().fit(cal, bins=classes if mondrian else None)
            if not mondrian:
                out[:, t] = fitted.predict_p(nonconformity[:, t], smoothing=False)
                continue
            for c in (0, 1):
                bins = np.full(len(p), c)
                out[:, t, c] = fitted.predict_p(nonconformity[:, t, c], bins=bins,
                                                smoothing=False)  # fmt: skip
        return np.where(np.isnan(p)[..., None], np.nan, out)

    def _test_scores(self, scores: object) -> np.ndarray:
        p = _check_tasks(as_2d("scores", scores), self.n_tasks)
        check_probabilities("scores", p)
        return p


class RegressionCalibrator:
    """Split-conformal intervals for regression tasks, from the validation labels (N, T)
    (NaN = missing), the validation predictions (N, T) and, for normalised intervals, the
    validation spread (N, T) of each prediction (> 0). Cheap to build, like
    :class:`ClassificationCalibrator`."""

    def __init__(self, labels: object, scores: object, spread: object | None = None):
        y, v = as_2d("labels", labels), as_2d("scores", scores)
        check_same_shape("scores", v, y.shape, "labels")
        _check_scored(y, v)
        s = None
        if spread is not None:
            s = as_2d("spread", spread)
            check_same_shape("spread", s, y.shape, "labels")
            check_positive_spread("spread", s, ~np.isnan(y))
        self.labels, self.scores, self.spread = y, v, s

    @property
    def n_tasks(self) -> int:
        return self.labels.shape[1]

    @property
    def normalised(self) -> bool:
        return self.spread is not None

    def to_arrays(self) -> dict[str, np.ndarray]:
        """``labels``, ``scores`` and, when normalised, ``spread`` (float64, (N, T))."""
        arrays = {"labels": self.labels, "scores": self.scores}
        return arrays | ({"spread": self.spread} if self.spread is not None else {})

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> RegressionCalibrator:
        spread = arrays.get("spread")
        return cls(_array(arrays, "labels"), _array(arrays, "scores"), spread)

    def quantiles(self, alpha: float, too_small: TooSmall = "raise") -> np.ndarray:
        """(T,) half-widths ``q``: in the labels' units, or in spreads when normalised."""
        alpha = check_alpha(alpha)
        check_choice("too_small", too_small, ("raise", "full"))
        out = np.empty(self.n_tasks)
        for t in range(self.n_tasks):
            known = ~np.isnan(self.labels[:, t])
            residual = np.abs(self.labels[known, t] - self.scores[known, t])
            if self.spread is not None:
                residual = residual / self.spread[known, t]
            out[t] = _threshold(residual, alpha, too_small, f"task {t}")
        return out

    def intervals(
        self,
        scores: object,
        alpha: float,
        spread: object | None = None,
        too_small: TooSmall = "raise",
    ) -> Intervals:
        """``scores`` (N, T) -/+ the task's half-width (times ``spread`` (N, T) when the
        calibrator is normalised: then it is required, otherwise refused)."""
        v = _check_tasks(as_2d("scores", scores), self.n_tasks)
        half = self.quantiles(alpha, too_small)[None, :]  # (1, T)
        if (spread is None) != (self.spread is None):
            need = "a spread (the calibration was normalised)" if spread is None else "None"
            raise ConfigError("spread", "None" if spread is None else "an array", need)
        if spread is not None:
            s = as_2d("spread", spread)
            check_same_shape("spread", s, v.shape, "scores")
            check_positive_spread("spread", s, ~np.isnan(v))
            half = half * s
        return Intervals(v - half, v + half, float(alpha), self.spread is not None)


def _class_scores(p: np.ndarray) -> np.ndarray:
    """(N, T, 2) nonconformity of class 0 (``p``) and class 1 (``1 - p``)."""
    return np.stack([p, 1.0 - p], axis=-1)


def _check_tasks(scores: np.ndarray, n_tasks: int) -> np.ndarray:
    """``scores`` when it has one column per calibrated task; ConfigError otherwise."""
    if scores.shape[1] != n_tasks:
        raise ConfigError("scores", f"{scores.shape[1]} task column(s)",
                          f"{n_tasks}, one per task of the calibration")  # fmt: skip
    return scores


def _check_scored(labels: np.ndarray, scores: np.ndarray) -> None:
    """ConfigError when a labelled calibration molecule has no score."""
    bad = ~np.isnan(labels) & ~np.isfinite(scores)
    if bad.any():
        row, task = (int(i) for i in np.argwhere(bad)[0])
        raise ConfigError("scores", float(scores[row, task]),
                          f"a finite score for every labelled molecule (row {row}, task {task})")  # fmt: skip


def _array(arrays: Mapping[str, np.ndarray], key: str) -> np.ndarray:
    if key not in arrays:
        raise ConfigError("arrays", sorted(arrays), f"a mapping with the key {key!r}")
    return arrays[key]


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
