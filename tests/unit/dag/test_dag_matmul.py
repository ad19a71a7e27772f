"""The banded matrix-product DAG loss against the exact log-space reference: wide spreads that
need several bands, the sequences it must hand to the log-space recursion, low precision."""

from __future__ import annotations

import pytest
import torch

from tests.unit.dag.test_dag import random_batch


def _both(em, links, s, m):
    """(log-likelihood, emission grad, link grad) by the reference and by the matmul path."""
    from smiexlm.dag.matmul import matmul_log_likelihood
    from smiexlm.dag.reference import reference_log_likelihood

    out = []
    for fn in (reference_log_likelihood, matmul_log_likelihood):
        e, lk = em.clone().requires_grad_(True), links.clone().requires_grad_(True)
        ll = fn(e, lk, s, m)
        torch.where(torch.isfinite(ll), ll, 0.0).sum().backward()
        out.append((ll.detach(), e.grad, lk.grad))
    return out


def test_matmul_bands_match_reference_on_wide_spreads():
    """Emissions spread over thousands of nats need several bands; links stay within bounds,
    so the products are certified and no sequence goes to the log-space fallback."""
    from smiexlm.dag import matmul
    from smiexlm.dag.reference import prepare

    em, links, s, m = random_batch(B=5, M=9, L=24, seed=21, sparse=0.1)
    s[0], m[0] = 24, 9
    em = em * 60  # log-values of one step spread over ~2,000 nats
    e, lk = prepare(em, links, s, m)
    probs, shift, ok = matmul.link_probabilities(lk)
    assert bool(ok.all())
    alpha, fits = matmul.forward_alpha(e, probs, shift, matmul.window(s, m))
    assert bool(fits.all())
    assert matmul.banded(alpha[:1, 4].double())[0].shape[1] > 1  # several bands in play
    (ll_r, ge_r, gl_r), (ll_m, ge_m, gl_m) = _both(em, links, s, m)
    torch.testing.assert_close(ll_m, ll_r, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(ge_m, ge_r, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(gl_m, gl_r, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("case", ["far_links", "too_many_bands", "extreme_logits"])
def test_matmul_uncertified_sequences_fall_back_to_log_space(case):
    from smiexlm.dag import matmul
    from smiexlm.dag.reference import prepare

    em, links, s, m = random_batch(B=4, M=6, L=14, seed=5, sparse=0.1)
    if case == "far_links":  # one link 400 nats below the rest: products could underflow
        links[1, 0, 5] = -400.0
    elif case == "too_many_bands":  # a spread needing more than MAX_BANDS bands
        s[2], m[2] = 14, 6
        em[2] = em[2] * 2000
    else:  # logits at ±1e4 everywhere
        g = torch.Generator().manual_seed(0)
        em = torch.where(torch.rand(em.shape, generator=g) < 0.5, -1e4, 1e4).double()
        links = torch.where(torch.rand(links.shape, generator=g) < 0.5, -1e4, 1e4).double()
    e, lk = prepare(em, links, s, m)
    probs, shift, ok = matmul.link_probabilities(lk)
    _, fits = matmul.forward_alpha(e, probs, shift, matmul.window(s, m))
    assert not bool((ok & fits).all())  # the case really is outside the certified bounds
    (ll_r, ge_r, gl_r), (ll_m, ge_m, gl_m) = _both(em, links, s, m)
    for t in (ll_m, ge_m, gl_m):
        assert not torch.isnan(t).any()
    torch.testing.assert_close(ll_m, ll_r, rtol=1e-12, atol=1e-9)
    torch.testing.assert_close(ge_m, ge_r, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(gl_m, gl_r, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matmul_matches_reference_in_low_precision(dtype):
    """The SMILES shape as the model feeds it: log-softmax emissions and links in fp32/bf16."""
    from smiexlm.dag.matmul import matmul_log_likelihood
    from smiexlm.dag.reference import reference_log_likelihood

    g = torch.Generator().manual_seed(3)
    B, M, L = 32, 10, 40
    em = torch.log_softmax(4 * torch.randn(B, M, L, generator=g), 2).to(dtype)
    links = torch.log_softmax(4 * torch.randn(B, L, L, generator=g), 2).to(dtype)
    s = torch.randint(30, L + 1, (B,), generator=g)
    m = torch.randint(2, M + 1, (B,), generator=g)
    ref = reference_log_likelihood(em.double(), links.double(), s, m)
    got = matmul_log_likelihood(em, links, s, m)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-3)


def test_shipped_model_outputs_stay_inside_the_certified_bounds():
    """On a trained ExLM's own emissions and links every sequence takes the fast path."""
    from smiexlm import ExLMModel, SmilesTokenizer
    from smiexlm.cli.demo import DRUG_PANEL
    from smiexlm.dag import matmul
    from smiexlm.dag.gather import logsoftmax_gather
    from smiexlm.dag.reference import prepare
    from smiexlm.model.masking import mask_tokens
    from smiexlm.paths import ASSETS_DIR

    model = ExLMModel.from_pretrained(ASSETS_DIR / "twins" / "exlm").float().eval()
    batch = SmilesTokenizer().encode_batch([smiles for _, smiles, _ in DRUG_PANEL] * 4)
    g = torch.Generator().manual_seed(0)
    ids, labels = mask_tokens(batch.input_ids, batch.attention_mask, 0.3, generator=g)
    with torch.no_grad():
        out = model(ids, batch.attention_mask, labels)
        assert out.log_links is not None
        em = logsoftmax_gather(out.logits, out.targets.clamp_min(0))
    em, links = prepare(em, out.log_links, out.state_lengths, out.target_lengths)
    probs, shift, ok = matmul.link_probabilities(links)
    slack = matmul.window(out.state_lengths, out.target_lengths)
    _, fits = matmul.forward_alpha(em, probs, shift, slack)
    assert bool((ok & fits).all())
