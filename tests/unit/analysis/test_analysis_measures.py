"""Analysis measures on constructed inputs with known answers."""

from __future__ import annotations

import math

import pytest
import torch

from smiexlm.analysis import measures
from smiexlm.errors import ConfigError


def test_entropy_of_uniform_and_one_hot_distributions():
    for v in (2, 7, 369):
        h = measures.prediction_entropy_bits(torch.zeros(3, v))
        assert torch.allclose(h, torch.full((3,), math.log2(v), dtype=torch.float64))
    one_hot = torch.tensor([[0.0, 1e4, 0.0, 0.0]])
    assert measures.prediction_entropy_bits(one_hot).item() == pytest.approx(0.0, abs=1e-12)


def test_entropy_matches_a_direct_sum_in_bits():
    logits = torch.randn(5, 11, generator=torch.Generator().manual_seed(0))
    p = torch.softmax(logits.double(), -1)
    expected = -(p * torch.log2(p)).sum(-1)
    assert torch.allclose(measures.prediction_entropy_bits(logits), expected)
    two = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))  # 1.5 bits exactly
    assert measures.prediction_entropy_bits(two).item() == pytest.approx(1.5)


def test_effective_rank_of_matrices_of_known_rank():
    g = torch.Generator().manual_seed(1)
    for r in (1, 3, 10):
        h = torch.randn(200, r, generator=g) @ torch.randn(r, 32, generator=g)  # rank r
        assert measures.effective_rank(h, tau=1.0) == r
        assert measures.effective_rank(h, tau=0.9) <= r
    # Singular values 3, 2, 1 (squared 9, 4, 1 of 14): 9/14 < 0.9 <= 13/14.
    d = torch.diag(torch.tensor([3.0, 2.0, 1.0]))
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=g, dtype=torch.float64))
    h = q @ d.double()
    assert measures.effective_rank(h, 0.6) == 1
    assert measures.effective_rank(h, 0.9) == 2
    assert measures.effective_rank(h, 0.95) == 3
    assert measures.effective_rank(torch.zeros(4, 4)) == 0
    with pytest.raises(ConfigError, match="tau"):
        measures.effective_rank(h, 0.0)


def test_corrupted_ratio_of_a_fixed_mask_pattern():
    # Three tokens repeated k = 2 times: copies (0,0,1,1,2,2); tokens 0 and 2 fully masked.
    selected = torch.tensor([[True, True, False, True, True, True]])
    source = torch.tensor([[0, 0, 1, 1, 2, 2]])
    valid = torch.ones_like(selected)
    fully, present = measures.fully_masked_tokens(selected, source, valid, 3)
    assert fully.tolist() == [[True, False, True]] and present.all()
    counted = torch.ones(1, 3, dtype=torch.bool)
    assert measures.corrupted_ratio(selected, source, valid, counted) == pytest.approx(2 / 3)
    # Padding copies never count, and k = 1 gives the plain mask ratio.
    selected = torch.tensor([[True, False, True, False], [False, True, True, True]])
    source = torch.tensor([[0, 1, 2, 0], [0, 1, 2, 3]])
    valid = torch.tensor([[True, True, True, False], [True] * 4])
    counted = torch.tensor([[True, True, True, False], [True] * 4])
    assert measures.corrupted_ratio(selected, source, valid, counted) == pytest.approx(5 / 7)


def test_token_entropy_averages_copies_of_fully_masked_tokens_only():
    selected = torch.tensor([[True, True, True, False]])
    source = torch.tensor([[0, 0, 1, 1]])
    valid = torch.ones_like(selected)
    copy_h = torch.tensor([[1.0, 3.0, 9.0, 9.0]])
    out = measures.token_entropy_bits(
        copy_h, selected, source, valid, torch.ones(1, 2, dtype=torch.bool)
    )
    assert out.tolist() == [2.0]  # token 1 has a visible copy: excluded


def test_expected_ratio_and_variance_are_appendix_c():
    assert measures.expected_corrupted_ratio(0.387, 2) == pytest.approx(0.149769)
    assert measures.corrupted_ratio_variance(0.5, 2, 100) == pytest.approx(0.25 * 0.75 / 100)


