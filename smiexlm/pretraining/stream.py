"""Which micro-batches a process reads: the training stream, epoch after epoch, from a data
position (epoch, index of the next micro-batch), and the fixed sample that validation scores.

An optimiser step consumes ``world_size × update_freq`` consecutive micro-batches of an epoch's
order; the global index of a micro-batch picks the process that reads it
(:mod:`~smiexlm.pretraining.batches`). Sequences longer than the model's ``max_positions`` are
left out of both. Training reads each molecule as stored or, with ``spelling = "random"``, in a
random SMILES of the epoch (:mod:`~smiexlm.pretraining.spelling`); validation as stored.
"""

from __future__ import annotations

import numpy as np

from smiexlm.errors import DataError
from smiexlm.pretraining.batches import MaskingCollator, TrainingData, epoch_batches, make_loader
from smiexlm.pretraining.config import TrainConfig
from smiexlm.pretraining.spelling import training_items
from smiexlm.training import distributed as dist_utils


class TrainStream:
    """This process's training micro-batches for ``config`` over ``data``."""

    def __init__(self, config: TrainConfig, data: TrainingData, model_config, info):
        self.config, self.data, self.model_config, self.info = config, data, model_config, info
        self.per_step = info.world_size * config.update_freq
        limit = model_config.max_positions
        self.too_long = int((data.train_lengths > limit).sum())
        self.lengths = np.where(data.train_lengths > limit, 0, data.train_lengths)
        training_items(data, config.spelling, config.seed, 0, limit)  # refused before it runs

    def epoch_plan(self, epoch: int) -> list[list[int]]:
        """The epoch's micro-batches, all processes', cut to whole optimiser steps."""
        batches = epoch_batches(
            self.lengths, self.config.max_tokens, self.config.seed, epoch, shuffle=True
        )
        if self.too_long:  # sequences over max_positions have length 0 here: leave them out
            batches = [[i for i in b if self.lengths[i] > 0] for b in batches]
            batches = [b for b in batches if b]
        usable = dist_utils.shard_batches(
            len(batches), self.info.world_size, self.config.update_freq
        )
        if usable == 0:
            raise DataError(
                f"the training split yields {len(batches)} micro-batches per epoch at "
                f"max_tokens={self.config.max_tokens}, fewer than one optimiser step needs "
                f"({self.per_step}); lower max_tokens or update_freq"
            )
        return batches[:usable]

    def batches(self, epoch: int, position: int):
        """Yield (epoch, next position, tensors) for this process, forever, from a position."""
        while True:
            plan = self.epoch_plan(epoch)
            if position >= len(plan):
                epoch, position = epoch + 1, 0
                continue
            mine = [
                (g, plan[g])
                for g in range(position, len(plan))
                if (g % self.per_step) % self.info.world_size == self.info.rank
            ]
            collator = MaskingCollator(self.model_config, self.config.seed, epoch)
            items = training_items(self.data, self.config.spelling, self.config.seed, epoch,
                                   self.model_config.max_positions)  # fmt: skip
            loader = make_loader(items, mine, collator, self.config.num_workers)
            for n, batch in enumerate(loader, start=1):
                done = position + (n // self.config.update_freq) * self.per_step
                yield epoch, done, batch
            epoch, position = epoch + 1, 0


def validation_loader(config: TrainConfig, data: TrainingData, model_config, info):
    """This process's share of the validation sample: a fixed random sample of batches
    (shuffled once with the run's seed), so every evaluation scores the same molecules, of all
    lengths."""
    limit = model_config.max_positions
    lengths = np.where(data.valid_lengths > limit, 0, data.valid_lengths)
    plan = [
        [i for i in b if lengths[i] > 0]
        for b in epoch_batches(lengths, config.max_tokens, config.seed, 0, True)
    ]
    plan = [b for b in plan if b]
    if config.valid_batches:
        plan = plan[: config.valid_batches]
    mine = [(g, b) for g, b in enumerate(plan) if g % info.world_size == info.rank]
    collator = MaskingCollator(model_config, config.seed, -1)
    return make_loader(data.valid, mine, collator, 0)
