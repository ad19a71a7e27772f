"""Split-conformal sets and intervals: exact thresholds, coverage over many random draws of
data with a known distribution, set sizes, Gaussian widths, storage, and bad input."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import norm

from smiexlm.errors import ConfigError
from smiexlm.trust.calibration import apply_temperature, probs_to_logits
from smiexlm.trust.conformal import (
    ClassificationCalibrator,
    RegressionCalibrator,
    conformal_quantile,
    difficulty,
    min_calibration,
)
from smiexlm.trust.sets import coverage, mean_set_size, mean_width

ALPHA = 0.1


def _bernoulli(rng: np.random.Generator, n: int, a: float = 1.0, b: float = 1.0):
    """Labels drawn from known probabilities ``p ~ Beta(a, b)``: ``(labels, p)``."""
    p = rng.beta(a, b, n)
    return (rng.uniform(size=n) < p).astype(float), p


@pytest.mark.parametrize("n", [3, 9, 10, 19, 29, 50, 99, 100, 999])
@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.1, 0.2, 0.29, 0.3, 0.5])
def test_threshold_is_the_exact_order_statistic(n, alpha):
    scores = np.random.default_rng(n).permutation(np.arange(1, n + 1, dtype=float))
    k = math.ceil((n + 1) * (1 - Fraction(str(alpha))))  # exact rational arithmetic
    expected = float(k) if k <= n else math.inf  # the k-th smallest of 1..n is k
    assert conformal_quantile(scores, alpha) == expected
    assert (n >= min_calibration(alpha)) == (k <= n)


def test_min_calibration_by_hand():
    assert [min_calibration(a) for a in (0.5, 0.3, 0.2, 0.1, 0.05)] == [1, 3, 4, 9, 19]


@pytest.mark.parametrize("mondrian", [False, True])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2, 0.25])
def test_sets_are_the_classes_whose_crepes_p_value_exceeds_alpha(mondrian, alpha):
    rng = np.random.default_rng(1)
    y, p = _bernoulli(rng, 399 + 150)  # 400 = n + 1: alpha (n + 1) is a whole number
    p = np.round(p, 2)  # tied scores too
    calibrator = ClassificationCalibrator(y[:399], p[:399])
    sets = calibrator.sets(p[399:], alpha, mondrian)
    assert np.array_equal(sets.members, calibrator.p_values(p[399:], mondrian) > alpha)


@pytest.mark.parametrize("n_cal", [50, 99])
def test_marginal_coverage_over_many_draws_is_one_minus_alpha(n_cal):
    """Scores are continuous (no ties), so the mean coverage is exactly 1 - m / (n + 1)."""
    rng = np.random.default_rng(n_cal)
    covered = []
    for _ in range(1500):
        y, p = _bernoulli(rng, n_cal + 200)
        p_model = p**3  # badly calibrated: conformal coverage does not need calibration
        sets = ClassificationCalibrator(y[:n_cal], p_model[:n_cal]).sets(p_model[n_cal:], ALPHA)
        covered.append(coverage(y[n_cal:], sets).pooled)
    mean = float(np.mean(covered))
    exact = 1 - math.floor(ALPHA * (n_cal + 1)) / (n_cal + 1)
    assert abs(mean - exact) < 0.005  # about 3.5 standard errors
    assert 1 - ALPHA - 0.005 <= mean <= 1 - ALPHA + 1 / (n_cal + 1) + 0.005


def test_mondrian_covers_each_class_where_marginal_misses_the_rare_one():
    rng = np.random.default_rng(2)
    by_class = {False: [], True: []}
    for _ in range(400):
        y, p = _bernoulli(rng, 600 + 300, a=1.0, b=6.0)  # about 1 positive in 7
        calibrator = ClassificationCalibrator(y[:600], p[:600])
        positives = np.where(y[600:] == 1, 1.0, np.nan)
        for mondrian in (False, True):
            sets = calibrator.sets(p[600:], ALPHA, mondrian=mondrian)
            by_class[mondrian].append(coverage(positives, sets).pooled)
    assert np.mean(by_class[True]) >= 1 - ALPHA - 0.01
    assert np.mean(by_class[True]) <= 1 - ALPHA + 0.03
    assert np.mean(by_class[False]) < 0.6  # measured 0.31


def test_a_perfect_model_gives_singletons_and_an_uninformed_one_the_full_set():
    rng = np.random.default_rng(3)
    y, _ = _bernoulli(rng, 300)
    sharp = np.where(y == 1, 0.98, 0.02)
    sets = ClassificationCalibrator(y[:100], sharp[:100]).sets(sharp[100:], ALPHA)
    assert np.all(sets.size == 1)
    assert coverage(y[100:], sets).pooled == 1.0
    assert set(sets.labels()[:, 0]) == {"{0}", "{1}"}
    flat = np.full(300, 0.5)
    sets = ClassificationCalibrator(y[:100], flat[:100]).sets(flat[100:], ALPHA)
    assert np.all(sets.size == 2) and set(sets.labels()[:, 0]) == {"{0,1}"}


def test_empty_sets_and_missing_scores_are_told_apart():
    y = np.tile([0.0, 1.0], 50)
    calibrator = ClassificationCalibrator(y, np.where(y == 1, 0.9, 0.1))  # threshold 0.1
    sets = calibrator.sets([[0.5], [np.nan], [0.95], [0.05]], ALPHA)
    assert sets.labels()[:, 0].tolist() == ["{}", "", "{1}", "{0}"]
    assert np.array_equal(sets.size[:, 0], [0, np.nan, 1, 1], equal_nan=True)
    cov = coverage([[1.0], [1.0], [1.0], [np.nan]], sets)
    assert cov.count.tolist() == [2] and cov.pooled == 0.5  # the NaN score is not counted
    assert mean_set_size(sets).pooled == pytest.approx(2 / 3)
    assert mean_set_size(sets, [[1.0], [1.0], [1.0], [np.nan]]).pooled == 0.5


def test_tasks_are_calibrated_apart_with_missing_labels_masked():
    rng = np.random.default_rng(4)
    y, p = _bernoulli(rng, 400)
    y2, p2 = _bernoulli(rng, 400, 2.0, 2.0)
    y2[::3] = np.nan
    both = ClassificationCalibrator(np.c_[y, y2][:200], np.c_[p, p2][:200])
    alone = ClassificationCalibrator(y2[:200][~np.isnan(y2[:200])], p2[:200][~np.isnan(y2[:200])])
    assert both.thresholds(ALPHA)[1, 0] == alone.thresholds(ALPHA)[0, 0]
    sets = both.sets(np.c_[p, p2][200:], ALPHA)
    assert coverage(np.c_[y, y2][200:], sets).count.tolist() == [200, 133]


def test_sets_do_not_change_under_temperature_scaling():
    """sigmoid(z / t) is monotone and symmetric, so both class scores keep their order."""
    rng = np.random.default_rng(5)
    y, p = _bernoulli(rng, 500)
    z = probs_to_logits(p)
    before = ClassificationCalibrator(y[:250], p[:250]).sets(p[250:], ALPHA)
    scaled = apply_temperature(z, 2.7)[:, 0]
    after = ClassificationCalibrator(y[:250], scaled[:250]).sets(scaled[250:], ALPHA)
    assert np.array_equal(before.members, after.members)


def test_gaussian_interval_width_is_the_analytic_quantile():
    rng = np.random.default_rng(6)
    sigma, n_cal, halves, covered = 1.7, 999, [], []
    for _ in range(200):
        truth = rng.normal(size=n_cal + 500)
        y = truth + rng.normal(scale=sigma, size=truth.size)
        calibrator = RegressionCalibrator(y[:n_cal], truth[:n_cal])
        intervals = calibrator.intervals(truth[n_cal:], ALPHA)
        assert np.allclose(intervals.width, 2 * calibrator.quantiles(ALPHA)[0])
        halves.append(calibrator.quantiles(ALPHA)[0])
        covered.append(coverage(y[n_cal:], intervals).pooled)
    assert np.mean(halves) == pytest.approx(sigma * norm.ppf(1 - ALPHA / 2), rel=0.01)
    assert abs(np.mean(covered) - (1 - ALPHA)) < 0.005


def test_normalised_intervals_follow_the_spread_and_cover_the_noisy_molecules():
    rng = np.random.default_rng(7)
    n = 20000
    spread = rng.uniform(0.2, 2.0, n)
    truth = rng.normal(size=n)
    y = truth + rng.normal(size=n) * spread
    cal, test = slice(0, 5000), slice(5000, None)
    noisy = np.where(spread[test] > 1.55, y[test], np.nan)  # the noisiest quarter
    plain = RegressionCalibrator(y[cal], truth[cal]).intervals(truth[test], ALPHA)
    normalised = RegressionCalibrator(y[cal], truth[cal], spread[cal])
    intervals = normalised.intervals(truth[test], ALPHA, spread=spread[test])
    assert normalised.quantiles(ALPHA)[0] == pytest.approx(norm.ppf(1 - ALPHA / 2), rel=0.03)
    assert np.allclose(intervals.width[:, 0], 2 * normalised.quantiles(ALPHA)[0] * spread[test])
    assert coverage(noisy, intervals).pooled == pytest.approx(1 - ALPHA, abs=0.015)
    assert coverage(noisy, plain).pooled < 1 - ALPHA - 0.08  # one width misses them
    assert coverage(y[test], intervals).pooled == pytest.approx(1 - ALPHA, abs=0.01)
    assert mean_width(intervals).count.tolist() == [15000]


def test_normalised_sets_by_brute_force_and_crepes():
    """Class c is in the set when (1 - P(c)) / sigma is at most the k-th smallest calibration
    score (1 - P(y)) / sigma, k = ceil((n + 1)(1 - alpha)), counted by hand on a tiny case;
    the same classes as crepes' p-values above alpha."""
    y = np.array([1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 0], float)
    rng = np.random.default_rng(11)
    p, sigma = rng.uniform(size=y.size), rng.uniform(0.05, 0.5, y.size)
    p_query, sigma_query = rng.uniform(size=30), rng.uniform(0.05, 0.5, 30)
    for alpha in (0.1, 0.2, 0.35):
        calibration = sorted((1 - p[i] if y[i] == 1 else p[i]) / sigma[i] for i in range(y.size))
        k = math.ceil((y.size + 1) * (1 - alpha))
        q = calibration[k - 1]
        expected = [[p_query[i] / sigma_query[i] <= q, (1 - p_query[i]) / sigma_query[i] <= q]
                    for i in range(30)]  # fmt: skip
        calibrator = ClassificationCalibrator(y, p, sigma)
        sets = calibrator.sets(p_query, alpha, difficulty=sigma_query)
        assert sets.members[:, 0].tolist() == expected
        assert np.array_equal(sets.members, calibrator.p_values(p_query, difficulty=sigma_query) > alpha)  # fmt: skip


