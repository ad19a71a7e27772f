"""ROC-AUC over tasks with missing labels, RMSE, the measures reported beside them (PR-AUC;
MAE, R² and Spearman's rho), and a head's scores from its logits.

Labels are ``(N, T)`` float arrays with NaN for a missing label. A task counts towards the
mean ROC-AUC only when its (non-missing) labels hold both classes; the others are listed in
``skipped`` so that reports can say how many were left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class TaskScores:
    """The mean over scored tasks, each task's score (NaN where skipped), the skipped tasks."""

    mean: float
    per_task: list[float]
    n_scored: int
    skipped: list[int] = field(default_factory=list)


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank (scipy's ``rankdata``, whose module takes a
    second to import in every process that scores)."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]]  # where each run of equal values starts
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values))
    ranks[order] = ((starts + 1 + ends) / 2)[np.cumsum(first) - 1]
    return ranks


def binary_roc_auc(y_true: np.ndarray, y_score: np.ndarray) -> float:
    """ROC-AUC of one binary task as the Mann–Whitney statistic (ties count one half).

    Returns NaN when ``y_true`` lacks one of the two classes.
    """
    y_true = np.asarray(y_true, dtype=float)
    y_score = np.asarray(y_score, dtype=float)
    positive = y_true == 1
    n_pos = int(positive.sum())
    n_neg = len(y_true) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = _average_ranks(y_score)
    return float((ranks[positive].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _as_2d(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return values[:, None] if values.ndim == 1 else values


def multitask_roc_auc(y_true: np.ndarray, y_score: np.ndarray) -> TaskScores:
    """Mean ROC-AUC over the tasks of ``y_true`` (N, T) that have both classes present.

    Missing labels (NaN) are masked per task before scoring. The mean is NaN when no task
    can be scored.
    """
    y_true, y_score = _as_2d(y_true), _as_2d(y_score)
    if y_true.shape != y_score.shape:
        raise ValueError(f"y_true {y_true.shape} and y_score {y_score.shape} differ in shape")
    per_task: list[float] = []
    for t in range(y_true.shape[1]):
        known = ~np.isnan(y_true[:, t])
        per_task.append(binary_roc_auc(y_true[known, t], y_score[known, t]))
    scored = [s for s in per_task if not np.isnan(s)]
    skipped = [t for t, s in enumerate(per_task) if np.isnan(s)]
    mean = float(np.mean(scored)) if scored else float("nan")
    return TaskScores(mean, per_task, len(scored), skipped)


def multitask_rmse(y_true: np.ndarray, y_pred: np.ndarray) -> TaskScores:
    """RMSE per task over non-missing labels, averaged over tasks."""
    y_true, y_pred = _as_2d(y_true), _as_2d(y_pred)
    per_task = []
    for t in range(y_true.shape[1]):
        known = ~np.isnan(y_true[:, t])
        diff = y_true[known, t] - y_pred[known, t]
        per_task.append(float(np.sqrt(np.mean(diff**2))) if known.any() else float("nan"))
    scored = [s for s in per_task if not np.isnan(s)]
    skipped = [t for t, s in enumerate(per_task) if np.isnan(s)]
    return TaskScores(
        float(np.mean(scored)) if scored else float("nan"), per_task, len(scored), skipped
    )


def binary_average_precision(y_true: np.ndarray, y_score: np.ndarray) -> float:
    """Average precision of one binary task, the area under its precision-recall steps: the sum
    over score thresholds (tied scores form one) of the recall gained times the precision there,
    as scikit-learn's ``average_precision_score``. NaN when ``y_true`` holds no positive or no
    negative."""
    y_true = np.asarray(y_true, dtype=float) == 1
    y_score = np.asarray(y_score, dtype=float)
    n_pos = int(y_true.sum())
    if n_pos == 0 or n_pos == len(y_true):
        return float("nan")
    order = np.argsort(-y_score, kind="stable")
    hits, ordered = y_true[order], y_score[order]
    last = np.r_[ordered[1:] != ordered[:-1], True]  # the last molecule of each tied run
    tp = np.cumsum(hits)[last]
    precision = tp / (np.flatnonzero(last) + 1)
    recall_gain = np.diff(np.r_[0, tp]) / n_pos
    return float((recall_gain * precision).sum())


def _per_task(y_true: np.ndarray, y_pred: np.ndarray, measure) -> list[float]:
    """``measure(true, pred)`` of each column over its known (non-NaN) labels; NaN where a
    column has fewer than two."""
    y_true, y_pred = _as_2d(y_true), _as_2d(y_pred)
    out = []
    for t in range(y_true.shape[1]):
        known = ~np.isnan(y_true[:, t])
        out.append(measure(y_true[known, t], y_pred[known, t]) if known.sum() > 1 else math.nan)
    return out


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    spread = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - pred) ** 2).sum()) / spread if spread > 0 else math.nan


def _spearman(y: np.ndarray, pred: np.ndarray) -> float:
    a, b = _average_ranks(y), _average_ranks(pred)
    a, b = a - a.mean(), b - b.mean()
    norm = math.sqrt(float((a * a).sum() * (b * b).sum()))
    return float((a * b).sum()) / norm if norm > 0 else math.nan


def _mean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else math.nan


def more_scores(task_type: str, y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """The measures beside the primary score, each the mean over tasks that can be scored.

    Classification: ``pr_auc``, the average precision (x 100), which weighs the top of the
    ranking where ROC-AUC weighs all of it, and ``positives``, the share of positives (x 100)
    among the labelled molecules of those tasks, which is the average precision of a random
    ranking. Regression: ``mae``, ``r2`` (coefficient of determination) and ``spearman``
    (rank correlation)."""
    if task_type == "classification":
        ap = _per_task(y_true, y_pred, binary_average_precision)
        y = _as_2d(y_true)
        share = [float(np.nanmean(y[:, t])) for t, a in enumerate(ap) if not math.isnan(a)]
        return {"pr_auc": 100 * _mean(ap), "positives": 100 * _mean(share)}
    return {
        "mae": _mean(_per_task(y_true, y_pred, lambda y, p: float(np.abs(y - p).mean()))),
        "r2": _mean(_per_task(y_true, y_pred, _r2)),
        "spearman": _mean(_per_task(y_true, y_pred, _spearman)),
    }


def check_scorable(y_test: np.ndarray, label_cols: list[str], name: str, split: str) -> None:
    """Raise DataError when no task has both classes among the test labels.

    Tasks with one class in test are excluded from the mean (documented behaviour); a split
    where *every* task is like that cannot be scored at all.
    """
    from smiexlm.errors import DataError

    if not scorable(y_test):
        raise DataError(
            f"{name}: the {split} test part holds a single class for every label column "
            f"({', '.join(label_cols[:5])}{', ...' if len(label_cols) > 5 else ''}); expected "
            "at least one task with both classes in test (use more data or another --split)"
        )


def scorable(y: np.ndarray) -> bool:
    """Whether some task of the 0/1 labels ``y`` (NaN: missing) holds both classes."""
    y = _as_2d(y)
    for t in range(y.shape[1]):
        known = y[~np.isnan(y[:, t]), t]
        if (known == 1).any() and (known == 0).any():
            return True
    return False


def score(task_type: str, y_true: np.ndarray, y_pred: np.ndarray) -> TaskScores:
    """ROC-AUC for classification, RMSE for regression."""
    if task_type == "classification":
        return multitask_roc_auc(y_true, y_pred)
    return multitask_rmse(y_true, y_pred)
