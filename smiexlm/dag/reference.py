"""Exact PyTorch reference of the DAG alignment log-likelihood, with a hand-written backward.

Layout (shared by every implementation in :mod:`smiexlm.dag`):

- ``emissions`` (B, M, L): ``emissions[b, i, u] = log P_u(y_i)``, the log-probability that
  state ``u`` emits target token ``i``.
- ``log_links`` (B, L, L): ``log_links[b, v, u] = log E[v, u]``, indexed by the *absolute*
  successor state ``u`` (not by an offset). Only the strict upper triangle ``v < u < S_b`` is
  read; entries on or below the diagonal and beyond the state length are treated as −inf
  (no edge) and receive zero gradient.
- A path starts at state 0, ends at state ``S_b − 1`` and visits ``M_b`` strictly increasing
  states; the i-th visited state emits target ``i``.

The forward pass runs the α recursion in O(M) vectorised steps, the backward pass the β
recursion; the transition gradient is one stabilised batched matrix product over the target
axis. Nothing is taped over the M steps, so memory is O(B·L·(M + L)).
"""

from __future__ import annotations

import math

import torch

NEG_INF = -math.inf


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; every other floating dtype (fp32, bf16, fp16) accumulates in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def valid_edges(state_lengths: torch.Tensor, n_states: int) -> torch.Tensor:
    """(B, L, L) bool: True where ``v < u < S_b``, the edges a path may take."""
    idx = torch.arange(n_states, device=state_lengths.device)
    upper = idx[:, None] < idx[None, :]  # (L, L): v < u
    inside = idx[None, :] < state_lengths[:, None]  # (B, L): u < S_b
    return upper[None] & inside[:, None, :]


def prepare(
    emissions: torch.Tensor,
    log_links: torch.Tensor,
    state_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cast to the accumulation dtype and mask padding: (B, M, L) emissions, (B, L, L) links."""
    dtype = accumulation_dtype(emissions.dtype)
    B, M, L = emissions.shape
    em = emissions.to(dtype)
    links = log_links.to(dtype)
    links = torch.where(valid_edges(state_lengths, L), links, NEG_INF)
    rows = torch.arange(M, device=em.device)[None, :, None] < target_lengths[:, None, None]
    cols = torch.arange(L, device=em.device)[None, None, :] < state_lengths[:, None, None]
    em = torch.where(rows & cols, em, NEG_INF)  # (B, M, L)
    return em, links


def forward_alpha(em: torch.Tensor, links: torch.Tensor) -> torch.Tensor:
    """α (B, M, L): log-mass of all partial paths from state 0 that emit y_0..y_i and end at u."""
    B, M, L = em.shape
    alpha = em.new_full((B, M, L), NEG_INF)
    alpha[:, 0, 0] = em[:, 0, 0]
    for i in range(1, M):
        # logsumexp over predecessors v of α[i−1, v] + log E[v, u]
        step = torch.logsumexp(alpha[:, i - 1].unsqueeze(2) + links, dim=1)  # (B, L)
        alpha[:, i] = em[:, i] + step
    return alpha


def backward_beta(
    em: torch.Tensor,
    links: torch.Tensor,
    state_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """β (B, M, L): log-mass of all path suffixes from state u (emitting y_i) to the end state,
    excluding u's own emission."""
    B, M, L = em.shape
    beta = em.new_full((B, M, L), NEG_INF)
    batch = torch.arange(B, device=em.device)
    beta[batch, target_lengths - 1, state_lengths - 1] = 0.0
    last = (target_lengths - 1)[:, None]  # (B, 1)
    for i in range(M - 2, -1, -1):
        nxt = em[:, i + 1] + beta[:, i + 1]  # (B, L) over successors u
        step = torch.logsumexp(links + nxt.unsqueeze(1), dim=2)  # (B, L) over v
        beta[:, i] = torch.where(i < last, step, beta[:, i])
    return beta


def log_partition(alpha: torch.Tensor, state_lengths, target_lengths) -> torch.Tensor:
    """(B,) α[M_b − 1, S_b − 1]."""
    batch = torch.arange(alpha.shape[0], device=alpha.device)
    return alpha[batch, target_lengths - 1, state_lengths - 1]


def emission_posterior(alpha, beta, log_z) -> torch.Tensor:
    """(B, M, L) P(state u emits y_i | path): exp(α + β − log Z), zero for invalid samples."""
    ok = torch.isfinite(log_z)
    shift = torch.where(ok, log_z, 0.0)[:, None, None]
    post = torch.exp(alpha + beta - shift)
    return torch.where(ok[:, None, None], post, 0.0)


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(x), x, 0.0)


