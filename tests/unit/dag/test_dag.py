"""DAG alignment loss: the log-space reference and the banded matrix products, each against
brute-force path enumeration, and the two against each other."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from smiexlm.dag import dag_best_alignment, dag_log_likelihood, dag_logits_log_likelihood, dag_loss
from smiexlm.errors import ConfigError


@pytest.fixture(autouse=True, params=["reference", "matmul"])
def impl(request, monkeypatch):
    """Every test runs under both CPU implementations."""
    monkeypatch.setenv("SMIEXLM_DAG_IMPL", request.param)
    return request.param


def paths(n_states: int, n_targets: int):
    """Every strictly increasing state sequence 0 = s_0 < ... < s_{M−1} = S − 1."""
    if n_targets == 1:
        return [(0,)] if n_states == 1 else []
    middle = itertools.combinations(range(1, n_states - 1), n_targets - 2)
    return [(0, *mid, n_states - 1) for mid in middle]


def path_score(em, links, path) -> float:
    score = sum(float(em[i, u]) for i, u in enumerate(path))
    return score + sum(float(links[v, u]) for v, u in itertools.pairwise(path))


def brute_force(em, links, s, m):
    """(log-likelihood, best path or None) for one sequence, by enumeration."""
    scores = [(path_score(em, links, p), p) for p in paths(s, m)]
    scores = [(v, p) for v, p in scores if v > -math.inf]
    if not scores:
        return -math.inf, None
    values = torch.tensor([v for v, _ in scores], dtype=torch.float64)
    best = max(scores, key=lambda x: x[0])
    return float(torch.logsumexp(values, 0)), best[1]


def random_batch(B, M, L, seed, dtype=torch.float64, sparse=0.2):
    g = torch.Generator().manual_seed(seed)
    em = torch.randn(B, M, L, generator=g, dtype=dtype) * 2 - 1
    links = torch.randn(B, L, L, generator=g, dtype=dtype)
    links = links.masked_fill(torch.rand(B, L, L, generator=g) < sparse, -math.inf)
    s = torch.randint(1, L + 1, (B,), generator=g)
    m = torch.minimum(torch.randint(1, M + 1, (B,), generator=g), s)
    return em, links, s, m


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force(seed):
    em, links, s, m = random_batch(B=6, M=4, L=8, seed=seed)
    s[0], m[0] = 8, 4  # one full-size sequence, the rest padded
    ll = dag_log_likelihood(em, links, s, m)
    assert ll.dtype == torch.float64
    for b in range(len(s)):
        # links below the diagonal or past S_b must be ignored: mask them here by hand
        expected, _ = brute_force(em[b], torch.triu(links[b], 1), int(s[b]), int(m[b]))
        if math.isinf(expected):
            assert ll[b] == -math.inf
        else:
            assert abs(float(ll[b]) - expected) < 1e-9


def test_ignores_entries_outside_the_upper_triangle():
    em, links, s, m = random_batch(B=3, M=4, L=7, seed=11)
    a = dag_log_likelihood(em, links, s, m)
    noisy = links + torch.tril(torch.full((7, 7), 5.0, dtype=torch.float64))
    for b in range(3):
        noisy[b, :, int(s[b]) :] = 100.0
    b_ = dag_log_likelihood(em, noisy, s, m)
    torch.testing.assert_close(a, b_, rtol=0, atol=1e-12)


def test_gradcheck_float64():
    em, links, s, m = random_batch(B=3, M=4, L=6, seed=3, sparse=0.1)
    s[:], m[:] = torch.tensor([6, 5, 4]), torch.tensor([4, 3, 2])
    em.requires_grad_(True)
    links.requires_grad_(True)
    fn = lambda e, lk: dag_log_likelihood(e, lk, s, m)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (em, links), eps=1e-6, atol=1e-7)


def test_gradients_are_posteriors():
    em, links, s, m = random_batch(B=2, M=3, L=6, seed=5, sparse=0.0)
    s[:], m[:] = 6, 3
    em.requires_grad_(True)
    dag_log_likelihood(em, links, s, m).sum().backward()
    # each target is emitted by exactly one state on every path
    torch.testing.assert_close(em.grad.sum(dim=2), torch.ones(2, 3, dtype=torch.float64))


def test_edge_cases_m1_and_m_equals_l():
    em, links, _, _ = random_batch(B=2, M=5, L=5, seed=7, sparse=0.0)
    s, m = torch.tensor([1, 5]), torch.tensor([1, 5])
    ll = dag_log_likelihood(em, links, s, m)
    assert abs(float(ll[0]) - float(em[0, 0, 0])) < 1e-12  # one state, one target
    diag = sum(float(em[1, i, i]) for i in range(5)) + sum(
        float(links[1, i, i + 1]) for i in range(4)
    )
    assert abs(float(ll[1]) - diag) < 1e-9  # only the path through every state
    # M = 1 with S > 1 has no path
    assert dag_log_likelihood(em, links, torch.tensor([3, 5]), torch.tensor([1, 5]))[0] == -math.inf


def test_all_links_minus_inf_gives_minus_inf_and_zero_gradient():
    em, _, _, _ = random_batch(B=2, M=3, L=5, seed=8)
    links = torch.full((2, 5, 5), -math.inf, dtype=torch.float64, requires_grad=True)
    em.requires_grad_(True)
    ll = dag_log_likelihood(em, links, torch.tensor([5, 4]), torch.tensor([3, 2]))
    assert torch.all(ll == -math.inf)
    loss, n_invalid = dag_loss(ll, torch.tensor([3, 2]))
    assert n_invalid == 2 and float(loss.detach()) == 0.0
    loss.backward()
    assert torch.all(em.grad == 0) and torch.all(links.grad == 0)


def test_dag_loss_counts_and_averages():
    ll = torch.tensor([-4.0, -math.inf, -9.0, math.nan], requires_grad=True)
    loss, n_invalid = dag_loss(ll, torch.tensor([2, 3, 3, 1]))
    assert n_invalid == 2
    assert abs(float(loss.detach()) - (2.0 + 3.0) / 2) < 1e-6
    loss.backward()
    assert torch.isfinite(ll.grad).all() and ll.grad[1] == 0 and ll.grad[3] == 0


@pytest.mark.parametrize(
    ("s", "m", "field"),
    [
        ([0, 3], [1, 2], "state_lengths[0]"),
        ([3, 3], [2, 0], "target_lengths[1]"),
        ([9, 3], [2, 2], "state_lengths[0]"),
        ([4, 3], [5, 2], "target_lengths[0]"),
        ([4, 2], [2, 3], "target_lengths[1]"),
    ],
)
def test_bad_lengths_rejected(s, m, field):
    em = torch.zeros(2, 4, 6)
    links = torch.zeros(2, 6, 6)
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        dag_log_likelihood(em, links, torch.tensor(s), torch.tensor(m))


def test_shape_and_dtype_errors():
    with pytest.raises(ConfigError, match="log_links"):
        dag_log_likelihood(
            torch.zeros(2, 3, 5), torch.zeros(2, 4, 4), torch.tensor([4, 4]), torch.tensor([2, 2])
        )
    with pytest.raises(ConfigError, match="state_lengths"):
        dag_log_likelihood(
            torch.zeros(2, 3, 5),
            torch.zeros(2, 5, 5),
            torch.tensor([4.0, 4.0]),
            torch.tensor([2, 2]),
        )


def test_very_negative_log_probs_have_no_nan():
    em, links, s, m = random_batch(B=4, M=6, L=12, seed=9, dtype=torch.float32)
    s[:], m[:] = torch.tensor([12, 10, 8, 6]), torch.tensor([6, 5, 3, 2])
    em = (em * 300 - 2000).requires_grad_(True)
    links = (links * 300 - 500).requires_grad_(True)
    ll = dag_log_likelihood(em, links, s, m)
    assert torch.isfinite(ll).all()
    ll.sum().backward()
    assert torch.isfinite(em.grad).all() and torch.isfinite(links.grad).all()
    # log-values near −1e4 carry ~1e-3 absolute fp32 rounding, hence the tolerance
    torch.testing.assert_close(em.grad.sum(dim=2)[0], torch.ones(6), rtol=0, atol=5e-3)
    # each path takes M_b − 1 edges: the edge posteriors must keep that mass
    torch.testing.assert_close(links.grad.sum(dim=(1, 2)), (m - 1).float(), rtol=0, atol=5e-3)
    # the same in float64 agrees
    ll64 = dag_log_likelihood(em.detach().double(), links.detach().double(), s, m)
    torch.testing.assert_close(ll.double(), ll64, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_inputs_accumulate_in_fp32(dtype):
    em, links, s, m = random_batch(B=3, M=4, L=8, seed=2, dtype=torch.float32, sparse=0.0)
    em_lp = em.to(dtype).requires_grad_(True)
    ll = dag_log_likelihood(em_lp, links.to(dtype), s, m)
    assert ll.dtype == torch.float32
    expected = dag_log_likelihood(em.to(dtype).float(), links.to(dtype).float(), s, m)
    torch.testing.assert_close(ll, expected)
    ll.sum().backward()
    assert em_lp.grad.dtype == dtype


def test_fused_logits_path_matches_explicit_log_softmax():
    g = torch.Generator().manual_seed(4)
    B, L, M, V = 3, 7, 4, 11
    logits = torch.randn(B, L, V, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, V, (B, M), generator=g)
    links = torch.randn(B, L, L, generator=g, dtype=torch.float64, requires_grad=True)
    s, m = torch.tensor([7, 6, 4]), torch.tensor([4, 3, 2])
    targets[2, 2:] = -100  # padding beyond the target length is ignored
    fused = dag_logits_log_likelihood(logits, targets, links, s, m)
    (grad_fused,) = torch.autograd.grad(fused.sum(), logits)
    em = torch.log_softmax(logits, -1).gather(2, targets.clamp_min(0)[:, None, :].expand(B, L, M))
    explicit = dag_log_likelihood(em.transpose(1, 2), links, s, m)
    (grad_explicit,) = torch.autograd.grad(explicit.sum(), logits)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad_fused, grad_explicit, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda x: dag_logits_log_likelihood(x, targets, links.detach(), s, m), (logits,)
    )
    with pytest.raises(ConfigError, match=r"targets\[0, 1\]"):
        bad = targets.clone()
        bad[0, 1] = V
        dag_logits_log_likelihood(logits, bad, links, s, m)


@pytest.mark.parametrize("seed", range(4))
def test_viterbi_matches_brute_force_best_path(seed):
    em, links, s, m = random_batch(B=6, M=4, L=8, seed=100 + seed)
    align = dag_best_alignment(em, links, s, m)
    assert align.shape == (6, 8) and align.dtype == torch.long
    for b in range(6):
        _, best = brute_force(em[b], torch.triu(links[b], 1), int(s[b]), int(m[b]))
        expected = torch.full((8,), -1, dtype=torch.long)
        if best is not None:
            expected[list(best)] = torch.arange(len(best))
        assert torch.equal(align[b], expected)


def test_transition_matmul_matches_stepwise_sum_and_falls_back():
    from smiexlm.dag.reference import (
        backward_beta,
        emission_posterior,
        forward_alpha,
        log_partition,
        prepare,
        transition_posterior,
        transition_posterior_bmm,
        transition_posterior_exact,
    )

    em, links, s, m = random_batch(B=4, M=5, L=9, seed=0, sparse=0.1)
    s[:], m[:] = torch.tensor([9, 8, 7, 9]), torch.tensor([5, 4, 3, 5])
    # spreads of thousands of nats: the matmul alone underflows on sequence 0
    em, links = em * 400, links * 400
    e, lk = prepare(em, links, s, m)
    alpha = forward_alpha(e, lk)
    beta = backward_beta(e, lk, s, m)
    log_z = log_partition(alpha, s, m)
    exact = transition_posterior_exact(alpha, beta, e, lk, log_z)
    fast = transition_posterior_bmm(alpha, beta, e, lk, log_z)
    torch.testing.assert_close(fast[1:], exact[1:], rtol=1e-9, atol=1e-9)
    assert (fast[0] - exact[0]).abs().max() > 0.5
    checked = transition_posterior(
        alpha, beta, e, lk, log_z, emission_posterior(alpha, beta, log_z), m
    )
    torch.testing.assert_close(checked, exact, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(exact.sum(dim=(1, 2)), (m - 1).double())


def test_state_posterior_matches_brute_force():
    from smiexlm.dag import dag_state_posterior

    em, links, s, m = random_batch(B=5, M=4, L=7, seed=11)
    s[0], m[0] = 7, 4
    links[1] = -math.inf  # no path at all when M > 1
    s[1], m[1] = 5, 3
    post = dag_state_posterior(em, links, s, m)
    assert post.shape == em.shape
    for b in range(5):
        up = torch.triu(links[b], 1)
        scored = [(path_score(em[b], up, p), p) for p in paths(int(s[b]), int(m[b]))]
        scored = [(v, p) for v, p in scored if v > -math.inf]
        expected = torch.zeros(4, 7, dtype=torch.float64)
        if scored:
            log_z = math.log(sum(math.exp(v) for v, _ in scored))
            for v, p in scored:
                for i, u in enumerate(p):
                    expected[i, u] += math.exp(v - log_z)
            torch.testing.assert_close(post[b].sum(1)[: int(m[b])], torch.ones(int(m[b])).double())
        torch.testing.assert_close(post[b], expected, rtol=1e-9, atol=1e-12)
