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


#: ``predict --conformal-method``: today's split-conformal (``split``), class-conditional
#: (``class``), Mondrian by distance to the training set (``distance``), weighted by the
#: covariate shift between the calibration and the query molecules (``weighted``)
METHODS = ("split", "class", "distance", "weighted")
#: the most bins of the Mondrian calibration by distance
DISTANCE_BINS = 3


@dataclass(frozen=True)
class Shift:
    """How each query molecule's threshold departs from the one of split-conformal.

    ``bins``: (calibration bins (n,), query bins (N,)) int: Mondrian calibration, each query
    molecule's threshold from the calibration molecules of its bin alone. ``weights``:
    (calibration weights (n,), query weights (N,)) > 0: weighted split-conformal under
    covariate shift (Tibshirani et al., 2019), each query molecule's threshold the weighted
    ``1 - alpha`` quantile of the calibration scores with its own weight at infinity; the
    weights are the density ratio of query to calibration molecules. Indices given to
    :meth:`thresholds` select the calibration molecules of one task (those labelled)."""

    bins: tuple[np.ndarray, np.ndarray] | None = None
    weights: tuple[np.ndarray, np.ndarray] | None = None

    def thresholds(self, scores: np.ndarray, rows: np.ndarray, alpha: float, n_query: int,
                   too_small: TooSmall) -> np.ndarray:  # fmt: skip
        """(N,) each query molecule's threshold over calibration ``scores``, those of the
        calibration molecules ``rows``."""
        alpha = check_alpha(alpha)
        if self.bins is not None:
            cal, query = self.bins
            out = np.full(n_query, np.inf)
            for b in np.unique(query):
                out[query == b] = _threshold(scores[cal[rows] == b], alpha, too_small,
                                             f"distance bin {b}")  # fmt: skip
            return out
        cal_w, query_w = self.weights
        return weighted_thresholds(scores, cal_w[rows], query_w, alpha)


def weighted_thresholds(scores: np.ndarray, weights: np.ndarray, query_weights: np.ndarray,
                        alpha: float) -> np.ndarray:  # fmt: skip
    """(N,) for each query weight ``w``: the smallest calibration score whose weighted share,
    its own and the smaller ones' weights over the calibration weights plus ``w``, reaches
    ``1 - alpha``; ``inf`` when none does. Equal weights give :func:`conformal_quantile`."""
    if len(scores) == 0:
        return np.full(len(query_weights), np.inf)
    order = np.argsort(scores, kind="stable")
    ranked = np.asarray(scores, np.float64)[order]
    cum = np.cumsum(np.asarray(weights, np.float64)[order])
    need = (1.0 - alpha) * (cum[-1] + np.asarray(query_weights, np.float64))
    k = np.searchsorted(cum, need * (1.0 - _TOLERANCE), side="left")
    return np.where(k < len(ranked), ranked[np.minimum(k, len(ranked) - 1)], np.inf)


