"""The exponential moving average of a model's trainable weights (:class:`WeightAverage`).

``ema_half_life=H`` (epochs; 0 = off) keeps an exponential moving average of the trainable
weights, updated after every step with the weight of an update halving every H epochs (and
a short warm-up, ``min(decay, (1 + t) / (10 + t))``, so the random head's start fades fast).
Validation, selection and the weights kept are the average's, not the raw ones': one run's
weights smoothed over its last epochs, at the cost of one copy of the trainable weights.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn

from smiexlm.finetuning.loop_config import LoopConfig


def trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The (name, parameter) pairs of ``model`` that train."""
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


class WeightAverage:
    """The exponential moving average of a model's trainable weights (``ema_half_life``)."""

    def __init__(self, model: nn.Module, decay: float):
        self.params = trainable(model)
        self.weights = {n: p.detach().float().clone() for n, p in self.params}
        self.decay = decay

    @classmethod
    def start(cls, model: nn.Module, config: LoopConfig, n_train: int) -> WeightAverage | None:
        if not config.ema_half_life:
            return None
        steps_per_epoch = math.ceil(n_train / config.batch_size)
        return cls(model, 0.5 ** (1.0 / (config.ema_half_life * steps_per_epoch)))

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold in the weights after update ``step`` (0-based)."""
        keep = min(self.decay, (1 + step) / (10 + step))
        for name, param in self.params:
            self.weights[name].lerp_(param.detach().float(), 1.0 - keep)

    def restore(self, saved: dict[str, torch.Tensor] | None, device: torch.device) -> None:
        from smiexlm.finetuning.state import StateMismatchError

        if saved is None or saved.keys() != self.weights.keys():
            raise StateMismatchError("the saved state has no weight average for this run")
        self.weights = {n: w.to(device) for n, w in saved.items()}

    @torch.no_grad()
    def copy_into_model(self) -> None:
        for name, param in self.params:
            param.copy_(self.weights[name])

    @staticmethod
    @contextmanager
    def swapped_in(average: WeightAverage | None):
        """The average's weights in the model for the block; the raw ones back after it."""
        if average is None:
            yield
            return
        raw = {n: p.detach().clone() for n, p in average.params}
        average.copy_into_model()
        try:
            yield
        finally:
            with torch.no_grad():
                for name, param in average.params:
                    param.copy_(raw[name])
