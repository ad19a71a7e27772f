"""Examples and batches of fine-tuning: length-bucketed training order, length-sorted eval.

A random batch of SMILES is padded to its longest member; on BBBP that is ~110 tokens where
the mean is 43, so most of the compute went to padding. Training batches are therefore cut
from *windows* of ``window`` batches sorted by length: each epoch shuffles the examples,
sorts each window, cuts it into batches and shuffles the batch order. Evaluation sorts the
whole set by length, caps the padded positions per batch (one 238-token molecule no longer
pads 200 short ones) and puts the outputs back in input order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from smiexlm.data.collate import collate
from smiexlm.data.sampler import token_budget_batches
from smiexlm.errors import DataError


@dataclass
class Examples:
    """What a task adapter hands to the engine.

    ``rows``: token ids per example (BOS … EOS) — or ``pooled`` (N, d), encoder features
    computed once when the encoder is frozen. ``targets``: (N, T) float with NaN = missing,
    or (N,) long class ids with −100 = missing; None at prediction time. ``features``: (N, F)
    normalised per-example features for a hybrid head, or None. ``variants``: K other
    spellings of each example's input (random SMILES, :mod:`smiexlm.data.augment`) as token
    ids: training draws among the K + 1 spellings each epoch; :func:`~smiexlm.finetuning.
    inference.predict_views` scores every spelling (test-time augmentation).
    """

    rows: list[list[int]] | None = None
    targets: Tensor | None = None
    features: Tensor | None = None
    pooled: Tensor | None = None
    variants: list[list[list[int]]] | None = None

    def __post_init__(self) -> None:
        if (self.rows is None) == (self.pooled is None):
            raise DataError("Examples: give exactly one of rows (token ids) or pooled features")
        n = len(self)
        for name in ("targets", "features"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise DataError(
                    f"Examples.{name}: {len(value)} rows, expected {n} (one per example)"
                )

    def __len__(self) -> int:
        return len(self.rows) if self.rows is not None else len(self.pooled)

    def lengths(self) -> np.ndarray:
        """Token count per example (all ones for cached pooled features)."""
        if self.rows is None:
            return np.ones(len(self), dtype=np.int64)
        return np.fromiter((len(r) for r in self.rows), dtype=np.int64, count=len(self.rows))

    def subset(self, index: np.ndarray) -> Examples:
        pick = torch.from_numpy(np.asarray(index, dtype=np.int64))
        return Examples(
            rows=None if self.rows is None else [self.rows[i] for i in index],
            targets=None if self.targets is None else self.targets[pick],
            features=None if self.features is None else self.features[pick],
            pooled=None if self.pooled is None else self.pooled[pick],
            variants=None if self.variants is None else [self.variants[i] for i in index],
        )

    @property
    def n_views(self) -> int:
        """Spellings per example: 1 + K variants."""
        return 1 + (len(self.variants[0]) if self.variants else 0)

    def view(self, choice: int | np.ndarray) -> Examples:
        """The examples spelled as ``choice`` says (0 = ``rows``, v = variant v), one choice
        for all or one per example; without variants."""
        choices = np.broadcast_to(np.asarray(choice), (len(self),))
        if self.rows is None or not choices.any():
            return Examples(self.rows, self.targets, self.features, self.pooled)
        rows = [r if c == 0 else v[c - 1] for r, v, c in zip(self.rows, self.variants, choices, strict=True)]  # fmt: skip
        return Examples(rows, self.targets, self.features, None)


def bucketed_batches(
    lengths: np.ndarray, batch_size: int, rng: np.random.Generator, window: int = 50
) -> list[np.ndarray]:
    """One epoch's batches (index arrays): shuffle, sort windows of ``window`` batches by
    length, cut, shuffle the batch order. ``window=1`` gives plain shuffled batches."""
    order = rng.permutation(len(lengths))
    span = batch_size * max(1, window)
    batches = []
    for start in range(0, len(order), span):
        chunk = order[start : start + span]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


def sorted_batches(
    lengths: np.ndarray, batch_size: int, max_tokens: int | None = None
) -> list[np.ndarray]:
    """Evaluation batches: all examples sorted by length (outputs are put back in order), at
    most ``batch_size`` examples and, with ``max_tokens``, at most that many padded positions
    (count × longest) per batch; a longer example still gets a batch of its own."""
    order = np.argsort(lengths, kind="stable")
    if max_tokens is None:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    cuts = token_budget_batches(lengths[order], max_tokens, batch_size)
    return [order[cut.start : cut.stop] for cut in cuts]


def to_batch(
    examples: Examples, index: np.ndarray, device: torch.device, pad_id: int = 0
) -> dict[str, Tensor]:
    """The keyword arguments of the model's forward for the examples ``index``."""
    pick = torch.from_numpy(np.asarray(index, dtype=np.int64))
    batch: dict[str, Tensor] = {}
    if examples.rows is not None:
        ids, mask = collate([examples.rows[i] for i in index], pad_id)
        batch["input_ids"], batch["attention_mask"] = ids.to(device), mask.to(device)
    else:
        batch["pooled"] = examples.pooled[pick].to(device)
    if examples.targets is not None:
        batch["labels"] = examples.targets[pick].to(device)
    if examples.features is not None:
        batch["features"] = examples.features[pick].to(device)
    return batch


def iterate(
    examples: Examples, batches: list[np.ndarray], device: torch.device, pad_id: int = 0
) -> Iterator[tuple[np.ndarray, dict[str, Tensor]]]:
    for index in batches:
        yield index, to_batch(examples, index, device, pad_id)