def distance_bins(calibration: np.ndarray, query: np.ndarray, alpha: float,
                  n_bins: int = DISTANCE_BINS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Mondrian bins by each molecule's nearest similarity to the training molecules:
    (calibration bins, query bins, inner edges). The edges are quantiles of the calibration
    molecules' similarities, at most ``n_bins`` bins of equal counts and fewer when a bin would
    hold fewer than twice :func:`min_calibration` molecules; bin 0 is the farthest. A query
    molecule below every calibration molecule falls in bin 0 (:func:`outside_calibration`)."""
    calibration = np.asarray(calibration, np.float64)
    fewest = 2 * min_calibration(alpha)
    n = max(1, min(n_bins, len(calibration) // max(fewest, 1)))
    edges = np.quantile(calibration, np.arange(1, n) / n) if n > 1 else np.zeros(0)
    return (np.searchsorted(edges, calibration, side="right"),
            np.searchsorted(edges, np.asarray(query, np.float64), side="right"), edges)  # fmt: skip


def outside_calibration(calibration: np.ndarray, query: np.ndarray) -> np.ndarray:
    """(N,) bool: the query molecule is farther from the training molecules (a lower nearest
    similarity) than every calibration molecule, where no calibration speaks for it."""
    return np.asarray(query, np.float64) < np.min(calibration)


def covariate_weights(calibration: np.ndarray, query: np.ndarray,
                      clip: tuple[float, float] = (0.05, 20.0)) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(calibration weights, query weights): the density ratio of query to calibration
    molecules at each, from a logistic regression telling the two apart on their features
    ((n, F) and (N, F): nearness to the training molecules), its odds times n / N, clipped to
    ``clip``. It depends on the query molecules given together: a batch, not one molecule."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    cal, que = np.asarray(calibration, np.float64), np.asarray(query, np.float64)
    x = np.concatenate([cal, que])
    side = np.r_[np.zeros(len(cal)), np.ones(len(que))]
    if len(que) < 2 or len(np.unique(side)) < 2:
        return np.ones(len(cal)), np.ones(len(que))
    scaler = StandardScaler().fit(x)
    model = LogisticRegression(C=1.0).fit(scaler.transform(x), side)

    def ratio(z: np.ndarray) -> np.ndarray:
        p = np.clip(model.predict_proba(scaler.transform(z))[:, 1], 1e-6, 1 - 1e-6)
        return np.clip(p / (1 - p) * len(cal) / len(que), *clip)

    return ratio(cal), ratio(que)


def method_shift(method: str, near_calibration: np.ndarray, near_query: np.ndarray,
                 alpha: float) -> tuple[Shift | None, np.ndarray | None]:  # fmt: skip
    """The :class:`Shift` of a ``method`` (:data:`METHODS`; None for ``split`` and ``class``)
    and the query molecules' distance bins (None unless ``distance``), from the nearness of
    the calibration and the query molecules to the training ones: (n,) or (n, F) arrays, the
    nearest Tanimoto similarity first (the bins read it alone)."""
    check_choice("conformal_method", method, METHODS)
    cal = np.asarray(near_calibration, np.float64).reshape(len(near_calibration), -1)
    query = np.asarray(near_query, np.float64).reshape(len(near_query), -1)
    if method == "distance":
        cal_bins, query_bins, _ = distance_bins(cal[:, 0], query[:, 0], alpha)
        return Shift(bins=(cal_bins, query_bins)), query_bins
    if method == "weighted":
        return Shift(weights=covariate_weights(cal, query)), None
    return None, None


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
        self, scores: object, alpha: float, mondrian: bool = False, too_small: TooSmall = "raise",
        shift: Shift | None = None,
    ) -> PredictionSets:  # fmt: skip
        """The set of each molecule and task for probabilities ``scores`` (N, T); with
        ``shift``, each molecule's threshold is its bin's or its weighted one (:class:`Shift`)."""
        p = self._test_scores(scores)
        nonconformity = _class_scores(p)  # (N, T, 2)
        defined = ~np.isnan(p)
        if shift is None:
            q = self.thresholds(alpha, mondrian, too_small)[None]  # (1, T, 2)
        else:
            q = np.empty((len(p), self.n_tasks, 2))
            for t in range(self.n_tasks):
                known = ~np.isnan(self.labels[:, t])
                cal, classes = self._calibration(t)
                for c in (0, 1):
                    keep = classes == c if mondrian else np.ones(len(cal), dtype=bool)
                    q[:, t, c] = shift.thresholds(cal[keep], np.flatnonzero(known)[keep], alpha,
                                                  len(p), too_small)  # fmt: skip
        members = (nonconformity <= q) & defined[..., None]
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
            out[t] = _threshold(self._calibration(t)[0], alpha, too_small, f"task {t}")
        return out

    def _calibration(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Task ``t``'s calibration scores, the absolute residuals of its labelled validation
        molecules (over their spread when normalised), and those molecules' rows."""
        known = ~np.isnan(self.labels[:, t])
        residual = np.abs(self.labels[known, t] - self.scores[known, t])
        if self.spread is not None:
            residual = residual / self.spread[known, t]
        return residual, np.flatnonzero(known)

    def intervals(
        self,
        scores: object,
        alpha: float,
        spread: object | None = None,
        too_small: TooSmall = "raise",
        shift: Shift | None = None,
    ) -> Intervals:
        """``scores`` (N, T) -/+ the task's half-width (times ``spread`` (N, T) when the
        calibrator is normalised: then it is required, otherwise refused); with ``shift``,
        each molecule's half-width is its bin's or its weighted one (:class:`Shift`)."""
        v = _check_tasks(as_2d("scores", scores), self.n_tasks)
        if shift is None:
            half = self.quantiles(alpha, too_small)[None, :]  # (1, T)
        else:
            half = np.empty(v.shape)
            for t in range(self.n_tasks):
                half[:, t] = shift.thresholds(*self._calibration(t), alpha, len(v), too_small)
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
