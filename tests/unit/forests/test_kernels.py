"""Kernel members against scikit-learn: the Tanimoto kernel by hand, the served prediction
equal to an SVR fitted on the same precomputed kernel, and folds that keep scaffolds whole."""

from __future__ import annotations

import numpy as np
import pytest

from smiexlm.chemistry.fingerprints import bit_tanimoto as tanimoto
from smiexlm.errors import ConfigError, DataError
from smiexlm.forests.kernels import KernelInputs, KernelMember, fit_kernel_member, rbf


def _data(n: int = 80, seed: int = 0):
    rng = np.random.default_rng(seed)
    bits = (rng.random((n, 64)) < 0.2).astype(np.uint8)
    vectors = rng.normal(size=(n, 6)).astype(np.float32)
    y = bits[:, :8].sum(1, keepdims=True) + vectors[:, :1] + 0.1 * rng.normal(size=(n, 1))
    return KernelInputs(bits, vectors), y, rng.integers(0, 12, size=n)


def test_tanimoto_and_rbf_by_hand():
    a = np.array([[1, 1, 0, 0], [0, 0, 0, 0]], np.uint8)
    b = np.array([[1, 0, 1, 0], [0, 0, 0, 0]], np.uint8)
    np.testing.assert_allclose(tanimoto(a, b), [[1 / 3, 0.0], [0.0, 0.0]])
    x, z = np.array([[0.0, 1.0]]), np.array([[2.0, 1.0], [0.0, 1.0]])
    np.testing.assert_allclose(rbf(x, z, 0.5), [[np.exp(-0.5 * 4 / 2), 1.0]])


@pytest.mark.parametrize("kind", ["tanimoto", "rbf", "both"])
def test_the_member_predicts_as_an_svr_on_the_same_kernel(kind):
    from sklearn.svm import SVR

    from smiexlm.forests.kernels import EPSILON, kernel_matrix

    inputs, y, groups = _data()
    member, oof = fit_kernel_member(kind, inputs, y, groups)
    assert oof.shape == y.shape and not np.isnan(oof).any()
    assert member.cv_score == pytest.approx(float(np.sqrt(np.mean((oof - y) ** 2))))
    assert min(member.tried.values()) == pytest.approx(member.cv_score, abs=1e-5)
    new, _, _ = _data(20, seed=1)
    z = member.standardised(inputs)
    k = kernel_matrix(kind, z, z, member.gamma)
    mean, std = y.mean(), y.std() + 1e-12
    svr = SVR(kernel="precomputed", C=member.C, epsilon=EPSILON).fit(k, (y[:, 0] - mean) / std)
    expected = svr.predict(kernel_matrix(kind, member.standardised(new), z, member.gamma))
    np.testing.assert_allclose(
        member.predict(new)[:, 0], expected * std + mean, rtol=1e-9, atol=1e-9
    )
    stored = KernelMember.from_stored(member.record(), member.tensors(), "member")
    np.testing.assert_array_equal(stored.predict(new), member.predict(new))


def test_folds_keep_each_scaffold_whole_and_missing_labels_take_no_part():
    from smiexlm.forests.kernels import _folds

    _, _, groups = _data()
    for fit_rows, held in _folds(groups, len(groups)):
        assert not set(groups[fit_rows]) & set(groups[held])
    inputs, y, groups = _data()
    y = np.hstack([y, y * 2])
    y[:10, 1] = np.nan
    member, oof = fit_kernel_member("tanimoto", inputs, y, groups)
    assert member.coef.shape[1] == 2 and np.isfinite(member.predict(inputs)).all()


def test_bad_kernels_and_damaged_members_are_refused():
    inputs, y, groups = _data(30)
    with pytest.raises(ConfigError, match="kernel"):
        fit_kernel_member("linear", inputs, y, groups)
    member, _ = fit_kernel_member("tanimoto", inputs, y, groups)
    arrays = member.tensors()
    del arrays["bits"]
    with pytest.raises(DataError, match="expected a kernel member"):
        KernelMember.from_stored(member.record(), arrays, "x.safetensors")


def test_the_classifier_scores_as_a_balanced_svc_and_is_chosen_by_roc_auc():
    from sklearn.metrics import roc_auc_score
    from sklearn.svm import SVC

    from smiexlm.forests.kernels import fit_kernel_member, kernel_matrix

    inputs, y, groups = _data()
    labels = np.hstack([(y > np.median(y)).astype(float), np.zeros_like(y)])  # 2nd: one class
    labels[:5, 0] = np.nan
    member, oof = fit_kernel_member("tanimoto", inputs, labels, groups, "classification")
    assert member.task_type == "classification" and member.cv_metric == "roc_auc"
    rows = ~np.isnan(labels[:, 0])
    assert member.cv_score == pytest.approx(roc_auc_score(labels[rows, 0], oof[rows, 0]))
    assert max(member.tried.values()) == pytest.approx(member.cv_score, abs=1e-5)
    new, _, _ = _data(20, seed=1)
    labelled = inputs.take(np.flatnonzero(rows))
    k = kernel_matrix("tanimoto", labelled, labelled, None)
    svc = SVC(kernel="precomputed", C=member.C, class_weight="balanced").fit(k, labels[rows, 0])
    expected = svc.decision_function(kernel_matrix("tanimoto", new, labelled, None))
    scores = member.predict(new)
    np.testing.assert_allclose(scores[:, 0], expected, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(scores[:, 1], -1.0)  # a label of one class: its sign
    stored = KernelMember.from_stored(member.record(), member.tensors(), "member")
    assert (stored.task_type, stored.cv_score) == ("classification", member.cv_score)
    np.testing.assert_array_equal(stored.predict(new), scores)
