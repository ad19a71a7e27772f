"""The DAG log-likelihood by batched matrix products: the fast path for CPU tensors.

Each step of the α recursion, ``logsumexp_v(α[i−1, v] + log E[v, u])``, is a product in
probability space, ``Σ_v exp(α[i−1, v]) · E[v, u]``; the β step is the same product on the
other side. Written as one float64 ``torch.bmm`` per step, the O(M·L²) work runs as dense
matrix products instead of O(M) elementwise logsumexp tiles over (B, L, L).

Exactness. A single shift of α by its maximum underflows: after a few dozen steps the states
of one step spread over thousands of nats, and a state far below the maximum may still carry
the only good continuation. So the states of each step are grouped into **bands** of
``BAND_NATS`` by their log-value, each band is shifted by its own top, and all bands go through
one product, (B, G, L) @ (B, L, L): the bands' rows ride on the same pass over the link
matrix, so G bands cost about one band. The links are shifted by the sequence's largest
finite link. Inside a band every shifted factor is ≥ exp(−BAND_NATS); a link at most
``LINK_NATS`` below the largest keeps every product of the two above exp(−690), well inside
float64's normal range (exp(−708)). No term underflows, so each step is the log-space sum up
to float64 rounding (relative error ≤ L·2⁻⁵³). A sequence outside those bounds (links spread
more than ``LINK_NATS``, or log-values needing more than ``MAX_BANDS`` bands) is computed by
the exact log-space recursion of :mod:`smiexlm.dag.reference`, which stays the oracle.

The autograd function is the reference's (:class:`~smiexlm.dag.reference.DagLogLikelihood`)
with these recursions: the transition gradient is its stabilised matrix product with the
flow-conservation check, the emission gradient exp(α + β − log Z).
"""

from __future__ import annotations

import math

import torch

from smiexlm.dag import reference as ref

#: width of one band of log-values; every shifted factor inside a band is ≥ exp(−400)
BAND_NATS = 400.0
#: finite links this far below the sequence's largest keep products above exp(−690)
LINK_NATS = 290.0
#: more bands than this hands the sequence to the log-space recursion
MAX_BANDS = 8
#: sequences per product: the chunk's float64 link matrices stay cache-resident across steps
CHUNK_BYTES = 8 * 2**20