@pytest.mark.parametrize(("k", "p"), [(1, 0.15), (2, 0.387), (4, 0.622)])
def test_independent_masks_stay_within_appendix_c_bound(k, p):
    """Bernoulli(p) masks of N tokens × k copies: |s − p^k| ≤ 5 σ with σ² = p^k(1−p^k)/N."""
    g = torch.Generator().manual_seed(k)
    n = 20_000
    selected = torch.rand(1, n * k, generator=g) < p
    source = torch.arange(n).repeat_interleave(k)[None]
    s = measures.corrupted_ratio(
        selected, source, torch.ones_like(selected), torch.ones(1, n, dtype=torch.bool)
    )
    sigma = math.sqrt(measures.corrupted_ratio_variance(p, k, n))
    assert abs(s - p**k) <= 5 * sigma


@pytest.mark.parametrize(("k", "p"), [(2, 0.387), (4, 0.622)])
def test_project_masking_of_repeated_tokens_matches_p_to_the_k(k, p):
    """``mask_tokens`` on ``repeat_tokens`` output: measured ratio within Appendix C's bound
    (fixed-count masking is hypergeometric, whose variance is below the Bernoulli one)."""
    from smiexlm.analysis.repeated_mlm import repeat_with_sources
    from smiexlm.model.masking import mask_tokens

    g = torch.Generator().manual_seed(7)
    ids = torch.randint(5, 40, (400, 30), generator=g)
    ids[:, 0], ids[:, -1] = 1, 2
    mask = torch.ones_like(ids, dtype=torch.bool)
    rep, rep_mask, source = repeat_with_sources(ids, mask, k)
    assert rep.shape[1] == 28 * k + 2
    assert torch.equal(ids.gather(1, source), rep)  # every copy reads its source token
    _, labels = mask_tokens(rep, rep_mask, mask_prob=p, generator=g)
    counted = ids >= 5
    s = measures.corrupted_ratio(labels != -100, source, rep_mask, counted)
    n = int(counted.sum())
    assert abs(s - p**k) <= 5 * math.sqrt(measures.corrupted_ratio_variance(p, k, n)) + 2 / n


def test_a_repeated_mlm_grid_whose_every_cell_is_skipped_is_refused():
    from smiexlm.analysis.repeated_mlm import RepeatedMLMConfig

    assert RepeatedMLMConfig(ks=(1, 4), ps=(0.15,)).cells() == [(1, 0.15)]
    with pytest.raises(ConfigError, match="every one would be skipped"):
        RepeatedMLMConfig(ks=(4,), ps=(0.15,))  # 0.15^4 = 0.0005 < 0.001


def test_two_checkpoints_of_one_name_keep_apart():
    """Two runs' ``checkpoints/last``: each keeps its row in the tables and its line in the
    plots, labelled by its path."""
    from smiexlm.analysis.inputs import checkpoint_labels

    folders = ["runA/checkpoints/last", "runD/checkpoints/last", "models/mtr"]
    assert checkpoint_labels(folders) == ["runA/checkpoints/last", "runD/checkpoints/last", "mtr"]


def test_a_repeated_mlm_cell_stopped_by_a_signal_is_not_recorded(tmp_path, monkeypatch):
    """A SIGTERM mid-cell: the grid stops, saying so, and writes no row for the cell (its
    weights were step 10's of 400); the next run goes on from the cell's checkpoint."""
    from types import SimpleNamespace

    import smiexlm.analysis.repeated_mlm as rm

    calls = []

    def stopped(config, data, run, max_steps, resume):
        calls.append(resume)
        return SimpleNamespace(interrupted_by="SIGTERM", step=10)

    monkeypatch.setattr(rm, "write_repeated_dataset", lambda *a: tmp_path / "data")
    monkeypatch.setattr(rm, "pretrain", stopped)
    config = rm.RepeatedMLMConfig(ks=(1,), ps=(0.15,), steps=400, downstream=False)
    with pytest.raises(SystemExit, match="k=1 p=0.15 stopped by SIGTERM at step 10"):
        rm._train_cell(tmp_path, tmp_path / "cell", 1, 0.15, config, [], None)
    assert calls == [False]
