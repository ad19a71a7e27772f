"""The paired bootstrap of two rows, against scikit-learn's ROC-AUC draw by draw."""

from __future__ import annotations

import numpy as np
import pytest

from smiexlm.errors import ConfigError, DataError
from smiexlm.moleculenet.compare import mean_over_sets, paired_bootstrap


def _rows(n=60, tasks=2, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, (n, tasks)).astype(float)
    labels[rng.random((n, tasks)) < 0.1] = np.nan  # missing labels, as in Tox21
    good = [labels + rng.normal(0, s, labels.shape) for s in (0.8, 0.9, 1.0)]  # three seeds
    poor = [rng.normal(0, 1, labels.shape) for _ in range(3)]
    return labels, [np.nan_to_num(g) for g in good], poor


def _sklearn_figure(labels, seeds, measure="score"):
    """The table's figure by hand: per seed, the mean over tasks with both classes."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    by = average_precision_score if measure == "pr_auc" else roc_auc_score
    figures = []
    for scores in seeds:
        per_task = []
        for t in range(labels.shape[1]):
            known = ~np.isnan(labels[:, t])
            if len(set(labels[known, t])) == 2:
                per_task.append(by(labels[known, t], scores[known, t]))
        figures.append(np.mean(per_task))
    return float(np.mean(figures))


@pytest.mark.parametrize("measure", ["score", "pr_auc"])
@pytest.mark.parametrize("decimals", [None, 1])  # 1: many tied scores, each counting a half
def test_each_draw_is_the_difference_scikit_learn_gives_on_the_same_molecules(decimals, measure):
    labels, good, poor = _rows()
    if decimals is not None:
        good, poor = ([np.round(s, decimals) for s in row] for row in (good, poor))
    d = paired_bootstrap("classification", labels, good, poor, draws=20, seed=3, measure=measure)
    assert d.a == pytest.approx(_sklearn_figure(labels, good, measure))
    assert d.b == pytest.approx(_sklearn_figure(labels, poor, measure))
    rng = np.random.default_rng(3)  # the same draws, one by one
    for r in range(20):
        pick = rng.integers(0, len(labels), len(labels))
        by_hand = (_sklearn_figure(labels[pick], [s[pick] for s in good], measure)
                   - _sklearn_figure(labels[pick], [s[pick] for s in poor], measure))  # fmt: skip
        assert d.draws[r] == pytest.approx(by_hand)
    low, high = np.percentile(d.draws, [2.5, 97.5])
    assert (d.low, d.high) == (pytest.approx(low), pytest.approx(high))
    assert d.a_better == np.mean(d.draws > 0) and d.low > 0  # a clear winner


def test_a_row_against_itself_and_regression_where_lower_is_better():
    labels, good, _ = _rows()
    same = paired_bootstrap("classification", labels, good, good, draws=50)
    assert same.diff == 0 and same.low == same.high == 0 and same.a_better == 0
    values = np.random.default_rng(1).normal(size=(40, 1))
    close = [values + 0.1 * np.random.default_rng(s).normal(size=values.shape) for s in range(3)]
    far = [values + 2.0 for _ in range(3)]
    d = paired_bootstrap("regression", values, close, far, draws=50)
    assert d.diff < 0 and d.high < 0 and d.a_better == 1.0  # lower RMSE is better


def test_the_mean_over_sets_averages_draws_of_equal_rank():
    labels, good, poor = _rows()
    one = paired_bootstrap("classification", labels, good, poor, draws=30, seed=0)
    two = paired_bootstrap("classification", labels, poor, good, draws=30, seed=1)
    mean = mean_over_sets([one, two], higher_is_better=True)
    np.testing.assert_allclose(mean.draws, (one.draws + two.draws) / 2)
    assert mean.a == pytest.approx((one.a + two.a) / 2)
    with pytest.raises(DataError, match="same number of draws"):
        mean_over_sets([one, paired_bootstrap("classification", labels, good, poor, draws=10)], True)  # fmt: skip


def test_bad_calls_name_what_is_wrong():
    labels, good, poor = _rows()
    with pytest.raises(ConfigError, match="draws"):
        paired_bootstrap("classification", labels, good, poor, draws=5)
    with pytest.raises(ConfigError, match="measure"):
        paired_bootstrap("regression", labels, good, poor, measure="pr_auc")
    with pytest.raises(ConfigError, match="level"):
        paired_bootstrap("classification", labels, good, poor, level=95)
    with pytest.raises(DataError, match="row b"):
        paired_bootstrap("classification", labels, good, [p[:-1] for p in poor])
