"""Training with the encoder frozen: ``freeze`` (the head only, on the encoder's cached
features), ``freeze_layers`` (the embeddings and the first blocks) and the head-first stage.

``freeze=True`` trains the head only: the encoder runs once, in eval mode, over every example,
and the head trains on those cached features (seconds instead of minutes).
``freeze_layers=N`` freezes the embeddings and the first N encoder blocks.

``head_epochs=E`` first trains the head alone for E epochs on the frozen encoder's features
(cached, as with ``freeze``), at ``head_lr`` decaying linearly to 0, then the whole model
trains on the schedule as usual (LP-FT, Kumar et al., 2022: a random head's first gradients
pull the pretrained features towards itself; a fitted head leaves them less to undo). The
head-only stage draws its own batches and dropout, so the schedule that follows sees the
batches and masks it would have seen without it. It is validated as epoch 0, which selection
may keep.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from smiexlm.errors import ConfigError
from smiexlm.finetuning.batches import Examples, to_batch
from smiexlm.finetuning.inference import predict
from smiexlm.finetuning.loop_config import LoopConfig


def freeze_encoder(model: nn.Module, n_layers: int | None) -> None:
    """Freeze ``model.model`` (an ExLMModel): all of it (``None``), or the embeddings and the
    first ``n_layers`` blocks."""
    encoder = model.model
    if n_layers is None:
        encoder.requires_grad_(False)
        return
    total = len(encoder.encoder.layers)
    if n_layers > total:
        raise ConfigError("freeze_layers", n_layers, f"at most the encoder's {total} layers")
    if n_layers:
        encoder.embed.requires_grad_(False)
        for block in encoder.encoder.layers[:n_layers]:
            block.requires_grad_(False)


def train_head_first(model: nn.Module, train: Examples, config: LoopConfig, seed: int,
                     device: torch.device) -> float:  # fmt: skip
    """``head_epochs``: the head of ``model`` alone on the frozen encoder's cached features of
    ``train``, with its own optimiser, batches and dropout stream (the same on every process,
    seeded by ``seed``); the encoder's parameters train again afterwards as they did before.
    The mean training loss of its last epoch."""
    from smiexlm.training.optim import (
        PolynomialDecaySchedule,
        adamw_with_decay_groups,
        clip_gradients,
        set_lr,
    )

    encoder_grads = [p.requires_grad for p in model.model.parameters()]
    model.model.requires_grad_(False)
    head = [p for p in model.parameters() if p.requires_grad]
    train = cached_features(model, train, config)
    optimizer = adamw_with_decay_groups(  # over the head: the encoder is frozen here
        model, config.head_lr, config.weight_decay, config.adam_betas, config.adam_eps
    )
    steps = math.ceil(len(train) / config.batch_size)
    schedule = PolynomialDecaySchedule(config.head_lr, 0, config.head_epochs * steps)
    rng = np.random.default_rng((seed, 1))
    model.train()
    model.model.eval()
    losses, step = [], 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        for _ in range(config.head_epochs):
            for index in np.array_split(rng.permutation(len(train)), steps):
                set_lr(optimizer, schedule.lr_at(step))
                optimizer.zero_grad(set_to_none=True)
                loss = model(**to_batch(train, index, device, config.pad_id)).loss
                loss.backward()
                where = f"fine-tuning the head first diverged at step {step + 1}"
                clip_gradients(head, config.clip_norm, where, config.to_lower("head_lr"))
                optimizer.step()
                losses.append(loss.detach())
                step += 1
    for param, grad in zip(model.model.parameters(), encoder_grads, strict=True):
        param.requires_grad_(grad)
    return float(torch.stack(losses[-steps:]).mean())


def cached_features(model: nn.Module, examples: Examples, config: LoopConfig) -> Examples:
    """``examples`` with the frozen encoder's pooled features in place of token ids."""
    if examples.rows is None:
        return examples
    pooled = predict(
        model, examples, config.eval_batch_size, config.precision, config.pad_id, "pooled"
    )
    return Examples(None, examples.targets, examples.features, torch.from_numpy(pooled))
