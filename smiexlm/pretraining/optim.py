"""Optimiser and learning-rate schedule of pre-training.

Adam with decoupled weight decay (fairseq's ``adam`` is AdamW in today's names), β = (0.9,
0.98), eps = 1e-6. Weight decay applies to matrices only: biases, LayerNorm gains and other
vectors are not decayed. The schedule is fairseq's ``polynomial_decay``: a linear warmup from
0 to ``lr`` over ``warmup_steps`` updates, then ``(lr - end_lr) * (1 - t) ** power + end_lr``
with t going from 0 to 1 at ``total_steps``, and ``end_lr`` afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from smiexlm.pretraining.config import TrainConfig


@dataclass
class PolynomialDecaySchedule:
    """Learning rate as a pure function of the update number (``step`` = updates done so far)."""

    lr: float
    warmup_steps: int
    total_steps: int
    end_lr: float = 0.0
    power: float = 1.0

    def lr_at(self, step: int) -> float:
        """Learning rate of update number ``step + 1`` (``step`` updates already applied)."""
        n = step + 1
        if self.warmup_steps > 0 and n <= self.warmup_steps:
            return self.lr * n / self.warmup_steps
        if n >= self.total_steps:
            return self.end_lr
        span = max(1, self.total_steps - self.warmup_steps)
        remaining = 1.0 - (n - self.warmup_steps) / span
        return (self.lr - self.end_lr) * remaining**self.power + self.end_lr

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": "polynomial_decay",
            "lr": self.lr,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "end_lr": self.end_lr,
            "power": self.power,
        }


def build_schedule(config: TrainConfig) -> PolynomialDecaySchedule:
    return PolynomialDecaySchedule(
        lr=config.lr,
        warmup_steps=config.warmup_steps,
        total_steps=config.decay_steps,
        end_lr=config.end_lr,
        power=config.lr_power,
    )


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters: group 0 decayed (matrices), group 1 not."""
    return adamw_with_decay_groups(
        model, config.lr, config.weight_decay, config.adam_betas, config.adam_eps
    )


def adamw_with_decay_groups(
    model: nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.98),
    eps: float = 1e-6,
) -> torch.optim.AdamW:
    """AdamW over the parameters that require gradients: group 0 decayed (matrices), group 1
    not (biases, LayerNorm gains). Pre-training and fine-tuning both build it here."""
    decay, no_decay = [], []
    for _, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, foreach=None
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip_gradients(parameters, clip_norm: float) -> float:
    """Clip the global gradient norm to ``clip_norm`` (0 = no clipping); returns the norm."""
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    max_norm = clip_norm if clip_norm > 0 else float("inf")
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
