"""The model-forest blend: quantiles against a brute-force count, and the blend's arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from smiexlm.errors import ConfigError, DataError
from smiexlm.forests.blend import blend, quantiles


def test_quantiles_match_a_brute_force_mid_rank_with_ties():
    rng = np.random.default_rng(0)
    reference = rng.integers(0, 6, size=(40, 3)).astype(np.float64)  # many ties
    scores = rng.integers(-1, 8, size=(25, 3)).astype(np.float64)  # below, among and above
    got = quantiles(reference, scores)
    for i in range(len(scores)):
        for j in range(3):
            below = np.sum(reference[:, j] < scores[i, j])
            at_or_below = np.sum(reference[:, j] <= scores[i, j])
            assert got[i, j] == (below + at_or_below) / (2 * len(reference))
    assert quantiles(reference, np.full((1, 3), -5.0)).tolist() == [[0.0, 0.0, 0.0]]
    assert quantiles(reference, np.full((1, 3), 99.0)).tolist() == [[1.0, 1.0, 1.0]]


def test_blend_ranks_classification_scores_and_averages_regression_values():
    valid_model, valid_forest = np.array([[0.1], [0.2], [0.9]]), np.array([[0.4], [0.5], [0.6]])
    model, forest = np.array([[0.2], [0.95]]), np.array([[0.45], [0.55]])
    # model quantiles 1/2 and 1; forest quantiles 1/3 and 2/3
    np.testing.assert_allclose(blend("classification", valid_model, model, valid_forest, forest),
                               [[5 / 12], [5 / 6]])  # fmt: skip
    np.testing.assert_allclose(
        blend("classification", valid_model, model, valid_forest, forest, weight=1.0),
        quantiles(valid_model, model),
    )
    np.testing.assert_allclose(
        blend("regression", valid_model, np.array([[2.0]]), valid_forest, np.array([[4.0]]), 0.25),
        [[3.5]],
    )
    # how="mean": the probabilities themselves, weighted
    np.testing.assert_allclose(
        blend("classification", valid_model, model, valid_forest, forest, 0.75, how="mean"),
        0.75 * model + 0.25 * forest,
    )


def test_blend_refuses_what_it_cannot_rank():
    with pytest.raises(ConfigError, match="weight"):
        blend("regression", np.ones((2, 1)), np.ones((2, 1)), np.ones((2, 1)), np.ones((2, 1)), 1.5)
    with pytest.raises(ConfigError, match="forest_blend"):
        blend("regression", np.ones((2, 1)), np.ones((2, 1)), np.ones((2, 1)), np.ones((2, 1)),
              how="median")  # fmt: skip
    with pytest.raises(DataError, match="0 reference scores"):
        quantiles(np.zeros((0, 1)), np.ones((2, 1)))
    with pytest.raises(DataError, match="1 NaN"):
        quantiles(np.array([[0.1], [np.nan]]), np.ones((2, 1)))
    with pytest.raises(DataError, match="same T"):
        quantiles(np.ones((3, 2)), np.ones((2, 1)))
