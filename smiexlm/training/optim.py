"""Optimiser and learning-rate schedule of pre-training.

Adam with decoupled weight decay (fairseq's ``adam`` is AdamW in today's names), β = (0.9,
0.98), eps = 1e-6. Weight decay applies to matrices only: biases, LayerNorm gains and other
vectors are not decayed. The schedule is fairseq's ``polynomial_decay``: a linear warmup from
0 to ``lr`` over ``warmup_steps`` updates, then ``(lr - end_lr) * (1 - t) ** power + end_lr``
with t going from 0 to 1 at ``total_steps``, and ``end_lr`` afterwards.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from smiexlm.errors import DivergedError


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


class OptimizerSettings(Protocol):
    """What :func:`build_schedule` and :func:`build_optimizer` read of a run's settings
    (pretraining's ``TrainConfig`` has them): this package imports no trainer."""

    lr: float
    warmup_steps: int
    end_lr: float
    lr_power: float
    weight_decay: float
    adam_betas: tuple[float, float]
    adam_eps: float

    @property
    def decay_steps(self) -> int: ...


def build_schedule(config: OptimizerSettings) -> PolynomialDecaySchedule:
    return PolynomialDecaySchedule(
        lr=config.lr,
        warmup_steps=config.warmup_steps,
        total_steps=config.decay_steps,
        end_lr=config.end_lr,
        power=config.lr_power,
    )


def build_optimizer(model: nn.Module, config: OptimizerSettings) -> torch.optim.AdamW:
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
    layer_decay: float = 1.0,
) -> torch.optim.AdamW:
    """AdamW over the parameters that require gradients: group 0 decayed (matrices), group 1
    not (biases, LayerNorm gains). Pre-training and fine-tuning both build it here.

    ``layer_decay`` < 1 scales the learning rate by depth (layer-wise decay): the parameters
    above the last encoder block (final norm, heads) take ``lr``, block i of n takes
    ``lr * layer_decay ** (n - i)`` and the embeddings ``lr * layer_decay ** (n + 1)``; the
    groups are then split by depth as well, each with its ``lr_scale`` (:func:`set_lr`)."""
    named = [(n, p) for n, p in sorted(model.named_parameters(), key=lambda item: item[0])
             if p.requires_grad]  # fmt: skip
    by_depth = layer_decay != 1.0
    names = [n for n, _ in named]
    depths = _depths(names) if by_depth else dict.fromkeys(names, 0)
    top = max(depths.values(), default=0)
    keys = [(d, decayed) for d in range(top, -1, -1) for decayed in (True, False)]
    members: dict[tuple[int, bool], list[nn.Parameter]] = {key: [] for key in keys}
    for name, param in named:
        members[depths[name], param.dim() >= 2].append(param)
    groups = [
        {"params": members[key], "weight_decay": weight_decay if key[1] else 0.0}
        | ({"lr_scale": layer_decay ** (top - key[0])} if by_depth else {})
        for key in keys
        if members[key] or not by_depth  # without decay by depth: always the two groups
    ]
    return torch.optim.AdamW(
        groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, foreach=None
    )


def _depths(names: list[str]) -> dict[str, int]:
    """Each parameter's depth: 0 for the embeddings, i + 1 for encoder block i, and one above
    the last block for the rest (final norm, heads)."""
    blocks = {n: int(m.group(1)) + 1 for n in names if (m := _BLOCK.search(n))}
    top = max(blocks.values(), default=0) + 1
    return {n: blocks.get(n, 0 if ".embed." in f".{n}" else top) for n in names}


_BLOCK = re.compile(r"encoder\.layers\.(\d+)\.")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """``lr`` in every group, times the group's ``lr_scale`` where it has one."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def clip_gradients(parameters, clip_norm: float, where: str = "", lower: str = "") -> float:
    """Clip the global gradient norm to ``clip_norm`` (0 = no clipping); returns the norm.

    With ``where`` (the run's place: "fine-tuning, epoch 3, step 120"), a norm that is not
    finite (a loss or weights gone to inf or NaN: the gradients of every process agree after
    their sum, so every process stops alike) raises :class:`~smiexlm.errors.DivergedError`
    before the optimiser applies it, saying which setting to lower (``lower``: "lr (1e+10)").
    """
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    max_norm = clip_norm if clip_norm > 0 else float("inf")
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    if where and not math.isfinite(norm):
        raise _diverged(where, f"the gradient norm is {norm} (the loss or the weights are no "
                        "longer finite)", lower)  # fmt: skip
    return norm


def check_finite_weights(named: Iterable[tuple[str, torch.Tensor]], where: str, lower: str) -> None:
    """:class:`~smiexlm.errors.DivergedError` when a tensor of ``named`` (name, weights) holds
    inf or NaN: a run checks the weights it keeps once, before anything is saved or scored."""
    bad = [name for name, weights in named if not bool(torch.isfinite(weights).all())]
    if bad:
        raise _diverged(where, f"{len(bad)} weight tensors hold inf or NaN ({bad[0]}, ...)", lower)


def _diverged(where: str, what: str, lower: str) -> DivergedError:
    hint = f"; lower {lower}" if lower else ""
    return DivergedError(f"{where}: {what}, so the run stops and keeps nothing{hint}")
