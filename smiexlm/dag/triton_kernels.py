"""Fused Triton kernels for the DAG loss: forward α, backward β + both gradients, and the
log-softmax-gather of the logits entry point.

One program per sequence, one launch per batch: the loop over the M targets runs inside the
kernel, with a block barrier between target steps (the α/β rows live in global scratch
buffers that the backward needs anyway). Tiles are (BLOCK, BLOCK) of states with an online
logsumexp, so every logsumexp is guarded against −inf − (−inf). All arithmetic is fp32.

For CPU tensors the kernels run under ``TRITON_INTERPRET=1``, which must be set before this
module is imported (the ``@triton.jit`` decorator reads it). :data:`INTERPRETED` records the
mode the kernels were defined in, for the dispatch in :func:`smiexlm.dag.resolve_impl`: a
process that imported them compiled cannot run them on CPU tensors, whatever the variable
says later, and one that imported them interpreted runs them slowly on CUDA tensors.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from smiexlm.dag.reference import reference_log_likelihood

NEG_INF = -math.inf


@triton.jit
def _online_lse(m_run, s_run, x, axis: tl.constexpr):
    """Fold tile ``x`` into a running (max, sum of exp) along ``axis``; −inf safe."""
    m_new = tl.maximum(m_run, tl.max(x, axis=axis))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    if axis == 0:
        part = tl.sum(tl.exp(x - m_safe[None, :]), axis=0)
    else:
        part = tl.sum(tl.exp(x - m_safe[:, None]), axis=1)
    s_new = s_run * tl.exp(m_run - m_safe) + part
    return m_new, s_new


@triton.jit
def _finish_lse(m_run, s_run):
    empty = m_run == float("-inf")
    return tl.where(empty, float("-inf"), m_run + tl.log(tl.where(empty, 1.0, s_run)))


@triton.jit
def _dag_forward_kernel(
    em_ptr,  # (B, M, L) any float dtype, contiguous
    links_ptr,  # (B, L, L)
    alpha_ptr,  # (B, M, L) fp32, pre-filled with −inf
    logz_ptr,  # (B,) fp32
    slen_ptr,  # (B,) int64
    tlen_ptr,  # (B,) int64
    M,
    L,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    S = tl.load(slen_ptr + b).to(tl.int32)
    T = tl.load(tlen_ptr + b).to(tl.int32)
    em_b = em_ptr + b * M * L
    links_b = links_ptr + b * L * L
    alpha_b = alpha_ptr + b * M * L
    lane = tl.arange(0, BLOCK)

    # α[0, u] = em[0, 0] for u = 0, −inf otherwise (the buffer is already −inf)
    tl.store(alpha_b, tl.load(em_b).to(tl.float32))
    tl.debug_barrier()
    for i in range(1, T):
        for u0 in range(0, S, BLOCK):
            offs_u = u0 + lane
            in_u = offs_u < S
            m_run = tl.full([BLOCK], float("-inf"), tl.float32)
            s_run = tl.zeros([BLOCK], tl.float32)
            for v0 in range(0, u0 + BLOCK, BLOCK):
                offs_v = v0 + lane
                a = tl.load(alpha_b + (i - 1) * L + offs_v, mask=offs_v < S, other=float("-inf"))
                edge = (offs_v[:, None] < offs_u[None, :]) & in_u[None, :]
                w = tl.load(
                    links_b + offs_v[:, None] * L + offs_u[None, :], mask=edge, other=float("-inf")
                ).to(tl.float32)
                m_run, s_run = _online_lse(m_run, s_run, a[:, None] + w, 0)
            e = tl.load(em_b + i * L + offs_u, mask=in_u, other=float("-inf")).to(tl.float32)
            tl.store(alpha_b + i * L + offs_u, e + _finish_lse(m_run, s_run), mask=in_u)
        tl.debug_barrier()
    tl.store(logz_ptr + b, tl.load(alpha_b + (T - 1) * L + (S - 1)))


@triton.jit
def _dag_backward_kernel(
    em_ptr,  # (B, M, L)
    links_ptr,  # (B, L, L)
    alpha_ptr,  # (B, M, L) fp32 from the forward
    logz_ptr,  # (B,) fp32
    gout_ptr,  # (B,) fp32 incoming gradient
    beta_ptr,  # (B, M, L) fp32 scratch, pre-filled with −inf
    gem_ptr,  # (B, M, L) fp32 out, pre-filled with 0
    glinks_ptr,  # (B, L, L) fp32 out, pre-filled with 0
    slen_ptr,
    tlen_ptr,
    M,
    L,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    S = tl.load(slen_ptr + b).to(tl.int32)
    T = tl.load(tlen_ptr + b).to(tl.int32)
    em_b = em_ptr + b * M * L
    links_b = links_ptr + b * L * L
    alpha_b = alpha_ptr + b * M * L
    beta_b = beta_ptr + b * M * L
    gem_b = gem_ptr + b * M * L
    glinks_b = glinks_ptr + b * L * L
    lane = tl.arange(0, BLOCK)
    log_z = tl.load(logz_ptr + b)
    ok = log_z > float("-inf")
    g = tl.where(ok, tl.load(gout_ptr + b), 0.0)
    shift = tl.where(ok, log_z, 0.0)

    # β sweep: β[T−1, S−1] = 0; β[i, v] = logsumexp_u(W[v, u] + em[i+1, u] + β[i+1, u])
    tl.store(beta_b + (T - 1) * L + (S - 1), 0.0)
    tl.debug_barrier()
    for step in range(0, T - 1):
        i = T - 2 - step
        for v0 in range(0, S, BLOCK):
            offs_v = v0 + lane
            m_run = tl.full([BLOCK], float("-inf"), tl.float32)
            s_run = tl.zeros([BLOCK], tl.float32)
            for u0 in range(v0, S, BLOCK):
                offs_u = u0 + lane
                in_u = offs_u < S
                c = tl.load(em_b + (i + 1) * L + offs_u, mask=in_u, other=float("-inf")).to(
                    tl.float32
                ) + tl.load(beta_b + (i + 1) * L + offs_u, mask=in_u, other=float("-inf"))
                edge = (offs_v[:, None] < offs_u[None, :]) & in_u[None, :]
                w = tl.load(
                    links_b + offs_v[:, None] * L + offs_u[None, :], mask=edge, other=float("-inf")
                ).to(tl.float32)
                m_run, s_run = _online_lse(m_run, s_run, w + c[None, :], 1)
            tl.store(beta_b + i * L + offs_v, _finish_lse(m_run, s_run), mask=offs_v < S)
        tl.debug_barrier()

    # emission gradient: g · exp(α + β − log Z)
    for i in range(0, T):
        for u0 in range(0, S, BLOCK):
            offs_u = u0 + lane
            in_u = offs_u < S
            a = tl.load(alpha_b + i * L + offs_u, mask=in_u, other=float("-inf"))
            bt = tl.load(beta_b + i * L + offs_u, mask=in_u, other=float("-inf"))
            tl.store(gem_b + i * L + offs_u, g * tl.exp(a + bt - shift), mask=in_u)

    # transition gradient: g · Σ_i exp(α[i−1, v] + W[v, u] + em[i, u] + β[i, u] − log Z)
    for v0 in range(0, S, BLOCK):
        offs_v = v0 + lane
        in_v = offs_v < S
        for u0 in range(v0, S, BLOCK):
            offs_u = u0 + lane
            in_u = offs_u < S
            edge = (offs_v[:, None] < offs_u[None, :]) & in_u[None, :]
            w = tl.load(
                links_b + offs_v[:, None] * L + offs_u[None, :], mask=edge, other=float("-inf")
            ).to(tl.float32)
            acc = tl.zeros([BLOCK, BLOCK], tl.float32)
            for i in range(1, T):
                a = tl.load(alpha_b + (i - 1) * L + offs_v, mask=in_v, other=float("-inf"))
                c = tl.load(em_b + i * L + offs_u, mask=in_u, other=float("-inf")).to(
                    tl.float32
                ) + tl.load(beta_b + i * L + offs_u, mask=in_u, other=float("-inf"))
                acc += tl.exp(a[:, None] + w + c[None, :] - shift)
            tl.store(glinks_b + offs_v[:, None] * L + offs_u[None, :], g * acc, mask=edge)


@triton.jit
def _lse_gather_kernel(
    logits_ptr,  # (B, L, V)
    targets_ptr,  # (B, M) int64, clamped to [0, V)
    lse_ptr,  # (B, L) fp32 out
    em_ptr,  # (B, M, L) fp32 out
    L,
    V,
    M,
    BLOCK_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # b * L + u
    b = row // L
    u = row % L
    base = logits_ptr + row * V
    lane = tl.arange(0, BLOCK_V)
    m_run = tl.full([1], float("-inf"), tl.float32)
    s_run = tl.zeros([1], tl.float32)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + lane
        x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m_run, s_run = _online_lse(m_run, s_run, x[None, :], 1)
    lse = tl.sum(_finish_lse(m_run, s_run), axis=0)
    tl.store(lse_ptr + row, lse)
    for i0 in range(0, M, BLOCK_M):
        offs_i = i0 + tl.arange(0, BLOCK_M)
        in_i = offs_i < M
        tgt = tl.load(targets_ptr + b * M + offs_i, mask=in_i, other=0)
        picked = tl.load(base + tgt, mask=in_i, other=0.0).to(tl.float32)
        tl.store(em_ptr + b * M * L + offs_i * L + u, picked - lse, mask=in_i)


@triton.jit
def _lse_gather_backward_kernel(
    logits_ptr,  # (B, L, V)
    targets_ptr,  # (B, M) int64
    lse_ptr,  # (B, L) fp32
    gem_ptr,  # (B, M, L) fp32 incoming gradient
    glogits_ptr,  # (B, L, V) fp32 out
    L,
    V,
    M,
    BLOCK_V: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    b = row // L
    u = row % L
    total = tl.zeros([BLOCK_M], tl.float32)
    for i0 in range(0, M, BLOCK_M):
        offs_i = i0 + tl.arange(0, BLOCK_M)
        total += tl.load(gem_ptr + b * M * L + offs_i * L + u, mask=offs_i < M, other=0.0)
    g_sum = tl.sum(total, axis=0)
    lse = tl.load(lse_ptr + row)
    lane = tl.arange(0, BLOCK_V)
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + lane
        x = tl.load(logits_ptr + row * V + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        tl.store(glogits_ptr + row * V + offs, -g_sum * tl.exp(x - lse), mask=offs < V)
    tl.debug_barrier()
    for i0 in range(0, M, BLOCK_M):
        offs_i = i0 + tl.arange(0, BLOCK_M)
        in_i = offs_i < M
        tgt = tl.load(targets_ptr + b * M + offs_i, mask=in_i, other=0)
        gi = tl.load(gem_ptr + b * M * L + offs_i * L + u, mask=in_i, other=0.0)
        tl.atomic_add(glogits_ptr + row * V + tgt, gi, mask=in_i)


INTERPRETED = type(_dag_forward_kernel).__name__ == "InterpretedFunction"


def _block(n_states: int) -> int:
    return max(16, min(64, triton.next_power_of_2(n_states)))


class TritonDagLogLikelihood(torch.autograd.Function):
    @staticmethod
    def forward(ctx, emissions, log_links, state_lengths, target_lengths):
        em = emissions.contiguous()
        links = log_links.contiguous()
        B, M, L = em.shape
        alpha = torch.full((B, M, L), NEG_INF, dtype=torch.float32, device=em.device)
        log_z = torch.empty(B, dtype=torch.float32, device=em.device)
        block = _block(L)
        _dag_forward_kernel[(B,)](
            em, links, alpha, log_z, state_lengths, target_lengths, M, L, BLOCK=block
        )
        ctx.save_for_backward(em, links, alpha, log_z, state_lengths, target_lengths)
        return log_z

    @staticmethod
    def backward(ctx, grad_out):
        em, links, alpha, log_z, state_lengths, target_lengths = ctx.saved_tensors
        B, M, L = em.shape
        beta = torch.full_like(alpha, NEG_INF)
        grad_em = torch.zeros_like(alpha)
        grad_links = torch.zeros(B, L, L, dtype=torch.float32, device=em.device)
        g = grad_out.float().contiguous()
        _dag_backward_kernel[(B,)](
            em, links, alpha, log_z, g, beta, grad_em, grad_links,
            state_lengths, target_lengths, M, L, BLOCK=_block(L),
        )  # fmt: skip
        return grad_em.to(em.dtype), grad_links.to(links.dtype), None, None


def triton_log_likelihood(
    emissions: torch.Tensor,
    log_links: torch.Tensor,
    state_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """(B,) fp32 log-likelihood by the fused kernels (float64 inputs use the reference)."""
    if emissions.dtype == torch.float64 or log_links.dtype == torch.float64:
        return reference_log_likelihood(emissions, log_links, state_lengths, target_lengths)
    # the kernels read the lengths through pointers: they must live beside the emissions
    s = state_lengths.to(device=emissions.device, dtype=torch.int64).contiguous()
    t = target_lengths.to(device=emissions.device, dtype=torch.int64).contiguous()
    return TritonDagLogLikelihood.apply(emissions, log_links, s, t)


class TritonLogSoftmaxGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets):
        x = logits.contiguous()
        B, L, V = x.shape
        M = targets.shape[1]
        tgt = targets.to(device=x.device, dtype=torch.int64).clamp(0, V - 1).contiguous()
        lse = torch.empty(B, L, dtype=torch.float32, device=x.device)
        em = torch.empty(B, M, L, dtype=torch.float32, device=x.device)
        block_v = min(4096, triton.next_power_of_2(V))
        block_m = max(16, min(128, triton.next_power_of_2(M)))
        _lse_gather_kernel[(B * L,)](x, tgt, lse, em, L, V, M, BLOCK_V=block_v, BLOCK_M=block_m)
        ctx.save_for_backward(x, tgt, lse)
        ctx.blocks = (block_v, block_m)
        return em

    @staticmethod
    def backward(ctx, grad):
        x, tgt, lse = ctx.saved_tensors
        B, L, V = x.shape
        M = tgt.shape[1]
        out = torch.empty(B, L, V, dtype=torch.float32, device=x.device)
        block_v, block_m = ctx.blocks
        _lse_gather_backward_kernel[(B * L,)](
            x, tgt, lse, grad.float().contiguous(), out, L, V, M, BLOCK_V=block_v, BLOCK_M=block_m
        )
        return out.to(x.dtype), None


def triton_logsoftmax_gather(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, M, L) fp32 emissions from logits (B, L, V); float64 logits use the PyTorch path."""
    if logits.dtype == torch.float64:
        from smiexlm.dag.gather import logsoftmax_gather

        return logsoftmax_gather(logits, targets)
    return TritonLogSoftmaxGather.apply(logits, targets)
