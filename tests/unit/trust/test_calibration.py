"""Reliability and ECE against a brute-force loop and scikit-learn, temperature scaling on
logits made with a known temperature, Spearman against scipy, and the diagram's PNG."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import expit
from scipy.stats import spearmanr
from sklearn.calibration import calibration_curve

from smiexlm.errors import ConfigError
from smiexlm.trust.calibration import (
    apply_temperature,
    expected_calibration_error,
    fit_temperature,
    plot_reliability,
    probs_to_logits,
    reliability,
    spread_error_rank,
)


def _brute_force_ece(labels: list[float], probs: list[float], n_bins: int) -> float:
    """Bin b = [b/n, (b+1)/n), the last closed, one entry at a time; NaN labels skipped."""
    sums = [[0, 0.0, 0.0] for _ in range(n_bins)]  # count, sum of p, sum of y
    for y, p in zip(labels, probs, strict=True):
        if math.isnan(y) or math.isnan(p):
            continue
        for b in range(n_bins):
            if b / n_bins <= p < (b + 1) / n_bins or (b == n_bins - 1 and p == 1.0):
                sums[b][0] += 1
                sums[b][1] += p
                sums[b][2] += y
                break
    total = sum(s[0] for s in sums)
    return sum(abs(s[2] / s[0] - s[1] / s[0]) * s[0] / total for s in sums if s[0])


def _draw(seed: int, n: int, tasks: int = 1):
    rng = np.random.default_rng(seed)
    probs = rng.uniform(size=(n, tasks))
    on_edge = rng.uniform(size=probs.shape) < 0.2  # 0, 0.1, ..., 1: where binning can slip
    probs[on_edge] = rng.integers(0, 11, on_edge.sum()) / 10
    labels = (rng.uniform(size=probs.shape) < probs**1.5).astype(float)
    labels[rng.uniform(size=labels.shape) < 0.1] = np.nan
    return labels, probs


@pytest.mark.parametrize("n_bins", [1, 3, 10, 15])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ece_equals_a_brute_force_loop(seed, n_bins):
    labels, probs = _draw(seed, 300)
    ours = expected_calibration_error(labels, probs, n_bins)
    assert ours.pooled == pytest.approx(_brute_force_ece(labels[:, 0], probs[:, 0], n_bins))
    assert ours.per_task[0] == pytest.approx(ours.pooled)
    assert reliability(labels, probs, n_bins).ece == pytest.approx(ours.pooled)


def test_ece_by_hand_and_pooled_against_per_task():
    ece = expected_calibration_error([0, 1, 1, 0], [0.05, 0.95, 0.55, 0.45], n_bins=2)
    assert ece.pooled == pytest.approx(0.25)  # each half: mean p 0.25 / 0.75, frequency 0 / 1
    labels, probs = _draw(3, 200, tasks=3)
    labels[:, 2] = np.nan
    ece = expected_calibration_error(labels, probs)
    flat = _brute_force_ece(labels.ravel().tolist(), probs.ravel().tolist(), 10)
    assert ece.pooled == pytest.approx(flat)
    for t in range(2):
        assert ece.per_task[t] == pytest.approx(_brute_force_ece(labels[:, t], probs[:, t], 10))
    assert math.isnan(ece.per_task[2]) and ece.count[2] == 0


def test_reliability_matches_scikit_learn_calibration_curve():
    rng = np.random.default_rng(4)
    probs = rng.uniform(size=2000)  # no value on a bin edge, where the two conventions differ
    labels = (rng.uniform(size=2000) < probs**2).astype(float)
    curve = reliability(labels, probs, n_bins=8)
    frequency, confidence = calibration_curve(labels, probs, n_bins=8, strategy="uniform")
    filled = curve.count > 0
    assert np.allclose(curve.frequency[filled], frequency)
    assert np.allclose(curve.confidence[filled], confidence)
    assert curve.count.sum() == 2000 and len(curve.edges) == 9


def test_empty_bins_are_nan_and_count_zero():
    curve = reliability([1, 0, np.nan], [0.95, 0.91, 0.2], n_bins=10)
    assert curve.count.tolist() == [0] * 9 + [2]
    assert np.isnan(curve.frequency[:9]).all() and curve.frequency[9] == 0.5
    assert curve.ece == pytest.approx(abs(0.5 - 0.93))


@pytest.mark.parametrize("temperature", [0.5, 2.5])
def test_temperature_fit_recovers_the_temperature_the_logits_were_made_with(temperature):
    rng = np.random.default_rng(5)
    true_logits = rng.normal(scale=2.0, size=(40000, 1))
    labels = (rng.uniform(size=true_logits.shape) < expit(true_logits)).astype(float)
    fitted = fit_temperature(labels, true_logits * temperature)
    assert fitted.shape == (1,)
    assert fitted[0] == pytest.approx(temperature, rel=0.03)


def test_temperature_fit_is_the_minimum_of_the_likelihood_on_a_grid():
    rng = np.random.default_rng(6)
    logits = rng.normal(scale=3.0, size=500)
    labels = (rng.uniform(size=500) < expit(logits / 1.8)).astype(float)
    grid = np.linspace(0.2, 6.0, 5801)
    nll = [-np.mean(labels * np.log(expit(logits / t)) + (1 - labels) * np.log(expit(-logits / t)))
           for t in grid]  # fmt: skip
    assert fit_temperature(labels, logits)[0] == pytest.approx(grid[int(np.argmin(nll))], abs=2e-3)


def test_temperature_is_one_for_a_task_without_two_classes_and_per_task_otherwise():
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(300, 3))
    labels = (rng.uniform(size=(300, 3)) < expit(logits / 2)).astype(float)
    labels[:, 1] = np.nan
    labels[:, 2] = np.where(labels[:, 2] == 1, np.nan, 0.0)  # one class
    temps = fit_temperature(labels, logits)
    assert temps[1] == 1.0 and temps[2] == 1.0 and temps[0] != 1.0
    assert fit_temperature([0.0, 1.0], [0.0, 0.0])[0] == 1.0  # zero logits
    assert fit_temperature([0.0, 1.0, 1.0], [-3.0, 2.0, 5.0])[0] == pytest.approx(0.05)  # separable
    probs = apply_temperature(logits, temps)
    assert np.allclose(probs, expit(logits / temps))
    assert np.allclose(apply_temperature(logits, 2.0), expit(logits / 2.0))


def test_logits_round_trip_and_saturated_probabilities_stay_finite():
    z = np.linspace(-12, 12, 25)[:, None]
    assert np.allclose(probs_to_logits(expit(z)), z, atol=1e-6)
    edges = probs_to_logits(np.array([0.0, 1.0], dtype=np.float32))
    assert np.all(np.isfinite(edges)) and edges[0, 0] == pytest.approx(-edges[1, 0])


def test_spread_error_rank_is_scipy_spearman_over_finite_pairs():
    rng = np.random.default_rng(8)
    spread = rng.uniform(size=(200, 2))
    error = np.abs(rng.normal(size=(200, 2))) * (0.5 + spread)
    spread[::7, 0] = np.nan
    error[::11, 1] = np.nan
    keep = np.isfinite(spread) & np.isfinite(error)
    expected = spearmanr(spread[keep], error[keep]).statistic
    assert spread_error_rank(spread, error) == pytest.approx(expected)
    assert spread_error_rank([1, 2, 3, 4], [0.1, 0.5, 0.7, 9.0]) == pytest.approx(1.0)
    assert spread_error_rank([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spread_error_rank([1, 1, 1, 1], [1, 2, 3, 4]))  # constant spread
    assert math.isnan(spread_error_rank([1, 2, np.nan], [1, 2, 3]))  # two pairs
    with pytest.raises(ConfigError, match="'abs_error'.*shape of spread"):
        spread_error_rank([1, 2, 3], [1, 2])
    with pytest.raises(ConfigError, match="'spread' = -1.0"):
        spread_error_rank([1, -1, 3], [1, 2, 3])


def test_plot_writes_a_png(tmp_path):
    labels, probs = _draw(9, 300)
    calibrated = apply_temperature(probs_to_logits(probs), 1.5)
    path = plot_reliability(labels, probs, tmp_path / "sub" / "bace.png", calibrated, title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5000
    assert sorted(p.name for p in path.parent.iterdir()) == ["bace.png"]  # no leftover temp


def test_bad_input_is_refused_with_the_field_named():
    with pytest.raises(ConfigError, match="'probs'.*shape of labels"):
        expected_calibration_error([0, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ConfigError, match="'labels' = 0.5"):
        reliability([0, 0.5], [0.1, 0.2])
    with pytest.raises(ConfigError, match="'probs' = 1.2"):
        reliability([0, 1], [0.1, 1.2])
    with pytest.raises(ConfigError, match="'n_bins' = 0"):
        reliability([0, 1], [0.1, 0.2], n_bins=0)
    with pytest.raises(ConfigError, match="'bounds'"):
        fit_temperature([0, 1], [0.1, 0.2], bounds=(2.0, 3.0))
    with pytest.raises(ConfigError, match="'temperature'"):
        apply_temperature([[0.1, 0.2]], [1.0, 0.0])
    with pytest.raises(ConfigError, match="'logits'.*shape of labels"):
        fit_temperature(np.zeros((3, 2)), np.zeros((3, 1)))
