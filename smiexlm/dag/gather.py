"""Fused log-softmax + gather in PyTorch: emissions without a (B, L, V) log-softmax tensor."""

from __future__ import annotations

import torch


class LogSoftmaxGather(torch.autograd.Function):
    """emissions[b, i, u] = logits[b, u, targets[b, i]] − logsumexp_v logits[b, u, v].

    Forward keeps only the (B, L) logsumexp. Backward builds the logits gradient in place:
    −softmax · Σ_i g[b, i, u], then scatter-adds g onto the target columns.
    """

    @staticmethod
    def forward(ctx, logits, targets):
        B, L, V = logits.shape
        acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
        safe = targets.clamp(0, V - 1)  # (B, M); padded ids never reach a valid path
        lse = torch.logsumexp(logits.to(acc), dim=-1)  # (B, L)
        index = safe[:, None, :].expand(B, L, safe.shape[1])  # (B, L, M)
        picked = logits.gather(2, index).to(acc)  # (B, L, M)
        ctx.save_for_backward(logits, safe, lse)
        return (picked - lse[:, :, None]).transpose(1, 2)  # (B, M, L)

    @staticmethod
    def backward(ctx, grad):
        logits, safe, lse = ctx.saved_tensors
        B, L, V = logits.shape
        g = grad.to(lse.dtype).transpose(1, 2)  # (B, L, M)
        total = g.sum(dim=2, keepdim=True)  # (B, L, 1)
        out = torch.exp(logits.to(lse.dtype) - lse[:, :, None])  # (B, L, V) softmax
        out.mul_(-total)
        out.scatter_add_(2, safe[:, None, :].expand(B, L, safe.shape[1]), g)
        return out.to(logits.dtype), None


def logsoftmax_gather(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, M, L) float32 (float64 for float64 logits) target log-probabilities per state."""
    return LogSoftmaxGather.apply(logits, targets)
