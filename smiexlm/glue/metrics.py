"""GLUE metrics as the paper states them, computed with numpy only.

MCC for CoLA, Spearman (and Pearson) for STS-B, accuracy for the rest, plus F1 of the
positive class for MRPC and QQP. The formulas are written out here and tested against
scikit-learn and scipy. Scores are fractions in [-1, 1] / [0, 1]; multiply by 100 to compare
with the paper's tables.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from smiexlm.errors import DataError
from smiexlm.glue.tasks import GlueTask, get_task


def accuracy(pred: np.ndarray, gold: np.ndarray) -> float:
    return float(np.mean(pred == gold))


def f1_binary(pred: np.ndarray, gold: np.ndarray) -> float:
    """F1 of class 1; 0.0 when there are no true positives."""
    tp = float(np.sum((pred == 1) & (gold == 1)))
    fp = float(np.sum((pred == 1) & (gold != 1)))
    fn = float(np.sum((pred != 1) & (gold == 1)))
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def matthews_corrcoef(pred: np.ndarray, gold: np.ndarray) -> float:
    """Binary MCC = (tp·tn − fp·fn) / sqrt((tp+fp)(tp+fn)(tn+fp)(tn+fn)); 0.0 when a
    marginal is empty (a constant predictor), as scikit-learn defines it."""
    tp = float(np.sum((pred == 1) & (gold == 1)))
    tn = float(np.sum((pred != 1) & (gold != 1)))
    fp = float(np.sum((pred == 1) & (gold != 1)))
    fn = float(np.sum((pred != 1) & (gold == 1)))
    denom = (tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)
    return 0.0 if denom == 0 else (tp * tn - fp * fn) / float(np.sqrt(denom))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation; NaN when either input is constant."""
    if np.all(x == x.flat[0]) or np.all(y == y.flat[0]):
        return float("nan")
    x = x.astype(np.float64) - x.mean()
    y = y.astype(np.float64) - y.mean()
    denom = np.sqrt(np.sum(x * x) * np.sum(y * y))
    return float("nan") if denom == 0 else float(np.sum(x * y) / denom)


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    # start index of each run of equal values
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    run_rank = (starts + ends + 1) / 2.0  # mean of 1-based positions start+1 .. end
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman correlation = Pearson correlation of average ranks."""
    return pearson(_average_ranks(np.asarray(x)), _average_ranks(np.asarray(y)))


def _as_array(values, name: str) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    arr = np.asarray(values)
    if arr.size == 0:
        raise DataError(f"{name} is empty: expected at least one value")
    return arr


def compute_metrics(
    task: str | GlueTask, predictions: Sequence | np.ndarray, labels: Sequence | np.ndarray
) -> dict[str, float]:
    """Scores of ``predictions`` against ``labels`` for ``task``.

    Classification: ``predictions`` are class indices (N,) or logits (N, C), argmax taken.
    Regression (STS-B): scores (N,) or (N, 1). Returns e.g. ``{"mcc": ..., "accuracy": ...}``
    with the task's primary metric first."""
    task = task if isinstance(task, GlueTask) else get_task(task)
    pred = _as_array(predictions, "predictions")
    gold = _as_array(labels, "labels")
    if pred.ndim == 2:
        pred = pred[:, 0] if task.is_regression else pred.argmax(axis=1)
    if pred.shape != gold.shape:
        raise DataError(
            f"predictions have shape {pred.shape} but labels {gold.shape}: expected the same length"
        )
    out: dict[str, float] = {}
    for metric in task.metrics:
        if metric == "accuracy":
            out[metric] = accuracy(pred, gold)
        elif metric == "f1":
            out[metric] = f1_binary(pred, gold)
        elif metric == "mcc":
            out[metric] = matthews_corrcoef(pred, gold)
        elif metric == "spearman":
            out[metric] = spearman(pred.astype(np.float64), gold.astype(np.float64))
        elif metric == "pearson":
            out[metric] = pearson(pred.astype(np.float64), gold.astype(np.float64))
    return out


def majority_baseline(task: str | GlueTask, train_labels, eval_labels) -> dict[str, float]:
    """Scores of always predicting the most frequent training class (the training mean
    for STS-B, whose correlations are then undefined: NaN)."""
    task = task if isinstance(task, GlueTask) else get_task(task)
    train = np.asarray(train_labels)
    n = len(np.asarray(eval_labels))
    if task.is_regression:
        pred = np.full(n, float(train.mean()))
    else:
        counts = np.bincount(train.astype(np.int64), minlength=task.num_labels)
        pred = np.full(n, int(counts.argmax()))
    return compute_metrics(task, pred, eval_labels)