def _hard_and_easy(rng: np.random.Generator, n: int, hard_share: float):
    """Labels, a blend of two members, its difficulty and which molecules are hard: the
    members err and disagree in proportion to a molecule's hardness."""
    h = np.where(rng.uniform(size=n) < hard_share, rng.uniform(0.6, 1, n), rng.uniform(0, 0.2, n))
    truth = rng.choice([0.05, 0.95], n)
    y = (rng.uniform(size=n) < truth).astype(float)
    error = rng.normal(size=n) * 0.45 * h
    members = [np.clip(truth + error + rng.normal(size=n) * 0.25 * h, 0.001, 0.999)[:, None]
               for _ in range(2)]  # fmt: skip
    return y, (members[0] + members[1]) / 2, difficulty(members), h > 0.5


def test_difficulty_widens_the_hard_molecules_sets_and_holds_under_a_harder_test_set():
    """Normalised sets keep 1 - alpha over exchangeable draws and cover the hard molecules
    better than one threshold for all; when the test molecules are harder than the
    calibration ones (60 % hard against 10 %), they still cover about 1 - alpha where one
    threshold falls far below (measured 0.88 against 0.73)."""
    rng = np.random.default_rng(12)
    got = {"exchangeable": [], "shifted": []}
    for case, shares in (("exchangeable", (0.3, 0.3)), ("shifted", (0.1, 0.6))):
        for _ in range(150):
            y, p, sigma, _ = _hard_and_easy(rng, 400, shares[0])
            y_test, p_test, sigma_test, hard = _hard_and_easy(rng, 300, shares[1])
            plain = ClassificationCalibrator(y, p).sets(p_test, ALPHA)
            normalised = ClassificationCalibrator(y, p, sigma).sets(p_test, ALPHA,
                                                                    difficulty=sigma_test)  # fmt: skip
            hard_y = np.where(hard[:, None], y_test[:, None], np.nan)
            got[case].append([coverage(y_test, plain).pooled, coverage(y_test, normalised).pooled,
                              coverage(hard_y, plain).pooled, coverage(hard_y, normalised).pooled])  # fmt: skip
    exchangeable, shifted = (np.mean(got[c], axis=0) for c in ("exchangeable", "shifted"))
    assert abs(exchangeable[0] - (1 - ALPHA)) < 0.01 and abs(exchangeable[1] - (1 - ALPHA)) < 0.01
    assert exchangeable[3] > exchangeable[2] + 0.05  # measured 0.87 against 0.78
    assert shifted[1] > 0.86 and shifted[0] < 0.78


