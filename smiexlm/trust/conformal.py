"""Split-conformal prediction sets (classification) and intervals (regression), per task,
calibrated on the validation split.

Scores. Classification: with ``p`` the predicted probability of class 1, the nonconformity
of class ``c`` is ``1 - P(c)``: ``s(x, 1) = 1 - p`` and ``s(x, 0) = p``, or ``(1 - P(c)) /
sigma`` when a difficulty ``sigma`` is given (normalised sets). Regression: ``|y - y_hat|``,
or ``|y - y_hat| / sigma`` when a spread ``sigma`` (e.g. the ensemble standard deviation) is
given (normalised intervals). :func:`difficulty` makes ``sigma`` of a blend's members: where
they disagree the molecule is hard, and its set or interval widens.

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

import logging
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from smiexlm.errors import ConfigError, check_choice
from smiexlm.trust.arrays import (
    as_2d,
    check_alpha,
    check_binary,
    check_positive_spread,
    check_probabilities,
    check_same_shape,
)
from smiexlm.trust.sets import Intervals, PredictionSets

if TYPE_CHECKING:
    from smiexlm.trust.shift import Shift

TooSmall = Literal["raise", "full"]
# alpha * (n + 1) is read to this absolute precision (0.29 * 100 is 28.999999999999996)
TOLERANCE = 1e-9
log = logging.getLogger(__name__)
_SAID: set[str] = set()  # each warning once a process (predict calibrates chunk by chunk)


def min_calibration(alpha: float) -> int:
    """The fewest calibration scores that give a finite threshold at ``alpha``."""
    alpha = check_alpha(alpha)
    return max(math.ceil((1.0 - TOLERANCE) / alpha) - 1, 1)


def conformal_quantile(scores: np.ndarray, alpha: float) -> float:
    """The threshold ``q`` of the module docstring over the 1-D ``scores`` (>= 0); ``inf``
    when there are fewer than :func:`min_calibration` of them."""
    from crepes import ConformalRegressor

    alpha = check_alpha(alpha)
    n = len(scores)
    m = math.floor(alpha * (n + 1) + TOLERANCE)
    if m < 1:
        return math.inf
    # crepes takes the int((1 - confidence)(n + 1))-th largest: give it the middle of the
    # step of m, where no rounding of 1 - (1 - alpha) can move it to a neighbour
    confidence = 1.0 - (m + 0.5) / (n + 1)
    fitted = ConformalRegressor().fit(np.asarray(scores, dtype=np.float64))
    return float(fitted.predict_int(np.zeros(1), confidence=confidence)[0, 1])


def checked_threshold(scores: np.ndarray, alpha: float, too_small: TooSmall, what: str) -> float:
    """:func:`conformal_quantile`, or (``too_small="raise"``) the ConfigError that says the
    minimum; ``what`` names the calibration scores (``task 0``)."""
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


def say_too_few(who: str, n: int, alpha: float, outcome: str, share: float | None = None) -> None:
    """Warn (once a process) that ``who``'s ``n`` calibration molecules are too few for
    ``alpha``, so that ``outcome``; ``share``: of the molecules, where a distance bin or the
    weights did it (None: split conformal, every molecule)."""
    need = min_calibration(alpha)
    if share is None:
        larger = f"a larger alpha (at least 1/(n + 1) = {1 / (n + 1):.3g}) or " if n else ""
        message = (f"conformal alpha {alpha:g}: {who} has {n} calibration molecule(s) (its "
                   f"labelled validation molecules) and needs at least {need} at that alpha, "
                   f"so {outcome}; use {larger}more validation molecules")  # fmt: skip
    else:
        message = (f"conformal alpha {alpha:g}: for {share:.0%} of the molecules, {who}'s "
                   f"calibration by distance bin or weight rests on too few of its {n} "
                   f"calibration molecules (at least {need} at that alpha), so {outcome} for "
                   "them; use a larger alpha or more validation molecules")  # fmt: skip
    if message not in _SAID:
        _SAID.add(message)
        log.warning("%s", message)


#: added to the members' disagreement, so that a molecule they agree on keeps a set of its
#: own size rather than one of zero width (crepes' default ``beta``, not tuned)
DIFFICULTY_FLOOR = 0.01


def difficulty(members: Sequence[np.ndarray], floor: float = DIFFICULTY_FLOOR) -> np.ndarray:
    """(N, T) float64 how hard each molecule is for a blend of ``members`` (each (N, T) scores
    of the same molecules, on their own scale: probabilities, or the label's units): their
    standard deviation (ddof 0) plus ``floor`` (> 0). NaN where a member's score is."""
    if len(members) < 2:
        raise ConfigError("members", len(members), "at least two, whose disagreement is measured")
    if not (isinstance(floor, (int, float)) and math.isfinite(floor) and floor > 0):
        raise ConfigError("floor", floor, "a finite number > 0")
    stacked = np.stack([as_2d("members", m) for m in members])
    return stacked.std(axis=0) + float(floor)


class ClassificationCalibrator:
    """Split-conformal sets for multi-label binary tasks, from the validation labels (N, T)
    (0/1, NaN = missing), the validation probabilities of class 1 (N, T) and, for normalised
    sets, the validation molecules' difficulty (N, T) (> 0, :func:`difficulty`).

    Building one only checks and keeps the arrays (:meth:`to_arrays`), so it is cheap and
    deterministic to rebuild at predict time; thresholds are computed per call. ``names``
    (one per task) name the tasks in its warnings."""

    def __init__(self, labels: object, scores: object, difficulty: object | None = None,
                 names: Sequence[str] | None = None):  # fmt: skip
        y, p = as_2d("labels", labels), as_2d("scores", scores)
        check_same_shape("scores", p, y.shape, "labels")
        check_binary("labels", y)
        check_probabilities("scores", p)
        _check_scored(y, p)
        self.labels, self.scores, self.names = y, p, names
        self.difficulty = _checked_spread("difficulty", difficulty, y.shape, ~np.isnan(y))

    @property
    def n_tasks(self) -> int:
        return self.labels.shape[1]

    @property
    def normalised(self) -> bool:
        return self.difficulty is not None

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The arrays it is rebuilt from: ``labels``, ``scores`` and, when normalised,
        ``difficulty`` (float64, (N, T))."""
        arrays = {"labels": self.labels, "scores": self.scores}
        return arrays | ({"difficulty": self.difficulty} if self.normalised else {})

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray]) -> ClassificationCalibrator:
        return cls(_array(arrays, "labels"), _array(arrays, "scores"), arrays.get("difficulty"))

    def _calibration(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Task ``t``'s calibration scores ``1 - P(true class)`` (over the difficulty when
        normalised) and their classes."""
        known = ~np.isnan(self.labels[:, t])
        y, p = self.labels[known, t], self.scores[known, t]
        scores = np.where(y == 1, 1.0 - p, p)
        if self.difficulty is not None:
            scores = scores / self.difficulty[known, t]
        return scores, y.astype(int)

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
                out[t] = checked_threshold(scores, alpha, too_small, f"task {t}")
                continue
            for c in (0, 1):
                out[t, c] = checked_threshold(scores[classes == c], alpha, too_small,
                                       f"class {c} of task {t}")  # fmt: skip
        return out

    def sets(
        self, scores: object, alpha: float, mondrian: bool = False, too_small: TooSmall = "raise",
        shift: Shift | None = None, difficulty: object | None = None,
    ) -> PredictionSets:  # fmt: skip
        """The set of each molecule and task for probabilities ``scores`` (N, T); with
        ``shift``, each molecule's threshold is its bin's or its weighted one (:class:`~smiexlm.trust.shift.Shift`);
        ``difficulty`` (N, T): each molecule's, required when the calibrator is normalised
        and refused otherwise."""
        p = self._test_scores(scores)
        nonconformity = _class_scores(p) / self._query_difficulty(difficulty, p)[..., None]
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
        if too_small == "full":
            self._say_too_few(q, float(alpha), mondrian, shift is not None)
        members = (nonconformity <= q) & defined[..., None]
        return PredictionSets(members, defined, float(alpha), mondrian)

    def _say_too_few(self, q: np.ndarray, alpha: float, mondrian: bool, shifted: bool) -> None:
        """Warn for each task (class) whose threshold ``q`` (M, T, 2) is infinite somewhere:
        that class is then in every set (both are, but with ``mondrian``)."""
        for t in range(self.n_tasks):
            classes = self._calibration(t)[1]
            for c in (0, 1) if mondrian else (0,):
                infinite = np.isinf(q[:, t, c])
                if infinite.any():
                    who = _task_name(self.names, t)
                    n = int((classes == c).sum()) if mondrian else len(classes)
                    say_too_few(f"class {c} of {who}" if mondrian else who, n, alpha,
                                f"class {c} is in every set" if mondrian else "its sets hold "
                                "both classes", float(infinite.mean()) if shifted else None)  # fmt: skip

    def p_values(self, scores: object, mondrian: bool = False,
                 difficulty: object | None = None) -> np.ndarray:  # fmt: skip
        """(N, T, 2) conformal p-values of class 0 and class 1 (crepes, not smoothed: the
        share of calibration scores at least as large, counting the molecule itself); NaN
        where the score is NaN. Class ``c`` is in the set at ``alpha`` when its p-value
        exceeds ``alpha``. One p-value at a time: slow for many molecules."""
        from crepes import ConformalClassifier

        p = self._test_scores(scores)
        scale = np.nan_to_num(self._query_difficulty(difficulty, p), nan=1.0)
        nonconformity = _class_scores(np.nan_to_num(p)) / scale[..., None]
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

    def _query_difficulty(self, difficulty: object | None, p: np.ndarray) -> np.ndarray:
        """The query molecules' difficulty (ones when not normalised); ConfigError when it is
        given and the calibration was not normalised, or the other way round."""
        _check_given("difficulty", difficulty, self.normalised)
        if difficulty is None:
            return np.ones(p.shape)
        return _checked_spread("difficulty", difficulty, p.shape, ~np.isnan(p))


class RegressionCalibrator:
    """Split-conformal intervals for regression tasks, from the validation labels (N, T)
    (NaN = missing), the validation predictions (N, T) and, for normalised intervals, the
    validation spread (N, T) of each prediction (> 0). Cheap to build, like
    :class:`ClassificationCalibrator`; ``names`` (one per task) name the tasks in its
    warnings."""

    def __init__(self, labels: object, scores: object, spread: object | None = None,
                 names: Sequence[str] | None = None):  # fmt: skip
        y, v = as_2d("labels", labels), as_2d("scores", scores)
        check_same_shape("scores", v, y.shape, "labels")
        _check_scored(y, v)
        self.labels, self.scores, self.names = y, v, names
        self.spread = _checked_spread("spread", spread, y.shape, ~np.isnan(y))

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
            out[t] = checked_threshold(self._calibration(t)[0], alpha, too_small, f"task {t}")
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
        each molecule's half-width is its bin's or its weighted one (:class:`~smiexlm.trust.shift.Shift`)."""
        v = _check_tasks(as_2d("scores", scores), self.n_tasks)
        if shift is None:
            half = self.quantiles(alpha, too_small)[None, :]  # (1, T)
        else:
            half = np.empty(v.shape)
            for t in range(self.n_tasks):
                half[:, t] = shift.thresholds(*self._calibration(t), alpha, len(v), too_small)
        for t in np.flatnonzero(np.isinf(half).any(axis=0)) if too_small == "full" else ():
            say_too_few(_task_name(self.names, t), len(self._calibration(t)[1]), float(alpha),
                        "its intervals are (-inf, inf)",
                        None if shift is None else float(np.isinf(half[:, t]).mean()))  # fmt: skip
        _check_given("spread", spread, self.normalised)
        if spread is not None:
            half = half * _checked_spread("spread", spread, v.shape, ~np.isnan(v))
        return Intervals(v - half, v + half, float(alpha), self.spread is not None)


def _task_name(names: Sequence[str] | None, t: int) -> str:
    return f"task {t}" if names is None else f"task {names[t]!r}"


def _class_scores(p: np.ndarray) -> np.ndarray:
    """(N, T, 2) nonconformity of class 0 (``p``) and class 1 (``1 - p``)."""
    return np.stack([p, 1.0 - p], axis=-1)


def _checked_spread(field: str, spread: object | None, shape: tuple[int, ...],
                    where: np.ndarray) -> np.ndarray | None:  # fmt: skip
    """``spread`` as a float64 array of ``shape``, finite and > 0 ``where`` True, or None."""
    if spread is None:
        return None
    s = as_2d(field, spread)
    check_same_shape(field, s, shape, "scores")
    check_positive_spread(field, s, where)
    return s


def _check_given(field: str, value: object | None, normalised: bool) -> None:
    """ConfigError unless ``value`` is given exactly when the calibration was normalised."""
    if (value is None) == normalised:
        need = f"a {field} (the calibration was normalised)" if normalised else "None"
        raise ConfigError(field, "None" if value is None else "an array", need)


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
