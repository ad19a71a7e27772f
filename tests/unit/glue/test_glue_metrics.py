"""GLUE metrics against scikit-learn and scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as skm

from smiexlm.errors import DataError
from smiexlm.glue import compute_metrics, majority_baseline


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 2, size=200)
    pred = np.where(rng.random(200) < 0.7, gold, 1 - gold)
    cola = compute_metrics("CoLA", pred, gold)
    assert cola["mcc"] == pytest.approx(skm.matthews_corrcoef(gold, pred), abs=1e-12)
    mrpc = compute_metrics("MRPC", pred, gold)
    assert mrpc["accuracy"] == pytest.approx(skm.accuracy_score(gold, pred), abs=1e-12)
    assert mrpc["f1"] == pytest.approx(skm.f1_score(gold, pred), abs=1e-12)
    assert list(compute_metrics("QQP", pred, gold)) == ["accuracy", "f1"]


def test_logits_are_argmaxed_and_three_classes():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(50, 3))
    gold = rng.integers(0, 3, size=50)
    got = compute_metrics("MNLI", logits, gold)["accuracy"]
    assert got == pytest.approx(skm.accuracy_score(gold, logits.argmax(1)))


def test_degenerate_cases_match_sklearn():
    gold = np.array([0, 1, 1, 0])
    constant = np.zeros(4, dtype=int)
    assert compute_metrics("CoLA", constant, gold)["mcc"] == skm.matthews_corrcoef(gold, constant)
    got = compute_metrics("MRPC", constant, gold)["f1"]
    assert got == skm.f1_score(gold, constant, zero_division=0)


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    gold = rng.integers(0, 6, size=300).astype(float)  # many ties, as in STS-B
    pred = np.round(gold + rng.normal(scale=1.5, size=300), 1)
    out = compute_metrics("STS-B", pred[:, None], gold)  # (N, 1) regression output
    assert list(out) == ["spearman", "pearson"]
    assert out["spearman"] == pytest.approx(stats.spearmanr(pred, gold).statistic, abs=1e-12)
    assert out["pearson"] == pytest.approx(stats.pearsonr(pred, gold).statistic, abs=1e-12)


def test_shape_mismatch_and_empty():
    with pytest.raises(DataError, match="shape"):
        compute_metrics("RTE", [0, 1, 1], [0, 1])
    with pytest.raises(DataError, match="empty"):
        compute_metrics("RTE", [], [])


def test_majority_baseline():
    out = majority_baseline("RTE", [0, 0, 1], [0, 1, 1, 1])
    assert out == {"accuracy": 0.25}
    sts = majority_baseline("STS-B", [1.0, 2.0], [0.0, 5.0])
    assert math.isnan(sts["spearman"]) and math.isnan(sts["pearson"])
