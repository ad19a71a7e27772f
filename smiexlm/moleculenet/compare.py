"""How sure a difference between two rows of a MoleculeNet table is: a paired bootstrap over
the test molecules.

Three seeds say how much a score moves with the seed; they say nothing about the test set,
which is small (BACE's scaffold test split has 152 molecules, ClinTox's 148) and fixed by the
deterministic scaffold split. A row's figure is the mean over its seeds of the test score (the
mean over a set's scorable tasks). :func:`paired_bootstrap` draws the test molecules with
replacement, the same draw for both rows, and recomputes both figures on it: the spread of
their difference over draws is what another test set of the same kind could have shown. A
draw in which a task lacks one class scores that task as the tables do: left out of the mean.

A draw is a count per molecule (how often it was drawn), so ROC-AUC is scored from the
counts as weights on each task's molecules ranked once (:class:`_Ranked`), not by sorting a
resampled copy per draw: ToxCast's 617 tasks x 6 seeds x 1,000 draws take about 3 CPU
minutes, not half an hour. The tests hold each draw to scikit-learn's ROC-AUC on the
resampled molecules, tied scores included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from smiexlm.errors import ConfigError, DataError
from smiexlm.moleculenet.metrics import more_scores, score


@dataclass(frozen=True)
class Difference:
    """Row A against row B on one set (or a mean over sets): each figure on the test set as
    it is, their difference, its central ``level`` interval over the draws, and the share of
    draws in which A is the better (higher ROC-AUC, lower RMSE)."""

    a: float
    b: float
    diff: float
    low: float
    high: float
    a_better: float
    draws: np.ndarray  # (R,) the difference on each draw, kept for means over sets

    @classmethod
    def of(cls, a: float, b: float, draws: np.ndarray, higher_is_better: bool,
           level: float) -> Difference:  # fmt: skip
        tail = (1.0 - level) / 2.0 * 100.0
        low, high = np.percentile(draws, [tail, 100.0 - tail])
        better = draws > 0 if higher_is_better else draws < 0
        return cls(a, b, a - b, float(low), float(high), float(better.mean()), draws)


class _Ranked:
    """One task of one seed's scores, its labelled molecules ranked once: the ROC-AUC of any
    draw of them, from how often each was drawn (ties count a half, as in ROC-AUC)."""

    def __init__(self, labels: np.ndarray, scores: np.ndarray) -> None:
        self.rows = np.flatnonzero(~np.isnan(labels))
        self.positive = labels[self.rows] == 1
        levels, self.level = np.unique(scores[self.rows], return_inverse=True)
        self.n_levels = len(levels)

    def auc(self, counts: np.ndarray) -> float:
        """ROC-AUC of the draw in which molecule i was drawn ``counts[i]`` times; NaN when it
        holds one class only."""
        weight = counts[self.rows]
        pos, neg = np.where(self.positive, weight, 0), np.where(self.positive, 0, weight)
        n_pos, n_neg = pos.sum(), neg.sum()
        if n_pos == 0 or n_neg == 0:
            return float("nan")
        neg_at = np.bincount(self.level, neg, minlength=self.n_levels)
        below = np.cumsum(neg_at) - neg_at  # negatives scored lower than each level
        return float((pos * (below[self.level] + 0.5 * neg_at[self.level])).sum() / (n_pos * n_neg))

    def pr_auc(self, counts: np.ndarray) -> float:
        """Average precision of the same draw (tied scores one threshold, as in
        :func:`~smiexlm.moleculenet.metrics.binary_average_precision`); NaN when it holds one
        class only."""
        weight = counts[self.rows]
        pos = np.where(self.positive, weight, 0)
        n_pos = pos.sum()
        if n_pos == 0 or n_pos == weight.sum():
            return float("nan")
        pos_at = np.bincount(self.level, pos, minlength=self.n_levels)[::-1]  # highest first
        seen = np.cumsum(np.bincount(self.level, weight, minlength=self.n_levels)[::-1])
        precision = np.cumsum(pos_at) / np.maximum(seen, 1)  # a level no draw holds gains 0
        return float((pos_at * precision).sum() / n_pos)


#: what the bootstrap can compare: the table's score, or the classification measure beside it
MEASURES = ("score", "pr_auc")


def _figure_of_counts(ranked: list[list[_Ranked]], counts: np.ndarray, measure: str) -> float:
    """A row's figure on a draw: the mean over seeds of the mean over scorable tasks."""
    figures = []
    for seed in ranked:
        per_task = [t.pr_auc(counts) if measure == "pr_auc" else t.auc(counts) for t in seed]
        scored = [s for s in per_task if not np.isnan(s)]
        figures.append(np.mean(scored) if scored else np.nan)
    return float(np.mean(figures))