def link_probabilities(links: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(P, shift, ok): float64 exp(links − shift) (B, L, L), the (B,) shift (the largest
    link, 0 where none is finite) and the (B,) bool sequences whose finite links all lie
    within ``LINK_NATS`` of it."""
    x = links.double()
    top = x.amax(dim=(1, 2))
    shift = torch.where(torch.isfinite(top), top, 0.0)
    far = (x < (shift - LINK_NATS)[:, None, None]) & (x > -math.inf)
    return torch.exp(x - shift[:, None, None]), shift, ~far.any(dim=(1, 2))


def banded(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split log-values (B, N) into bands: (factors (B, G, N), shifts (B, G), ok (B,)).

    ``factors[b, g, v] = exp(x[b, v] − shifts[b, g])`` for the states of band g and 0 for the
    others; band g holds the values in (top − (g+1)·BAND_NATS, top − g·BAND_NATS]. ``ok`` is
    False for rows that need more than ``MAX_BANDS`` bands (their factors are incomplete).
    """
    top = x.amax(dim=1, keepdim=True)  # (B, 1)
    top = torch.where(torch.isfinite(top), top, 0.0)
    depth = top - x  # ≥ 0, +inf where x = −inf
    spread = torch.where(torch.isfinite(depth), depth, 0.0).amax(dim=1)  # (B,)
    n_bands = int(spread.max()) // int(BAND_NATS) + 1
    if n_bands == 1:  # the common case: one shift per row
        return torch.exp(x - top).unsqueeze(1), top, torch.ones_like(spread, dtype=torch.bool)
    n_bands = min(n_bands, MAX_BANDS)
    band = (depth / BAND_NATS).floor()  # (B, N), +inf where x = −inf
    g = torch.arange(n_bands, device=x.device, dtype=x.dtype)
    shifts = top - g[None, :] * BAND_NATS  # (B, G)
    member = band[:, None, :] == g[None, :, None]  # (B, G, N)
    factors = torch.where(member, torch.exp(x[:, None, :] - shifts[:, :, None]), 0.0)
    return factors, shifts, spread < MAX_BANDS * BAND_NATS


def combine(mass: torch.Tensor, shifts: torch.Tensor, dim: int) -> torch.Tensor:
    """log Σ_g mass_g · exp(shift_g) over the band axis ``dim`` of ``mass``."""
    if mass.shape[dim] == 1:
        return torch.log(mass.squeeze(dim)) + shifts
    shape = [shifts.shape[0], 1, 1]
    shape[dim] = shifts.shape[1]
    return torch.logsumexp(torch.log(mass) + shifts.view(shape), dim=dim)


def window(state_lengths: torch.Tensor, target_lengths: torch.Tensor) -> int:
    """D = max_b (S_b − M_b): the state that emits target i lies in [i, i + D] on every path."""
    return int((state_lengths - target_lengths).max())


def forward_alpha(em, probs, link_shift, slack: int):
    """α (B, M, L) in ``em``'s dtype, and the (B,) bool rows whose bands all fit.

    Only the states that can still finish a path are carried: at step i, states i .. i + slack
    (``slack`` from :func:`window`); α is −inf outside them.
    """
    B, M, L = em.shape
    alpha = em.new_full((B, M, L), ref.NEG_INF)
    alpha[:, 0, 0] = em[:, 0, 0]
    prev = alpha[:, 0, : slack + 1].double()  # states 0 .. slack
    ok = torch.ones(B, dtype=torch.bool, device=em.device)
    for i in range(1, M):
        lo, hi = i - 1, min(L, i + slack)  # predecessors v in [lo, hi)
        factors, shifts, fits = banded(prev[:, : hi - lo])
        mass = torch.bmm(factors, probs[:, lo:hi, i : hi + 1])  # (B, G, hi + 1 − i)
        prev = em[:, i, i : hi + 1].double() + combine(mass, shifts, 1) + link_shift[:, None]
        alpha[:, i, i : hi + 1] = prev
        ok &= fits
    return alpha, ok


def backward_beta(em, probs, link_shift, state_lengths, target_lengths, slack: int):
    """β (B, M, L) in ``em``'s dtype over the states of :func:`forward_alpha`'s window, and
    the (B,) bool rows whose bands all fit."""
    B, M, L = em.shape
    beta = em.new_full((B, M, L), ref.NEG_INF)
    batch = torch.arange(B, device=em.device)
    beta[batch, target_lengths - 1, state_lengths - 1] = 0.0
    last = (target_lengths - 1)[:, None]  # (B, 1)
    ok = torch.ones(B, dtype=torch.bool, device=em.device)
    for i in range(M - 2, -1, -1):
        hi = min(L, i + slack + 1)  # states v in [i, hi), successors u in [i + 1, hi + 1)
        nxt = (em[:, i + 1, i + 1 : hi + 1] + beta[:, i + 1, i + 1 : hi + 1]).double()
        factors, shifts, fits = banded(nxt)
        mass = torch.bmm(probs[:, i:hi, i + 1 : hi + 1], factors.transpose(1, 2))  # (B, ·, G)
        step = combine(mass, shifts, 2) + link_shift[:, None]
        live = i < last
        beta[:, i, i:hi] = torch.where(live, step.to(beta.dtype), beta[:, i, i:hi])
        ok &= fits | ~live[:, 0]
    return beta, ok


def _chunks(n_seq: int, n_states: int):
    size = max(1, CHUNK_BYTES // (8 * n_states * n_states))
    return [slice(s, min(s + size, n_seq)) for s in range(0, n_seq, size)]


def alpha_recursion(em, links, state_lengths, target_lengths) -> torch.Tensor:
    """α by banded products, chunk by chunk; uncertified sequences by the log-space recursion."""
    slack = window(state_lengths, target_lengths)
    alpha = torch.empty_like(em)
    for part in _chunks(em.shape[0], em.shape[2]):
        probs, shift, ok = link_probabilities(links[part])
        alpha[part], fits = forward_alpha(em[part], probs, shift, slack)
        _redo(alpha[part], ok & fits, lambda i, p=part: ref.forward_alpha(em[p][i], links[p][i]))
    return alpha


def beta_recursion(em, links, state_lengths, target_lengths) -> torch.Tensor:
    """β by banded products, chunk by chunk; uncertified sequences by the log-space recursion."""
    slack = window(state_lengths, target_lengths)
    beta = torch.empty_like(em)
    for part in _chunks(em.shape[0], em.shape[2]):
        s, m = state_lengths[part], target_lengths[part]
        probs, shift, ok = link_probabilities(links[part])
        beta[part], fits = backward_beta(em[part], probs, shift, s, m, slack)
        _redo(
            beta[part],
            ok & fits,
            lambda i, p=part, s=s, m=m: ref.backward_beta(em[p][i], links[p][i], s[i], m[i]),
        )
    return beta


def _redo(out: torch.Tensor, certified: torch.Tensor, exact) -> None:
    """Overwrite the rows of ``out`` (a view) that are not certified with ``exact(index)``."""
    if not bool(certified.all()):
        idx = (~certified).nonzero()[:, 0]
        out[idx] = exact(idx)


MATRIX_PRODUCTS = (alpha_recursion, beta_recursion)


def matmul_log_likelihood(
    emissions: torch.Tensor,
    log_links: torch.Tensor,
    state_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """(B,) log-likelihood by banded matrix products. Inputs must already be validated."""
    return ref.DagLogLikelihood.apply(
        emissions, log_links, state_lengths, target_lengths, MATRIX_PRODUCTS
    )
