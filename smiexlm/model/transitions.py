"""The ExLM transition head: edges of the DAG over the compact expanded states (§2.3).

Edges go only from a state to a *later* state of the same sequence (strictly upper-triangular
over the compact states, which are in sequence order), and only between real states. With
``dag="sparse"`` there is no edge between two clones of the same token.

Learned form (DA-Transformer's multi-head gated transitions; one head = the paper's
``E = softmax(Q Kᵀ/√d + M)``): features f = [h ; learned embedding of the state index],
per head ``log E_h = log_softmax_valid(Q_h K_hᵀ / √d_h)``, a per-state gate
``log g = log_softmax(W_g f)`` over heads, and ``log E = logsumexp_h(log g_h + log E_h)``.
Every row sums to 1 over its valid successors; entries without an edge are −inf (the last
state has no successor, so its whole row is −inf).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from smiexlm.model.config import ExLMConfig

_FILL = -1e9  # finite stand-in for −inf inside softmax/logsumexp (keeps gradients NaN-free)


def valid_successors(state_mask: Tensor, state_groups: Tensor, sparse: bool) -> Tensor:
    """(B, S, S) bool: True where state v (row) may be followed by state u (column)."""
    s = state_mask.shape[1]
    upper = torch.ones(s, s, dtype=torch.bool, device=state_mask.device).triu(1)
    valid = upper & state_mask[:, :, None] & state_mask[:, None, :]
    if sparse:
        valid = valid & (state_groups[:, :, None] != state_groups[:, None, :])
    return valid


def masked_log_softmax(scores: Tensor, valid: Tensor) -> Tensor:
    """log-softmax of ``scores`` over the True entries of ``valid`` along the last dim; −inf
    elsewhere (rows without any valid entry are all −inf)."""
    out = torch.log_softmax(scores.float().masked_fill(~valid, _FILL), dim=-1)
    return out.masked_fill(~valid, float("-inf"))


def uniform_log_links(valid: Tensor) -> Tensor:
    """Ablation "w/o Transitions": uniform log-probabilities over the valid successors."""
    return masked_log_softmax(torch.zeros(valid.shape, device=valid.device), valid)


class TransitionHead(nn.Module):
    """Multi-head gated transition scores over compact states."""

    def __init__(self, config: ExLMConfig):
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_transition_heads
        self.position = nn.Embedding(config.k * config.max_positions, d)
        self.query = nn.Linear(2 * d, d)
        self.key = nn.Linear(2 * d, d)
        self.gate = nn.Linear(2 * d, self.n_heads)

    def forward(self, states: Tensor, valid: Tensor) -> Tensor:
        """``states`` (B, S, d) compact state features, ``valid`` (B, S, S) -> log E (B, S, S)."""
        b, s, d = states.shape
        index = torch.arange(s, device=states.device)
        feats = torch.cat([states, self.position(index).expand(b, s, d)], dim=-1)  # (B, S, 2d)
        q = self.query(feats).unflatten(-1, (self.n_heads, -1)).transpose(1, 2)  # (B, H, S, dh)
        k = self.key(feats).unflatten(-1, (self.n_heads, -1)).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1])  # (B, H, S, S)
        head_valid = valid[:, None]
        per_head = torch.log_softmax(scores.masked_fill(~head_valid, _FILL), dim=-1)
        log_gate = torch.log_softmax(self.gate(feats).float(), dim=-1)  # (B, S, H)
        mixed = torch.logsumexp(per_head + log_gate.transpose(1, 2)[..., None], dim=1)
        return mixed.masked_fill(~valid, float("-inf"))  # (B, S, S)