def test_difficulty_is_the_members_spread_plus_its_floor():
    a, b = np.array([[0.2, 0.9]]), np.array([[0.6, 0.9]])
    assert np.allclose(difficulty([a, b]), [[0.2 + 0.01, 0.01]])
    assert np.allclose(difficulty([a, b], floor=0.5), [[0.7, 0.5]])
    with pytest.raises(ConfigError, match="'members'.*at least two"):
        difficulty([a])
    with pytest.raises(ConfigError, match="'floor'"):
        difficulty([a, b], floor=0)
    calibrator = ClassificationCalibrator([0.0, 1.0] * 20, [0.2, 0.8] * 20, [0.1] * 40)
    with pytest.raises(ConfigError, match="'difficulty'.*calibration was normalised"):
        calibrator.sets([0.5], ALPHA)
    with pytest.raises(ConfigError, match="'difficulty'.*> 0"):
        calibrator.sets([0.5], ALPHA, difficulty=[0.0])
    with pytest.raises(ConfigError, match="'difficulty'"):
        ClassificationCalibrator([0.0, 1.0] * 20, [0.2, 0.8] * 20).sets([0.5], ALPHA,
                                                                      difficulty=[0.1])  # fmt: skip
    with pytest.raises(ConfigError, match="'difficulty'.*shape"):
        ClassificationCalibrator([0.0, 1.0] * 20, [0.2, 0.8] * 20, [0.1] * 39)


