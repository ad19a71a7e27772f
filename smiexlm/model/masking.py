"""Token masking for pre-training, and the Repeated-MLM data transform (ExLM §3).

``mask_tokens`` selects round(p·n) tokens per sequence (n = maskable tokens, stochastic
rounding, at least one when n > 0) and never touches [PAD]/[BOS]/[EOS]/[MASK]/[UNK].
Policies: ``"all_mask"`` (ExLM's official run: every selected token becomes [MASK]) and
``"bert_80_10_10"`` (80 % [MASK], 10 % a random ordinary token, 10 % unchanged).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from smiexlm.errors import ConfigError
from smiexlm.model.expansion import repeat_layout
from smiexlm.tokenizer.special import IGNORE_INDEX, MASK_ID, N_SPECIAL_TOKENS, PAD_ID


def _uniform(shape: tuple[int, ...], generator: torch.Generator | None, device) -> Tensor:
    return torch.rand(shape, generator=generator, device=device)


def mask_tokens(
    input_ids: Tensor,
    attention_mask: Tensor,
    mask_prob: float = 0.15,
    policy: Literal["all_mask", "bert_80_10_10"] = "all_mask",
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
    mask_id: int = MASK_ID,
) -> tuple[Tensor, Tensor]:
    """Mask ``input_ids`` (B, T) -> ``(masked_ids, labels)``, labels −100 where not selected."""
    if not 0.0 < mask_prob < 1.0:
        raise ConfigError("mask_prob", mask_prob, "a probability in (0, 1)")
    if policy not in ("all_mask", "bert_80_10_10"):
        raise ConfigError("policy", policy, "'all_mask' or 'bert_80_10_10'")
    if policy == "bert_80_10_10" and (vocab_size is None or vocab_size <= N_SPECIAL_TOKENS):
        raise ConfigError("vocab_size", vocab_size, "the vocabulary size for 'bert_80_10_10'")
    device = input_ids.device
    b, t = input_ids.shape
    maskable = attention_mask.bool() & (input_ids >= N_SPECIAL_TOKENS)  # (B, T)
    n = maskable.sum(1)
    u = _uniform((b,), generator, "cpu").to(device)
    count = torch.floor(n * mask_prob + u).long().clamp(min=1)
    count = torch.minimum(count, n)
    # Random ranks among maskable tokens; the `count` smallest are selected.
    scores = _uniform((b, t), generator, "cpu").to(device).masked_fill(~maskable, 2.0)
    ranks = scores.argsort(1).argsort(1)
    selected = (ranks < count[:, None]) & maskable
    labels = torch.where(selected, input_ids, IGNORE_INDEX)
    masked = input_ids.clone()
    if policy == "all_mask":
        masked[selected] = mask_id
        return masked, labels
    roll = _uniform((b, t), generator, "cpu").to(device)
    to_mask = selected & (roll < 0.8)
    to_random = selected & (roll >= 0.8) & (roll < 0.9)
    random_ids = torch.randint(N_SPECIAL_TOKENS, vocab_size, (b, t), generator=generator)
    masked[to_mask] = mask_id
    masked[to_random] = random_ids.to(device)[to_random]
    return masked, labels


def repeat_tokens(
    input_ids: Tensor, attention_mask: Tensor, k: int, pad_id: int = PAD_ID
) -> tuple[Tensor, Tensor]:
    """Repeated MLM: every ordinary token repeated ``k`` times in place (BOS/EOS kept once).

    Masking the result with probability p leaves a token's meaning fully hidden only when all
    k copies are masked (probability p^k). Returns ``(ids, attention_mask)``, padded with pad_id.
    """
    if not isinstance(k, int) or k < 1:
        raise ConfigError("k", k, "a positive integer")
    attention_mask = attention_mask.bool()
    ordinary = attention_mask & (input_ids >= N_SPECIAL_TOKENS)
    counts = torch.where(ordinary, k, 1) * attention_mask
    source, _, valid = repeat_layout(counts)
    return input_ids.gather(1, source).masked_fill(~valid, pad_id), valid
