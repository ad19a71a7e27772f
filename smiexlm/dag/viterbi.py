"""Viterbi best alignment through the DAG: which target each state emits on the best path."""

from __future__ import annotations

import torch

from smiexlm.dag.reference import prepare


@torch.no_grad()
def viterbi_alignment(
    emissions: torch.Tensor,
    log_links: torch.Tensor,
    state_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """(B, L) long: target index emitted by each state on the max-score path, −1 elsewhere.

    Same recursion as the α pass with max in place of logsumexp, plus back-pointers
    (B, M, L); the path is then read back from (M_b − 1, S_b − 1). Inputs are validated.
    """
    em, links = prepare(emissions, log_links, state_lengths, target_lengths)
    B, M, L = em.shape
    score = em.new_full((B, L), float("-inf"))
    score[:, 0] = em[:, 0, 0]
    back = torch.zeros(B, M, L, dtype=torch.long, device=em.device)
    batch = torch.arange(B, device=em.device)
    final = score.new_full((B,), float("-inf"))
    final = torch.where(target_lengths == 1, score[batch, state_lengths - 1], final)
    for i in range(1, M):
        best, arg = (score.unsqueeze(2) + links).max(dim=1)  # (B, L) over predecessors
        score = em[:, i] + best
        back[:, i] = arg
        at_end = target_lengths == i + 1
        final = torch.where(at_end, score[batch, state_lengths - 1], final)

    align = torch.full((B, L), -1, dtype=torch.long, device=em.device)
    ok = torch.isfinite(final)  # (B,)
    state = state_lengths - 1  # (B,)
    for i in range(M - 1, -1, -1):
        on_path = ok & (i < target_lengths)  # (B,)
        align[batch[on_path], state[on_path]] = i
        prev = back[batch, i, state]
        state = torch.where(on_path & (i > 0), prev, state)
    return align