def test_calibrators_are_rebuilt_from_their_arrays_in_safetensors(tmp_path):
    from safetensors.numpy import load_file, save_file

    rng = np.random.default_rng(8)
    y, p = _bernoulli(rng, 300)
    y[::5] = np.nan
    built = ClassificationCalibrator(y[:200, None], p[:200, None])
    save_file(built.to_arrays(), tmp_path / "classification.safetensors")
    rebuilt = ClassificationCalibrator.from_arrays(
        load_file(tmp_path / "classification.safetensors")
    )
    for mondrian in (False, True):
        assert np.array_equal(built.sets(p[200:], 0.2, mondrian).members,
                              rebuilt.sets(p[200:], 0.2, mondrian).members)  # fmt: skip
    hard = rng.uniform(0.05, 0.5, (300, 1))
    normalised = ClassificationCalibrator(y[:200, None], p[:200, None], hard[:200])
    save_file(normalised.to_arrays(), tmp_path / "normalised.safetensors")
    again = ClassificationCalibrator.from_arrays(load_file(tmp_path / "normalised.safetensors"))
    assert again.normalised
    assert np.array_equal(normalised.sets(p[200:], 0.2, difficulty=hard[200:]).members,
                          again.sets(p[200:], 0.2, difficulty=hard[200:]).members)  # fmt: skip
    spread = rng.uniform(0.5, 1.5, 300)
    reg = RegressionCalibrator(p[:200] + spread[:200], p[:200], spread[:200])
    save_file(reg.to_arrays(), tmp_path / "regression.safetensors")
    again = RegressionCalibrator.from_arrays(load_file(tmp_path / "regression.safetensors"))
    assert again.normalised
    assert np.array_equal(reg.intervals(p[200:], ALPHA, spread[200:]).low,
                          again.intervals(p[200:], ALPHA, spread[200:]).low)  # fmt: skip