def row_figure(task_type: str, labels: np.ndarray, seeds: Sequence[np.ndarray],
               measure: str = "score") -> float:  # fmt: skip
    """The table's figure: the mean over seeds of the test score (or of the mean average
    precision over tasks, ``measure="pr_auc"``) of each seed's (N, T) scores."""
    if measure == "pr_auc":
        return float(np.mean([more_scores(task_type, labels, s)["pr_auc"] / 100 for s in seeds]))
    return float(np.mean([score(task_type, labels, s).mean for s in seeds]))


def paired_bootstrap(
    task_type: str, labels: np.ndarray, a: Sequence[np.ndarray], b: Sequence[np.ndarray],
    draws: int = 1000, seed: int = 0, level: float = 0.95, measure: str = "score",
) -> Difference:  # fmt: skip
    """Row A (``a``: each seed's (N, T) test scores) against row B on the same N test molecules
    (``labels``, (N, T), NaN = missing), over ``draws`` paired resamples of the molecules;
    ``measure="pr_auc"`` compares the mean average precision (classification) instead of the
    score."""
    if measure not in MEASURES or (measure == "pr_auc" and task_type != "classification"):
        raise ConfigError("measure", measure, "score, or pr_auc for a classification set")
    if draws < 10:
        raise ConfigError("draws", draws, "at least 10 resamples")
    if not 0.0 < level < 1.0:
        raise ConfigError("level", level, "a coverage strictly between 0 and 1, such as 0.95")
    labels = labels if labels.ndim == 2 else labels[:, None]
    for name, seeds in (("a", a), ("b", b)):
        if not seeds or any(np.shape(s)[0] != len(labels) for s in seeds):
            raise DataError(f"row {name}: expected each seed's scores of the {len(labels)} test "
                            f"molecules, got shapes {[np.shape(s) for s in seeds]}")  # fmt: skip
    rng = np.random.default_rng(seed)
    diffs = np.empty(draws)
    if task_type == "classification":
        ranked = [[[_Ranked(labels[:, t], np.reshape(s, labels.shape)[:, t])
                    for t in range(labels.shape[1])] for s in row] for row in (a, b)]  # fmt: skip
    for r in range(draws):
        pick = rng.integers(0, len(labels), len(labels))
        if task_type == "classification":
            counts = np.bincount(pick, minlength=len(labels)).astype(float)
            diffs[r] = (_figure_of_counts(ranked[0], counts, measure)
                        - _figure_of_counts(ranked[1], counts, measure))  # fmt: skip
        else:
            diffs[r] = (row_figure(task_type, labels[pick], [s[pick] for s in a])
                        - row_figure(task_type, labels[pick], [s[pick] for s in b]))  # fmt: skip
    return Difference.of(row_figure(task_type, labels, a, measure),
                         row_figure(task_type, labels, b, measure), diffs,
                         task_type == "classification", level)  # fmt: skip


def mean_over_sets(parts: Sequence[Difference], higher_is_better: bool, level: float = 0.95) -> Difference:  # fmt: skip
    """The difference of the rows' means over sets: each set drawn on its own (the sets'
    test molecules are independent), the draws of equal rank averaged."""
    if len({len(p.draws) for p in parts}) != 1:
        raise DataError("every set must have the same number of draws to average them")
    draws = np.mean([p.draws for p in parts], axis=0)
    return Difference.of(float(np.mean([p.a for p in parts])), float(np.mean([p.b for p in parts])),
                         draws, higher_is_better, level)  # fmt: skip
