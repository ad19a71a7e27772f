"""Calibration under shift: how each query molecule's conformal threshold departs from the
one of split-conformal (:mod:`smiexlm.trust.conformal`), and the methods ``predict
--conformal-method`` chooses from.

Mondrian by distance: the calibration molecules fall in bins of their nearest similarity to
the training molecules, and each query molecule is calibrated on its bin's alone. Weighted
(Tibshirani et al., 2019): each calibration molecule weighs the density ratio of query to
calibration molecules at it, estimated from their nearness to the training molecules; the
threshold is the weighted ``1 - alpha`` quantile with the query molecule's own weight at
infinity. Normalised by difficulty (``difficulty``) changes the scores instead, not the
threshold: :func:`smiexlm.trust.conformal.difficulty`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smiexlm.errors import check_choice
from smiexlm.trust.arrays import check_alpha
from smiexlm.trust.conformal import TOLERANCE, TooSmall, checked_threshold, min_calibration

#: ``predict --conformal-method``: split-conformal (``split``), class-conditional
#: (``class``), Mondrian by distance to the training set (``distance``), weighted by the
#: covariate shift between the calibration and the query molecules (``weighted``),
#: normalised by the disagreement of a blend's members (``difficulty``)
METHODS = ("split", "class", "distance", "weighted", "difficulty")
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
                out[query == b] = checked_threshold(scores[cal[rows] == b], alpha, too_small,
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
    k = np.searchsorted(cum, need * (1.0 - TOLERANCE), side="left")
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