@pytest.mark.parametrize("alpha", [0, 1, -0.1, 1.5, float("nan"), True, "0.1", None])
def test_alpha_outside_zero_one_is_refused(alpha):
    calibrator = ClassificationCalibrator([0.0, 1.0] * 20, [0.2, 0.8] * 20)
    with pytest.raises(ConfigError, match="'alpha'.*strictly between 0 and 1"):
        calibrator.sets([0.5], alpha)
    with pytest.raises(ConfigError, match="'alpha'"):
        RegressionCalibrator([1.0] * 20, [0.0] * 20).intervals([0.0], alpha)


def test_a_calibration_set_too_small_says_the_minimum():
    y = np.array([0, 1, 0, 1, 0, np.nan, 1, 0.0])  # 7 labelled
    calibrator = ClassificationCalibrator(y, np.full(8, 0.3))
    with pytest.raises(ConfigError, match="n = 7 calibration scores.*needs at least 9"):
        calibrator.sets([0.5], 0.1)
    assert calibrator.sets([0.5], 0.2).members.shape == (1, 1, 2)  # 4 are enough at 0.2
    with pytest.raises(ConfigError, match="class 1 of task 0, which has n = 3"):
        calibrator.sets([0.5], 0.2, mondrian=True)
    full = calibrator.sets([0.5, 0.01], 0.1, too_small="full")
    assert full.labels()[:, 0].tolist() == ["{0,1}", "{0,1}"]
    wide = RegressionCalibrator([1.0, 2.0], [1.5, 1.5]).intervals([0.0], 0.1, too_small="full")
    assert wide.low[0, 0] == -np.inf and wide.high[0, 0] == np.inf
    with pytest.raises(ConfigError, match="'too_small'"):
        calibrator.sets([0.5], 0.2, too_small="skip")


def test_unbounded_intervals_and_full_sets_say_why_once(caplog, monkeypatch):
    """too_small="full" gives (-inf, inf) or every class where the calibration molecules are
    fewer than 1/alpha - 1: one warning says how many there are, how many alpha needs and
    what to do, once however often the same calibration is asked (predict asks per chunk)."""
    import logging

    from smiexlm.trust import conformal
    from smiexlm.trust.shift import Shift

    monkeypatch.setattr(conformal, "_SAID", set())
    y = np.array([0, 1, 0, 1, 0, np.nan, 1, 0.0])  # 7 labelled
    with caplog.at_level(logging.WARNING, logger="smiexlm.trust.conformal"):
        for _ in range(2):
            wide = RegressionCalibrator(y[:, None], np.full((8, 1), 0.5), names=["logS"])
            assert np.isinf(wide.intervals([[0.0]], 0.1, too_small="full").high).all()
        ClassificationCalibrator(y, np.full(8, 0.3)).sets([0.5], 0.1, too_small="full")
        ClassificationCalibrator(y, np.full(8, 0.3)).sets([0.5], 0.2, True, too_small="full")
        RegressionCalibrator([1.0] * 20, [0.0] * 20).intervals([0.0], 0.1, too_small="full")
        bins = Shift(bins=(np.array([0] * 18 + [1] * 2), np.array([0, 1])))  # bin 1: 2 of 20
        RegressionCalibrator([1.0] * 20, [0.0] * 20).intervals([0.0, 0.0], 0.1, too_small="full",
                                                               shift=bins)  # fmt: skip
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "conformal alpha 0.1: task 'logS' has 7 calibration molecule(s) (its labelled "
        "validation molecules) and needs at least 9 at that alpha, so its intervals are "
        "(-inf, inf); use a larger alpha (at least 1/(n + 1) = 0.125) or more validation "
        "molecules",
        "conformal alpha 0.1: task 0 has 7 calibration molecule(s) (its labelled validation "
        "molecules) and needs at least 9 at that alpha, so its sets hold both classes; use a "
        "larger alpha (at least 1/(n + 1) = 0.125) or more validation molecules",
        "conformal alpha 0.2: class 1 of task 0 has 3 calibration molecule(s) (its labelled "
        "validation molecules) and needs at least 4 at that alpha, so class 1 is in every set; "
        "use a larger alpha (at least 1/(n + 1) = 0.25) or more validation molecules",
        "conformal alpha 0.1: for 50% of the molecules, task 0's calibration by distance bin "
        "or weight rests on too few of its 20 calibration molecules (at least 9 at that "
        "alpha), so its intervals are (-inf, inf) for them; use a larger alpha or more "
        "validation molecules",
    ]  # 20 molecules are enough at 0.1 for split conformal: nothing to say


