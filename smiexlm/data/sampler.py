"""Token-budget batching with length bucketing, deterministic per epoch, DDP-aware.

A batch is a list of indices whose padded size ``len(batch) * max(length)`` is at most
``max_tokens`` (fairseq's ``--max-tokens``, e.g. 64k). Each epoch the indices are shuffled
with ``seed + epoch``, cut into buckets of ``bucket_size`` indices, sorted by length inside a
bucket (so batches waste little padding), packed greedily, and the batches are shuffled.
With ``world_size > 1`` each rank takes every ``world_size``-th batch; the batch list is
first padded by repeating its first batches so that all ranks get the same number of steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from smiexlm.errors import ConfigError


def token_budget_batches(
    lengths: Sequence[int] | np.ndarray, max_tokens: int, batch_size: int | None = None
) -> list[range]:
    """Cut positions 0..n-1 (already sorted by ``lengths``, ascending) greedily into
    consecutive batches whose padded size ``len(batch) * max(length)`` stays within
    ``max_tokens`` and whose size stays within ``batch_size``. A single sequence longer than
    the budget gets a batch of its own."""
    lens = np.asarray(lengths, dtype=np.int64)  # (N,) ascending
    batches = []
    i, n = 0, len(lens)
    while i < n:
        limit = max(1, max_tokens // max(int(lens[i]), 1))
        if batch_size is not None:
            limit = min(limit, batch_size)
        # Lengths ascend, so the batch [i, j] costs (j - i + 1) * lens[j].
        window = lens[i : i + limit]
        cost = np.arange(1, len(window) + 1) * window
        size = max(int(np.searchsorted(cost > max_tokens, True)), 1)
        batches.append(range(i, i + size))
        i += size
    return batches


def length_batches(
    lengths: Sequence[int] | np.ndarray, max_tokens: int, batch_size: int | None = None
) -> list[range]:
    """Cut positions 0..n-1 (already sorted by ``lengths``, ascending) into consecutive
    batches of one length each, none over ``max_tokens`` tokens (a single longer sequence
    gets a batch of its own) or ``batch_size`` sequences: batches without padding, which
    served inference computes for no position that is not a real one."""
    lens = np.asarray(lengths, dtype=np.int64)
    starts = np.flatnonzero(np.diff(lens, prepend=-1)).tolist()
    batches = []
    for start, end in zip(starts, [*starts[1:], len(lens)][: len(starts)], strict=True):
        step = max(1, max_tokens // max(int(lens[start]), 1))
        if batch_size is not None:
            step = min(step, batch_size)
        batches.extend(range(i, min(i + step, end)) for i in range(start, end, step))
    return batches


class TokenBudgetSampler:
    def __init__(
        self,
        lengths: np.ndarray,
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        bucket_size: int = 65536,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)  # (N,)
        if max_tokens < 1:
            raise ConfigError("max_tokens", max_tokens, "a positive integer")
        if len(self.lengths) and int(self.lengths.max()) > max_tokens:
            raise ConfigError(
                "max_tokens",
                max_tokens,
                f"at least the longest item ({int(self.lengths.max())} tokens)",
            )
        if bucket_size < 1:
            raise ConfigError("bucket_size", bucket_size, "a positive integer")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError("rank", rank, f"0 <= rank < world_size (= {world_size})")
        self.max_tokens = max_tokens
        self.shuffle, self.seed, self.bucket_size = shuffle, seed, bucket_size
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _pack(self, order: np.ndarray) -> list[np.ndarray]:
        """Greedy batches over ``order`` (indices sorted by length within the bucket)."""
        batches = token_budget_batches(self.lengths[order], self.max_tokens)
        return [order[b.start : b.stop] for b in batches]

    def _batches(self) -> list[np.ndarray]:
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        rng = np.random.default_rng([self.seed, self.epoch])
        n = len(self.lengths)
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        batches: list[np.ndarray] = []
        for start in range(0, n, self.bucket_size):
            bucket = order[start : start + self.bucket_size]
            bucket = bucket[np.argsort(self.lengths[bucket], kind="stable")]
            batches.extend(self._pack(bucket))
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        if self.world_size > 1 and batches:
            extra = (-len(batches)) % self.world_size
            batches = batches + [batches[i % len(batches)] for i in range(extra)]
            batches = batches[self.rank :: self.world_size]
        self._cache = (self.epoch, batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self._batches():
            yield batch.tolist()

    def __len__(self) -> int:
        return len(self._batches())