def transition_posterior_bmm(alpha, beta, em, links, log_z) -> torch.Tensor:
    """(B, L, L) expected use of edge v→u,
    Σ_i exp(α[i−1, v] + log E[v, u] + em[i, u] + β[i, u] − log Z), as one batched matmul.

    Stabilised in log space and run in float64: the left factor is shifted by its per-step
    maximum (α drifts by the emitted log-probabilities from one step to the next), that shift
    moves to the right factor, and each side is then shifted by its per-state maximum over
    the steps. Every factor is ≤ 1; the shifts, the link and log Z are added back as logs.
    """
    if em.shape[1] < 2:  # every target has length 1: no transition is taken
        return torch.zeros_like(links)
    ok = torch.isfinite(log_z)
    x = alpha[:, :-1].double()  # (B, M−1, L) over predecessors v
    y = (em[:, 1:] + beta[:, 1:]).double()  # (B, M−1, L) over successors u
    step = _finite_or_zero(x.amax(dim=2, keepdim=True))  # (B, M−1, 1)
    x, y = x - step, y + step
    r = _finite_or_zero(x.amax(dim=1))  # (B, L)
    t = _finite_or_zero(y.amax(dim=1))
    p = torch.exp(x - r[:, None, :])  # (B, M−1, L), entries ≤ 1
    q = torch.exp(y - t[:, None, :])
    post = torch.bmm(p.transpose(1, 2), q)  # (B, L, L): Σ_i p[i, v] q[i, u]
    shift = torch.where(ok, log_z, 0.0).double()
    # in place: the (B, L, L) float64 temporaries dominate this function's time
    post.log_().add_(links).add_((r - shift[:, None])[:, :, None]).add_(t[:, None, :]).exp_()
    post.masked_fill_(~ok[:, None, None], 0.0)
    return post.to(alpha.dtype)


def transition_posterior_exact(alpha, beta, em, links, log_z) -> torch.Tensor:
    """(B, L, L) the same quantity summed step by step in log space: O(M) (B, L, L) tiles."""
    ok = torch.isfinite(log_z)
    shift = torch.where(ok, log_z, 0.0)[:, None, None]
    post = torch.zeros_like(links)
    right = em + beta  # (B, M, L)
    for i in range(1, em.shape[1]):
        post += torch.exp(alpha[:, i - 1, :, None] + links + right[:, i, None, :] - shift)
    return torch.where(ok[:, None, None], post, 0.0)


def transition_posterior(alpha, beta, em, links, log_z, em_post, target_lengths) -> torch.Tensor:
    """(B, L, L) edge posteriors: the batched matmul, checked by flow conservation.

    Each visit to state v before the last target leaves v by exactly one edge, so
    Σ_u post[v, u] must equal Σ_{i < M_b − 1} P(v emits y_i). A sequence whose rows lose mass
    (the matmul's factors underflowed: log-α spread within one step of more than ~700 nats)
    is recomputed exactly.
    """
    post = transition_posterior_bmm(alpha, beta, em, links, log_z)
    rows = (
        torch.arange(em.shape[1], device=em.device)[None, :, None]
        < (target_lengths - 1)[:, None, None]
    )
    visits = torch.where(rows, em_post, 0.0).sum(dim=1)  # (B, L) expected departures from v
    tol = 1e-9 if em.dtype == torch.float64 else 1e-3
    lost = (visits - post.sum(dim=2)).abs().amax(dim=1) > tol * (1 + visits.amax(dim=1))
    if bool(lost.any()):
        idx = lost.nonzero()[:, 0]
        post[idx] = transition_posterior_exact(
            alpha[idx], beta[idx], em[idx], links[idx], log_z[idx]
        )
    return post


def log_space_alpha(em, links, state_lengths, target_lengths) -> torch.Tensor:
    return forward_alpha(em, links)


class DagLogLikelihood(torch.autograd.Function):
    """log Z per sequence; backward via β and the two posteriors (no tape over M).

    ``recursions`` = (alpha, beta), each called as ``f(em, links, state_lengths,
    target_lengths)`` on the prepared inputs: the log-space ones here, the banded matrix
    products of :mod:`smiexlm.dag.matmul`. Both share everything else.
    """

    @staticmethod
    def forward(ctx, emissions, log_links, state_lengths, target_lengths, recursions):
        em, links = prepare(emissions, log_links, state_lengths, target_lengths)
        alpha = recursions[0](em, links, state_lengths, target_lengths)
        log_z = log_partition(alpha, state_lengths, target_lengths)
        ctx.save_for_backward(em, links, alpha, log_z, state_lengths, target_lengths)
        ctx.in_dtypes = (emissions.dtype, log_links.dtype)
        ctx.beta = recursions[1]
        return log_z

    @staticmethod
    def backward(ctx, grad_out):
        em, links, alpha, log_z, state_lengths, target_lengths = ctx.saved_tensors
        beta = ctx.beta(em, links, state_lengths, target_lengths)
        grad_em = grad_links = None
        g = grad_out.to(em.dtype)[:, None, None]
        em_post = emission_posterior(alpha, beta, log_z)  # (B, M, L)
        if ctx.needs_input_grad[0]:
            grad_em = (g * em_post).to(ctx.in_dtypes[0])
        if ctx.needs_input_grad[1]:
            post = transition_posterior(alpha, beta, em, links, log_z, em_post, target_lengths)
            grad_links = (g * post).to(ctx.in_dtypes[1])
        return grad_em, grad_links, None, None, None


LOG_SPACE = (log_space_alpha, backward_beta)


def reference_log_likelihood(
    emissions: torch.Tensor,
    log_links: torch.Tensor,
    state_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """(B,) log-likelihood by the reference recursion. Inputs must already be validated."""
    return DagLogLikelihood.apply(emissions, log_links, state_lengths, target_lengths, LOG_SPACE)