def test_shapes_and_values_that_disagree_are_refused():
    with pytest.raises(ConfigError, match="'scores'.*shape of labels, \\(10, 2\\)"):
        ClassificationCalibrator(np.zeros((10, 2)), np.zeros((10, 3)))
    calibrator = ClassificationCalibrator(np.tile([0.0, 1.0], (20, 1)), np.full((20, 2), 0.4))
    with pytest.raises(ConfigError, match="1 task column.*expected 2"):
        calibrator.sets(np.zeros((5, 1)), ALPHA)
    with pytest.raises(ConfigError, match="'labels' = 2.0: expected 0 or 1"):
        ClassificationCalibrator([0.0, 2.0], [0.1, 0.2])
    with pytest.raises(ConfigError, match="'scores' = 1.5: expected probabilities"):
        ClassificationCalibrator([0.0, 1.0], [0.1, 1.5])
    with pytest.raises(ConfigError, match="finite score for every labelled molecule \\(row 1"):
        ClassificationCalibrator([0.0, 1.0], [0.1, np.nan])
    with pytest.raises(ConfigError, match="'labels'.*the shape of the predictions"):
        coverage(np.zeros((4, 1)), calibrator.sets(np.zeros((5, 2)), ALPHA))
    normalised = RegressionCalibrator(np.arange(20.0), np.zeros(20), np.ones(20))
    with pytest.raises(ConfigError, match="'spread'.*expected a spread"):
        normalised.intervals([0.0], ALPHA)
    with pytest.raises(ConfigError, match="'spread' = 0.0.*row 3, task 0"):
        normalised.intervals(np.zeros(5), ALPHA, spread=[1, 1, 1, 0, 1])
    with pytest.raises(ConfigError, match="'spread'.*expected None"):
        RegressionCalibrator(np.arange(20.0), np.zeros(20)).intervals([0.0], ALPHA, [1.0])


def test_coverage_of_intervals_counts_the_bounds_and_skips_missing():
    rng = np.random.default_rng(9)
    y = rng.normal(size=40)
    calibrator = RegressionCalibrator(y, np.zeros(40))
    q = calibrator.quantiles(ALPHA)[0]
    intervals = calibrator.intervals([0.0, 0.0, 0.0, np.nan], ALPHA)
    labels = [q, -q - 1e-9, np.nan, 0.0]  # on the bound, just outside, unlabelled, unscored
    result = coverage(labels, intervals)
    assert (result.pooled, result.count.tolist()) == (0.5, [2])
    assert mean_width(intervals).pooled == pytest.approx(2 * q)


# --- shift-aware calibration: Mondrian by distance, weighted by covariate shift ---


def test_weighted_thresholds_with_equal_weights_are_split_conformal():
    from smiexlm.trust.shift import weighted_thresholds

    rng = np.random.default_rng(3)
    for n in (1, 5, 9, 19, 40):
        scores = rng.random(n)
        for alpha in (0.05, 0.1, 0.2, 0.5):
            got = weighted_thresholds(scores, np.ones(n), np.ones(4), alpha)
            assert (got == conformal_quantile(scores, alpha)).all(), (n, alpha)


