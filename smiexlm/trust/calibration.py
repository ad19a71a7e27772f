"""Whether predicted probabilities mean what they say: reliability, ECE, temperature scaling.

Labels and probabilities are ``(N, T)`` (a 1-D array is one task); a NaN label is masked.
The probabilities are those of the positive class, one sigmoid per task, as the multi-label
heads give them.

The expected calibration error here is the *binary* one over the positive-class
probability: the entries are put in ``n_bins`` equal-width bins of ``[0, 1]`` (bin ``b`` is
``[b/n, (b+1)/n)``, the last one closed), and

    ECE = sum_b (n_b / n) * | mean label in b - mean probability in b |

It is not the "top-label" ECE, which bins ``max(p, 1 - p)``; on binary tasks the two differ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smiexlm.atomic import atomic_path
from smiexlm.errors import ConfigError
from smiexlm.trust.arrays import (
    PerTask,
    as_2d,
    check_binary,
    check_probabilities,
    check_same_shape,
)

# temperatures are searched in this range (in 1 / t, where the loss is convex)
TEMPERATURE_BOUNDS = (0.05, 20.0)


@dataclass(frozen=True)
class Reliability:
    """One reliability diagram: ``edges`` (n_bins + 1,), and per bin the mean predicted
    probability ``confidence``, the observed frequency of the positive class ``frequency``
    (both NaN for an empty bin) and the number of entries ``count``."""

    edges: np.ndarray
    confidence: np.ndarray
    frequency: np.ndarray
    count: np.ndarray

    @property
    def ece(self) -> float:
        """The count-weighted mean of |frequency - confidence| (NaN with no entry)."""
        total = self.count.sum()
        if total == 0:
            return math.nan
        gaps = np.abs(self.frequency - self.confidence)
        return float(np.nansum(gaps * self.count) / total)


def _labelled(labels: object, probs: object) -> tuple[np.ndarray, np.ndarray]:
    """Checked ``(N, T)`` labels and probabilities."""
    y, p = as_2d("labels", labels), as_2d("probs", probs)
    check_same_shape("probs", p, y.shape, "labels")
    check_binary("labels", y)
    check_probabilities("probs", p)
    return y, p


def _check_bins(n_bins: object) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ConfigError("n_bins", n_bins, "a positive integer")
    return n_bins


def _bin(y: np.ndarray, p: np.ndarray, n_bins: int) -> Reliability:
    """The reliability of 1-D labels ``y`` and probabilities ``p`` (no NaN)."""
    edges = np.arange(n_bins + 1) / n_bins  # b / n exactly (linspace gives 0.30000000000000004)
    which = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, n_bins - 1)
    count = np.bincount(which, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        confidence = np.bincount(which, weights=p, minlength=n_bins) / count
        frequency = np.bincount(which, weights=y, minlength=n_bins) / count
    return Reliability(edges, confidence, frequency, count)


def reliability(labels: object, probs: object, n_bins: int = 10) -> Reliability:
    """The reliability diagram of every labelled entry, pooled over tasks (pass one column for
    one task); entries with a NaN probability are left out."""
    y, p = _labelled(labels, probs)
    keep = ~np.isnan(y) & ~np.isnan(p)
    return _bin(y[keep], p[keep], _check_bins(n_bins))


def expected_calibration_error(labels: object, probs: object, n_bins: int = 10) -> PerTask:
    """The binary ECE (module docstring) pooled over every labelled entry of every task, and
    per task (NaN for a task without labels); ``count`` is the entries each task scored."""
    y, p = _labelled(labels, probs)
    n_bins = _check_bins(n_bins)
    keep = ~np.isnan(y) & ~np.isnan(p)
    per = [_bin(y[keep[:, t], t], p[keep[:, t], t], n_bins).ece for t in range(y.shape[1])]
    pooled = _bin(y[keep], p[keep], n_bins).ece
    return PerTask(pooled, np.asarray(per, dtype=np.float64), keep.sum(axis=0))


def probs_to_logits(probs: object, eps: float = 1e-7) -> np.ndarray:
    """``log(p / (1 - p))`` with ``p`` clipped to ``[eps, 1 - eps]`` (saved scores are
    probabilities; a float32 sigmoid rounds large logits to exactly 0 or 1)."""
    if not 0.0 < eps < 0.5:
        raise ConfigError("eps", eps, "a number in (0, 0.5)")
    p = as_2d("probs", probs)
    check_probabilities("probs", p)
    p = np.clip(p, eps, 1.0 - eps)
    return np.log(p) - np.log1p(-p)


def _fit_one(y: np.ndarray, z: np.ndarray, bounds: tuple[float, float]) -> float:
    """The temperature minimising the mean NLL of labels ``y`` under ``sigmoid(z / t)``."""
    from scipy.optimize import minimize_scalar

    if y.size == 0 or y.min() == y.max() or not np.any(z):
        return 1.0  # nothing to fit: no labels, a single class or constant zero logits
    signed = (2.0 * y - 1.0) * z

    def nll(inverse: float) -> float:  # convex in 1 / t
        return float(np.mean(np.logaddexp(0.0, -signed * inverse)))

    low, high = 1.0 / bounds[1], 1.0 / bounds[0]
    found = minimize_scalar(nll, bounds=(low, high), method="bounded",
                            options={"xatol": 1e-7 * high})  # fmt: skip
    return float(1.0 / found.x)


def fit_temperature(
    labels: object, logits: object, bounds: tuple[float, float] = TEMPERATURE_BOUNDS
) -> np.ndarray:
    """One temperature per task, ``(T,)``, minimising the negative log-likelihood of the
    (validation) labels under ``sigmoid(logits / t)``, over ``t`` in ``bounds``.

    NaN labels are masked; a task with no labels, a single class, or all-zero logits gets
    ``t = 1``. The search runs in ``1 / t``, where the loss is convex, so the bounded scalar
    search finds the global minimum (a bound when the data are separable)."""
    y, z = as_2d("labels", labels), as_2d("logits", logits)
    check_same_shape("logits", z, y.shape, "labels")
    check_binary("labels", y)
    if not (len(bounds) == 2 and 0.0 < bounds[0] < 1.0 < bounds[1] < math.inf):
        raise ConfigError("bounds", bounds, "(low, high) with 0 < low < 1 < high < inf")
    temps = []
    for t in range(y.shape[1]):
        keep = ~np.isnan(y[:, t]) & np.isfinite(z[:, t])
        temps.append(_fit_one(y[keep, t], z[keep, t], bounds))
    return np.asarray(temps, dtype=np.float64)


def apply_temperature(logits: object, temperature: object) -> np.ndarray:
    """Calibrated probabilities ``sigmoid(logits / t)``, ``(N, T)``; ``temperature`` is one
    per task ``(T,)`` or a single number."""
    from scipy.special import expit

    z = as_2d("logits", logits)
    t = np.broadcast_to(np.asarray(temperature, dtype=np.float64).reshape(-1), (z.shape[1],))
    if not np.all(np.isfinite(t) & (t > 0)):
        raise ConfigError("temperature", t.tolist(), "positive finite numbers, one per task")
    return expit(z / t)


def spread_error_rank(spread: object, abs_error: object) -> float:
    """Spearman's rank correlation between an uncertainty spread (ensemble or random-SMILES
    standard deviation) and the absolute error, over the entries where both are finite
    (every task pooled; pass one column for one task). NaN with fewer than 3 such entries or
    a constant side: a rank correlation is then undefined."""
    from scipy.stats import spearmanr

    s, e = as_2d("spread", spread), as_2d("abs_error", abs_error)
    check_same_shape("abs_error", e, s.shape, "spread")
    keep = np.isfinite(s) & np.isfinite(e)
    if (s[keep] < 0).any():
        raise ConfigError("spread", float(s[keep][s[keep] < 0][0]), "standard deviations >= 0")
    if keep.sum() < 3 or np.ptp(s[keep]) == 0 or np.ptp(e[keep]) == 0:
        return math.nan
    return float(spearmanr(s[keep], e[keep]).statistic)


def plot_reliability(
    labels: object,
    probs: object,
    path: Path | str,
    calibrated: object | None = None,
    n_bins: int = 10,
    title: str = "",
) -> Path:
    """A reliability diagram (PNG at ``path``): observed frequency against mean predicted
    probability per bin, before and, when ``calibrated`` probabilities are given (e.g. after
    temperature scaling), after; below, how many entries fall in each bin."""
    from matplotlib.figure import Figure  # no pyplot: the caller's backend is left alone

    curves = {"before": reliability(labels, probs, n_bins)}
    if calibrated is not None:
        curves["after temperature"] = reliability(labels, calibrated, n_bins)
    fig = Figure(figsize=(4.8, 6))
    top, bottom = fig.subplots(2, 1, height_ratios=(3, 1), sharex=True)
    top.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--", label="perfect")
    for (name, curve), style in zip(curves.items(), ("o-", "s-"), strict=False):
        top.plot(curve.confidence[curve.count > 0], curve.frequency[curve.count > 0], style,
                 label=f"{name} (ECE {curve.ece:.3f})", ms=4)  # fmt: skip
        width = np.diff(curve.edges) / (len(curves) + 1)
        offset = (list(curves).index(name) + 0.5) * width
        bottom.bar(curve.edges[:-1] + offset, curve.count, width=width, align="edge", label=name)
    top.set(xlim=(0, 1), ylim=(0, 1), ylabel="observed frequency of 1", title=title)
    top.legend(fontsize=7, loc="upper left")
    bottom.set(xlabel="mean predicted probability", ylabel="entries")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return path
