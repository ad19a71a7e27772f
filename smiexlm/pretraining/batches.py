"""Batches for pre-training: the dataset folder, the epoch's micro-batch order, masking.

The pipeline's ``TokenBudgetSampler`` orders an epoch (seeded by ``seed`` and the epoch) into
micro-batches of at most ``max_tokens`` padded tokens. Every process computes the same order;
the global index of a micro-batch picks the process that consumes it and seeds its masking
generator, so masks do not depend on how a global batch is split between processes.

A model with a descriptor head (objective ``mtr``, or ``aux_descriptor_weight`` > 0) reads the
dataset's descriptor rows with its tokens: each item is ``(ids, normalised row)`` and a batch
gains a (B, D) float32 target tensor aligned with its token rows (NaN = missing). ``mtr``
batches are not masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smiexlm.chemistry.descriptor_stats import DescriptorStats, load_dataset_stats
from smiexlm.data.collate import collate
from smiexlm.data.descriptors import DescriptorTable
from smiexlm.data.sampler import TokenBudgetSampler
from smiexlm.data.shards import TokenDataset, read_manifest
from smiexlm.errors import DataError, VocabularyMismatchError
from smiexlm.model.masking import mask_tokens
from smiexlm.paths import VOCAB_NAME
from smiexlm.pretraining.config import TrainConfig
from smiexlm.tokenizer import Tokenizer, load_tokenizer
from smiexlm.tokenizer.special import IGNORE_INDEX


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (stable across runs and platforms)."""
    return int(
        np.random.SeedSequence([p & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint64)[0]
        >> np.uint64(1)
    )


@dataclass
class TrainingData:
    train: Any
    valid: Any | None
    train_lengths: np.ndarray
    valid_lengths: np.ndarray | None
    tokenizer: Tokenizer
    vocab_hash: str
    descriptor_stats: DescriptorStats | None = None  # the train split's, when read

    @property
    def n_descriptors(self) -> int:
        return 0 if self.descriptor_stats is None else self.descriptor_stats.n_descriptors


class WithDescriptors:
    """A split's tokens and descriptor rows: ``item[i]`` = ((L,) uint16 ids, (D,) float32
    normalised descriptors, NaN = missing); ``lengths`` as the token dataset's."""

    def __init__(self, tokens: TokenDataset, table: DescriptorTable, stats: DescriptorStats):
        if table.names != stats.names:
            raise DataError(
                f"dataset {str(tokens.path)!r}: the descriptor columns of the manifest differ "
                "from those of descriptors.json; rebuild the dataset"
            )
        self.tokens, self.table, self.stats = tokens, table, stats
        self.lengths = tokens.lengths

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.tokens[index], self.stats.normalize(self.table[index])


def _lengths(dataset) -> np.ndarray:
    lengths = getattr(dataset, "lengths", None)
    if lengths is None:
        lengths = [len(dataset[i]) for i in range(len(dataset))]
    return np.asarray(lengths, dtype=np.int64)


def open_dataset(data_dir: Path, descriptors: bool = False) -> TrainingData:
    """Open a dataset folder written by the corpus pipeline, with clear errors when absent;
    with ``descriptors`` its items carry their normalised descriptor rows too."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(
            f"dataset folder {str(data_dir)!r} does not exist: expected a folder built by the "
            "corpus pipeline (manifest.json, vocab.json, train/valid shards)"
        )
    manifest_path = data_dir / "manifest.json"
    if not manifest_path.is_file():
        raise DataError(
            f"dataset folder {str(data_dir)!r} has no manifest.json: expected a folder built by "
            "the corpus pipeline"
        )
    if not (data_dir / VOCAB_NAME).is_file():
        raise DataError(f"dataset folder {str(data_dir)!r} has no vocab.json")
    manifest = read_manifest(data_dir)
    tokenizer = load_tokenizer(data_dir / VOCAB_NAME)  # SMILES or text vocabulary
    vocab_hash = manifest.get("vocab_hash") or tokenizer.vocab_hash
    if vocab_hash != tokenizer.vocab_hash:
        raise VocabularyMismatchError(
            f"dataset {str(data_dir)!r}: manifest.json vocab_hash {vocab_hash} differs from the "
            f"hash of its vocab.json ({tokenizer.vocab_hash})"
        )
    train = TokenDataset(data_dir, split="train")
    valid = None  # a corrupted valid split is an error, not a run without validation
    if "valid" in manifest["splits"]:
        valid = TokenDataset(data_dir, split="valid")
        valid = valid if len(valid) > 0 else None
    stats = load_dataset_stats(data_dir) if descriptors else None
    if stats is not None:
        train = WithDescriptors(train, DescriptorTable(data_dir, "train", manifest), stats)
        if valid is not None:
            valid = WithDescriptors(valid, DescriptorTable(data_dir, "valid", manifest), stats)
    return TrainingData(
        train=train,
        valid=valid,
        train_lengths=_lengths(train),
        valid_lengths=_lengths(valid) if valid is not None else None,
        tokenizer=tokenizer,
        vocab_hash=vocab_hash,
        descriptor_stats=stats,
    )


def check_vocabulary(config: TrainConfig, data: TrainingData) -> None:
    """The config may pin the vocabulary (``model.vocab_size`` / ``model.vocab_hash``)."""
    size = config.model.overrides.get("vocab_size")
    if size is not None and size != data.tokenizer.vocab_size:
        raise VocabularyMismatchError(
            f"config model.vocab_size = {size} but the dataset's vocabulary has "
            f"{data.tokenizer.vocab_size} tokens (hash {data.vocab_hash}): rebuild the dataset "
            "with the model's vocabulary or drop model.vocab_size from the config"
        )
    pinned = config.model.overrides.get("vocab_hash")
    if pinned is not None and pinned != data.vocab_hash:
        raise VocabularyMismatchError(
            f"config model.vocab_hash = {pinned} but the dataset's vocabulary hash is "
            f"{data.vocab_hash}"
        )


class _Keyed(torch.utils.data.Dataset):
    """Dataset whose keys are ``(global_index, row)``; rows come back with their batch key."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]):
        return key[0], self.dataset[key[1]]


class MaskingCollator:
    """Pad a micro-batch and mask it with a generator seeded by its global index."""

    def __init__(self, model_config, seed: int, epoch: int):
        self.model_config, self.seed, self.epoch = model_config, seed, epoch

    def __call__(self, items):
        index = items[0][0]
        rows = [a for _, a in items]
        targets = None
        if isinstance(rows[0], tuple):  # (ids, descriptor row) items
            targets = torch.from_numpy(np.stack([d for _, d in rows]))  # (B, D) float32
            rows = [ids for ids, _ in rows]
        input_ids, attention_mask = collate([np.asarray(a) for a in rows])  # (B, T)
        c = self.model_config
        if c.objective == "mtr":  # no masking: the targets are the descriptors
            masked, labels = input_ids, torch.full_like(input_ids, IGNORE_INDEX)
        else:
            generator = torch.Generator().manual_seed(mix_seed(self.seed, self.epoch, index, 7))
            masked, labels = mask_tokens(
                input_ids.long(),
                attention_mask.bool(),
                mask_prob=c.mask_prob,
                policy=c.mask_policy,
                vocab_size=c.vocab_size,
                generator=generator,
                mask_id=c.mask_id,
            )
        batch = (masked, attention_mask.bool(), labels)
        return batch if targets is None else (*batch, targets)


def forward_kwargs(batch: tuple, device: torch.device) -> dict[str, torch.Tensor]:
    """``ExLMModel.forward``'s keyword arguments for a collated batch, moved to ``device``."""
    names = ("input_ids", "attention_mask", "labels", "descriptors")
    return {n: t.to(device, non_blocking=True) for n, t in zip(names, batch, strict=False)}


def epoch_batches(
    lengths: np.ndarray, max_tokens: int, seed: int, epoch: int, shuffle: bool
) -> list[list[int]]:
    """The epoch's global micro-batch order (every process computes the same list)."""
    sampler = TokenBudgetSampler(lengths, max_tokens=max_tokens, shuffle=shuffle, seed=seed)
    sampler.set_epoch(epoch)
    return [b for b in sampler if b]


def make_loader(dataset, batches: list[tuple[int, list[int]]], collator, num_workers: int):
    keyed = [[(g, i) for i in rows] for g, rows in batches]
    return torch.utils.data.DataLoader(
        _Keyed(dataset),
        batch_sampler=keyed,
        collate_fn=collator,
        num_workers=num_workers,
        persistent_workers=False,
    )