def test_weighted_thresholds_by_brute_force():
    """The smallest calibration score s whose weighted share of scores at most s, over the
    calibration weights plus the query's own, reaches 1 - alpha."""
    from smiexlm.trust.shift import weighted_thresholds

    rng = np.random.default_rng(4)
    scores, weights = rng.random(12), rng.uniform(0.1, 3.0, 12)
    query = rng.uniform(0.1, 3.0, 6)
    for alpha in (0.1, 0.3):
        got = weighted_thresholds(scores, weights, query, alpha)
        for w, q in zip(query, got, strict=True):
            ok = [s for s in sorted(scores)
                  if weights[scores <= s].sum() / (weights.sum() + w) >= 1 - alpha - 1e-12]  # fmt: skip
            assert q == (ok[0] if ok else np.inf)


def test_distance_bins_give_far_molecules_their_own_threshold():
    """Far calibration molecules are harder: Mondrian by distance widens the far query's set
    and narrows the near one's, each bin's threshold being split-conformal on its molecules."""
    from smiexlm.trust.shift import Shift, distance_bins, outside_calibration

    rng = np.random.default_rng(5)
    n = 300
    near = rng.uniform(0.2, 1.0, n)  # nearest similarity to the training molecules
    y = rng.integers(0, 2, n).astype(float)
    noise = (1.0 - near) * 0.9  # the farther, the worse the model
    p = np.clip(np.where(y == 1, 1 - noise * rng.random(n), noise * rng.random(n)), 0, 1)
    query_near = np.array([0.95, 0.5, 0.25, 0.1])
    cal_bins, query_bins, edges = distance_bins(near, query_near, 0.1)
    assert len(edges) == 2 and list(query_bins) == [2, 1, 0, 0]
    assert list(outside_calibration(near, query_near)) == [False, False, False, True]
    calibrator = ClassificationCalibrator(y[:, None], p[:, None])
    shift = Shift(bins=(cal_bins, query_bins))
    q = np.full(4, 0.5)[:, None]
    sets = calibrator.sets(q, 0.1, shift=shift)
    scores = np.where(y == 1, 1 - p, p)
    for i, b in enumerate(query_bins):
        threshold = conformal_quantile(scores[cal_bins == b], 0.1)
        assert sets.members[i, 0, 1] == (threshold >= 0.5)
    per_bin = [conformal_quantile(scores[cal_bins == b], 0.1) for b in range(3)]
    assert per_bin[0] > per_bin[1] > per_bin[2]  # far molecules get wider sets
    # few calibration molecules: fewer bins, never one below the minimum for alpha
    assert len(distance_bins(near[:30], query_near, 0.1)[2]) == 0


def test_shifted_intervals_follow_their_bin_and_weights_move_the_quantile():
    from smiexlm.trust.shift import Shift

    rng = np.random.default_rng(6)
    n = 200
    far = rng.random(n) < 0.5
    y = rng.normal(size=n)
    pred = y + rng.normal(size=n) * np.where(far, 2.0, 0.2)
    calibrator = RegressionCalibrator(y[:, None], pred[:, None])
    bins = Shift(bins=(far.astype(int), np.array([0, 1])))
    got = calibrator.intervals(np.zeros((2, 1)), 0.1, shift=bins)
    residual = np.abs(y - pred)
    assert got.high[0, 0] == conformal_quantile(residual[~far], 0.1)
    assert got.high[1, 0] == conformal_quantile(residual[far], 0.1)
    # weights that favour the far calibration molecules widen the interval towards theirs
    weighted = Shift(weights=(np.where(far, 10.0, 0.1), np.array([1.0])))
    wide = calibrator.intervals(np.zeros((1, 1)), 0.1, shift=weighted).high[0, 0]
    assert got.high[0, 0] < wide <= got.high[1, 0] * 1.05


def test_covariate_weights_find_the_query_side():
    from smiexlm.trust.shift import covariate_weights

    rng = np.random.default_rng(7)
    cal = rng.normal(0.0, 1.0, (300, 2))
    query = rng.normal(1.0, 1.0, (300, 2))
    w_cal, w_query = covariate_weights(cal, query)
    # calibration molecules that look like the queries weigh more
    from scipy.stats import spearmanr

    assert spearmanr(cal.sum(axis=1), w_cal).statistic > 0.95
    assert w_query.mean() > w_cal.mean()
    one = covariate_weights(cal, query[:1])  # one query molecule: no shift to estimate
    assert (one[0] == 1).all() and (one[1] == 1).all()
