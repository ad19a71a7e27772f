"""ExLM state expansion (method notes §2.1–§2.2) and the index maps around it.

Every [MASK], BOS and EOS token at original position i becomes k consecutive *states* with 2D
positions (i, 1), …, (i, k); every other real token j stays one position (j, 0). With
``rope_2d=False`` clones share (i, 0). Expanded length per sequence: n + (#masks + 2)(k − 1).

The states are then gathered into a compact (B, S) tensor, group by group in sequence order:
group g (the g-th expanded token) holds compact states g·k … g·k + k − 1. Only those states go
through the LM head and the transition head — the real-token rows never do, which is where
ExLM's speed comes from. Targets are the original tokens of the groups in order:
[BOS, masked tokens…, EOS].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from smiexlm.errors import DataError
from smiexlm.tokenizer.special import IGNORE_INDEX


def compact_positions(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Column indices of the True entries of ``mask`` (B, T), left-aligned per row.

    Returns ``index`` (B, G) long (0 where padded) and ``valid`` (B, G) bool, G = max row count.
    """
    b, t = mask.shape
    counts = mask.sum(1)  # (B,)
    g = int(counts.max()) if b else 0
    rank = mask.long().cumsum(1) - 1  # (B, T)
    dest = torch.where(mask, rank, torch.full_like(rank, g))  # the dump column g absorbs the rest
    columns = torch.arange(t, device=mask.device).expand(b, t)
    index = torch.zeros(b, g + 1, dtype=torch.long, device=mask.device)
    index.scatter_(1, dest, columns)
    valid = torch.arange(g, device=mask.device) < counts[:, None]
    return index[:, :g].masked_fill(~valid, 0), valid


def repeat_layout(counts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Layout of a batch in which token (b, j) is repeated ``counts[b, j]`` times in place.

    Returns ``source`` (B, Lx): original column of each new position, ``copy`` (B, Lx): 0-based
    copy number, and ``valid`` (B, Lx) bool; Lx is the longest new row.
    """
    b, t = counts.shape
    device = counts.device
    lengths = counts.sum(1)  # (B,)
    lx = int(lengths.max()) if b else 0
    flat = counts.flatten()
    total = int(lengths.sum())
    token = torch.repeat_interleave(torch.arange(b * t, device=device), flat, output_size=total)
    ramp = torch.arange(total, device=device)
    copy = ramp - (flat.cumsum(0) - flat)[token]  # (total,)
    row = token // t
    col = ramp - (lengths.cumsum(0) - lengths)[row]
    source = torch.zeros(b, lx, dtype=torch.long, device=device)
    source[row, col] = token % t
    copies = torch.zeros(b, lx, dtype=torch.long, device=device)
    copies[row, col] = copy
    valid = torch.arange(lx, device=device) < lengths[:, None]
    return source, copies, valid


@dataclass
class ExpandedBatch:
    """An expanded batch; shapes use B (batch), Lx (expanded length), S (states), M (targets)."""

    input_ids: Tensor  # (B, Lx) long, pad_id after the end
    attention_mask: Tensor  # (B, Lx) bool, True = real position
    seq_positions: Tensor  # (B, Lx) long, original position i
    clone_positions: Tensor  # (B, Lx) long, clone number c (0 for unexpanded tokens)
    source_index: Tensor  # (B, Lx) long, original column of each expanded position
    state_index: Tensor  # (B, S) long, expanded position of each compact state
    state_mask: Tensor  # (B, S) bool, True = real state
    state_groups: Tensor  # (B, S) long, original position of the token the state expands
    state_lengths: Tensor  # (B,) long, number of states = k · number of groups
    group_positions: Tensor  # (B, M) long, original position of each expanded token
    target_lengths: Tensor  # (B,) long, number of groups (masks + BOS + EOS)
    targets: Tensor | None  # (B, M) long, [BOS, masked tokens…, EOS]; None without labels


def expandable_tokens(
    input_ids: Tensor, attention_mask: Tensor, mask_id: int, bos_id: int, eos_id: int
) -> Tensor:
    """(B, T) bool: real tokens that ExLM expands into k states ([MASK], BOS, EOS)."""
    special = (input_ids == mask_id) | (input_ids == bos_id) | (input_ids == eos_id)
    return special & attention_mask


def expand_states(
    input_ids: Tensor,
    attention_mask: Tensor,
    k: int,
    *,
    mask_id: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    rope_2d: bool = True,
    labels: Tensor | None = None,
) -> ExpandedBatch:
    """Expand every [MASK]/BOS/EOS of ``input_ids`` (B, T) into ``k`` states.

    ``labels`` (B, T) (−100 = not masked) give the targets of the [MASK] groups; a [MASK]
    without a label raises ``DataError``.
    """
    attention_mask = attention_mask.bool()
    expand = expandable_tokens(input_ids, attention_mask, mask_id, bos_id, eos_id)  # (B, T)
    counts = torch.where(expand, k, 1) * attention_mask  # (B, T)
    source, copy, valid = repeat_layout(counts)  # (B, Lx) each
    ids = input_ids.gather(1, source).masked_fill(~valid, pad_id)
    is_clone = expand.gather(1, source) & valid
    clone_positions = torch.where(is_clone & rope_2d, copy + 1, 0)
    seq_positions = source.masked_fill(~valid, 0)

    group_positions, group_mask = compact_positions(expand)  # (B, M)
    starts = counts.cumsum(1) - counts  # (B, T) first expanded position of each token
    first = starts.gather(1, group_positions)  # (B, M)
    clones = torch.arange(k, device=input_ids.device)
    state_index = (first[..., None] + clones).flatten(1)  # (B, M·k)
    state_mask = group_mask.repeat_interleave(k, dim=1)
    state_index = state_index.masked_fill(~state_mask, 0)
    state_groups = group_positions.repeat_interleave(k, dim=1)
    target_lengths = group_mask.sum(1)

    targets = None
    if labels is not None:
        tokens = input_ids.gather(1, group_positions)  # (B, M)
        group_labels = labels.gather(1, group_positions)
        is_mask = tokens == mask_id
        if bool((is_mask & group_mask & (group_labels == IGNORE_INDEX)).any()):
            raise DataError("labels must hold the original token at every [MASK] position")
        targets = torch.where(is_mask, group_labels, tokens).masked_fill(~group_mask, pad_id)
    return ExpandedBatch(
        input_ids=ids,
        attention_mask=valid,
        seq_positions=seq_positions,
        clone_positions=clone_positions,
        source_index=source,
        state_index=state_index,
        state_mask=state_mask,
        state_groups=state_groups,
        state_lengths=target_lengths * k,
        group_positions=group_positions,
        target_lengths=target_lengths,
        targets=targets,
    )


def gather_states(hidden: Tensor, state_index: Tensor) -> Tensor:
    """Compact gather: ``hidden`` (B, Lx, d) at ``state_index`` (B, S) -> (B, S, d)."""
    return hidden.gather(1, state_index[..., None].expand(-1, -1, hidden.shape[-1]))
