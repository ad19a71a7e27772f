"""ROC-AUC over tasks with missing labels, RMSE, and a head's scores from its logits.

Labels are ``(N, T)`` float arrays with NaN for a missing label. A task counts towards the
mean ROC-AUC only when its (non-missing) labels hold both classes; the others are listed in
``skipped`` so that reports can say how many were left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def to_scores(logits: np.ndarray, task_type: str, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Probabilities (sigmoid) of a classification head; values in the labels' units of a
    regression head trained on standardised targets."""
    if task_type == "classification":
        return 1.0 / (1.0 + np.exp(-logits))
    return logits * std + mean


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


def check_scorable(y_test: np.ndarray, label_cols: list[str], name: str, split: str) -> None:
    """Raise DataError when no task has both classes among the test labels.

    Tasks with one class in test are excluded from the mean (documented behaviour); a split
    where *every* task is like that cannot be scored at all.
    """
    from smiexlm.errors import DataError

    y_test = _as_2d(y_test)
    for t in range(y_test.shape[1]):
        known = y_test[~np.isnan(y_test[:, t]), t]
        if (known == 1).any() and (known == 0).any():
            return
    raise DataError(
        f"{name}: the {split} test part holds a single class for every label column "
        f"({', '.join(label_cols[:5])}{', ...' if len(label_cols) > 5 else ''}); expected at "
        "least one task with both classes in test (use more data or another --split)"
    )


def score(task_type: str, y_true: np.ndarray, y_pred: np.ndarray) -> TaskScores:
    """ROC-AUC for classification, RMSE for regression."""
    if task_type == "classification":
        return multitask_roc_auc(y_true, y_pred)
    return multitask_rmse(y_true, y_pred)
