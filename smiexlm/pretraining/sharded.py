"""Sharded training checkpoints: a ``step_*`` folder in files of at most N MiB, and back.

:func:`export_sharded` turns a training checkpoint (``RUN/checkpoints/step_000100``) into a
folder that travels where single files are size-limited:

* ``config.json``, ``vocab.json``, ``model.safetensors.index.json`` + ``model-*.safetensors``
  — a model folder that ``ExLMModel.from_pretrained`` loads as it is;
* ``optimizer.safetensors.index.json`` + ``optimizer-*.safetensors`` — Adam's moments, unless
  they were left behind to keep the folder under ``max_total_mib``;
* ``rng.safetensors``, ``trainer_state.json``, ``train_config.json`` — copied unchanged;
* ``sharded.json`` — what was written and what was left behind, and why.

:func:`restore_sharded` rebuilds a regular checkpoint folder from it in a run folder (on
another machine, say), so that ``smiexlm pretrain --resume`` continues the run. When the
optimizer state was left behind, Adam's moments are re-warmed first: ``rewarm_batches``
micro-batches of the training data are run at learning rate 0, which fills the moment
estimates from gradients at the restored weights without changing a weight. The restore
says so in its log, its report and the checkpoint's ``trainer_state.json``.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smiexlm.atomic import write_text_atomic
from smiexlm.errors import ConfigError, DataError
from smiexlm.modelio.integrity import load_tensors
from smiexlm.modelio.layout import CONFIG_NAME, WEIGHTS_NAME
from smiexlm.modelio.shards import MIB, index_name, is_sharded, load_sharded, save_sharded
from smiexlm.paths import VOCAB_NAME, read_json_file
from smiexlm.training import run_state as ckpt

logger = logging.getLogger(__name__)

SHARDED_FILE = "sharded.json"
FORMAT = "smiexlm-sharded-checkpoint/1"
OPTIMIZER_STEM = "optimizer"
_COPIED = (ckpt.STATE_FILE, ckpt.CONFIG_FILE, ckpt.RNG_FILE, CONFIG_NAME, VOCAB_NAME)


@dataclass
class ShardedExport:
    folder: Path
    step: int
    weights_mib: float
    optimizer_mib: float
    optimizer_included: bool
    note: str  # why the optimizer state was left behind, or ""


@dataclass
class RestoreReport:
    checkpoint: Path  # the regular checkpoint folder written in the run folder
    step: int
    optimizer: str  # "restored" or "re-warmed from N micro-batches at lr 0"


def _mib(tensors: dict[str, torch.Tensor]) -> float:
    return sum(t.numel() * t.element_size() for t in tensors.values()) / MIB


def export_sharded(
    checkpoint: Path | str,
    out: Path | str,
    max_shard_mib: float = 16.0,
    max_total_mib: float | None = None,
    weights_dtype: torch.dtype | None = None,
) -> ShardedExport:
    """Write the sharded copy of a training checkpoint folder into ``out``.

    ``weights_dtype`` (e.g. ``torch.float16``) casts the floating weights (an exact resume
    keeps the default, the training dtype). When weights and optimizer state together exceed
    ``max_total_mib``, the optimizer state is left behind (see :func:`restore_sharded`)."""
    source, out = Path(checkpoint), Path(out)
    for name in (WEIGHTS_NAME, ckpt.STATE_FILE, CONFIG_NAME, VOCAB_NAME):
        if not (source / name).is_file():
            raise DataError(f"checkpoint {str(source)!r} has no {name}: expected a step_* folder")
    weights = load_tensors(source / WEIGHTS_NAME)
    if weights_dtype is not None:
        weights = {
            k: v.to(weights_dtype) if v.is_floating_point() else v for k, v in weights.items()
        }
    optimizer_path = source / ckpt.OPTIMIZER_FILE
    optimizer = load_tensors(optimizer_path) if optimizer_path.is_file() else {}
    weights_mib, optimizer_mib = _mib(weights), _mib(optimizer)
    note = "" if optimizer else f"{source.name} holds no {ckpt.OPTIMIZER_FILE}"
    if optimizer and max_total_mib is not None and weights_mib + optimizer_mib > max_total_mib:
        note = (
            f"optimizer state ({optimizer_mib:.1f} MiB) left behind: with the weights "
            f"({weights_mib:.1f} MiB) it exceeds max_total_mib={max_total_mib}"
        )
        optimizer = {}
    if max_total_mib is not None and weights_mib > max_total_mib:
        raise ConfigError(
            "max_total_mib", max_total_mib, f"at least the weights' {weights_mib:.1f} MiB"
        )
    out.mkdir(parents=True, exist_ok=True)
    for name in _COPIED:
        if (source / name).is_file():
            shutil.copy2(source / name, out / name)
    save_sharded(weights, out, max_shard_mib)
    if optimizer:
        save_sharded(optimizer, out, max_shard_mib, stem=OPTIMIZER_STEM)
    _, payload = read_json_file(source / ckpt.STATE_FILE, ckpt.STATE_FILE)
    step = int(payload.get("state", {}).get("step", 0))
    doc = {
        "format": FORMAT,
        "source": source.name,
        "step": step,
        "max_shard_mib": max_shard_mib,
        "weights_dtype": str(weights_dtype or "as trained").replace("torch.", ""),
        "optimizer": "included" if optimizer else "left behind",
        "note": note,
    }
    write_text_atomic(out / SHARDED_FILE, json.dumps(doc, indent=1))
    return ShardedExport(out, step, weights_mib, optimizer_mib, bool(optimizer), note)


def restore_sharded(
    sharded: Path | str,
    run_dir: Path | str,
    data_dir: Path | str | None = None,
    rewarm_batches: int = 16,
    device: str = "cpu",
) -> RestoreReport:
    """Write ``run_dir/checkpoints/step_N`` from a sharded checkpoint; returns what was done.

    ``data_dir`` (the run's dataset) is needed only when the optimizer state was left behind:
    its first ``rewarm_batches`` micro-batches of the checkpoint's epoch re-warm Adam."""
    from smiexlm.model.model import ExLMModel
    from smiexlm.pretraining.config import TrainConfig
    from smiexlm.tokenizer import load_tokenizer
    from smiexlm.training.optim import build_optimizer

    sharded, run_dir = Path(sharded), Path(run_dir)
    for name in (ckpt.STATE_FILE, ckpt.CONFIG_FILE, CONFIG_NAME, VOCAB_NAME):
        if not (sharded / name).is_file():
            raise DataError(f"sharded checkpoint {str(sharded)!r} has no {name}")
    if not is_sharded(sharded):
        raise DataError(f"sharded checkpoint {str(sharded)!r} has no {index_name()}")
    _, payload = read_json_file(sharded / ckpt.STATE_FILE, ckpt.STATE_FILE)
    _, train_doc = read_json_file(sharded / ckpt.CONFIG_FILE, ckpt.CONFIG_FILE)
    config = TrainConfig.from_dict(train_doc)
    state = ckpt.TrainerState(**payload["state"])
    model = ExLMModel.from_pretrained(sharded).train()
    optimizer = build_optimizer(model, config)
    how = _optimizer_state(sharded, model, optimizer, payload, config, state, data_dir,
                           rewarm_batches, device)  # fmt: skip
    model = model.cpu()
    if (sharded / ckpt.RNG_FILE).is_file():
        ckpt.set_rng_state(load_tensors(sharded / ckpt.RNG_FILE), payload["rng"])
    folder = ckpt.save_training_state(
        ckpt.step_dir(run_dir, state.step),
        model,
        optimizer,
        state,
        payload.get("schedule", {}),
        train_doc,
        load_tokenizer(sharded / VOCAB_NAME),
    )
    return RestoreReport(folder, state.step, how)


def _optimizer_state(sharded: Path, model, optimizer, payload, config, state, data_dir,
                     rewarm_batches: int, device: str) -> str:  # fmt: skip
    """Adam's moments from the sharded checkpoint, or re-warmed from the run's data when it
    holds none (recorded in ``state.extra``); how it was done."""
    if is_sharded(sharded, OPTIMIZER_STEM):
        tensors = load_sharded(sharded / index_name(OPTIMIZER_STEM))
        ckpt.optimizer_from_tensors(optimizer, tensors, payload["optimizer_groups"])
        return "restored"
    if data_dir is None:
        raise ConfigError(
            "data_dir", None,
            f"the run's dataset folder: {sharded.name} holds no optimizer state, which is "
            "re-warmed from training batches",
        )  # fmt: skip
    n = rewarm_optimizer(model, optimizer, config, Path(data_dir), state, rewarm_batches, device)
    how = f"re-warmed from {n} micro-batches at lr 0"
    state.extra = {**state.extra, "optimizer_rewarmed": {"batches": n, "at_step": state.step}}
    logger.warning(
        "%s: the optimizer state was left behind; Adam's moments %s (weights unchanged)",
        sharded, how,
    )  # fmt: skip
    return how


def rewarm_optimizer(
    model, optimizer, config, data_dir: Path, state, n_batches: int, device: str = "cpu"
) -> int:
    """Fill Adam's moments from ``n_batches`` micro-batches at learning rate 0 (clipped like
    training, weights unchanged); returns the number of batches used."""
    from smiexlm.pretraining.batches import (
        MaskingCollator,
        epoch_batches,
        make_loader,
        open_dataset,
    )
    from smiexlm.training.optim import clip_gradients, set_lr

    if not isinstance(n_batches, int) or n_batches < 1:
        raise ConfigError("rewarm_batches", n_batches, "a positive integer")
    data = open_dataset(data_dir)
    limit = model.config.max_positions
    lengths = np.where(data.train_lengths > limit, 0, data.train_lengths)
    plan = [
        [i for i in b if lengths[i] > 0]
        for b in epoch_batches(lengths, config.max_tokens, config.seed, state.epoch, True)
    ]
    plan = [b for b in plan if b][:n_batches]
    collator = MaskingCollator(model.config, config.seed, state.epoch)
    model.to(device).train()
    set_lr(optimizer, 0.0)
    for batch in make_loader(data.train, list(enumerate(plan)), collator, 0):
        tensors = [t.to(device) for t in batch]
        model(*tensors).loss.backward()
        clip_gradients(model.parameters(), config.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return len(plan)


def describe(sharded: Path | str) -> dict[str, Any]:
    """The ``sharded.json`` record of a sharded checkpoint folder."""
    _, doc = read_json_file(Path(sharded) / SHARDED_FILE, "sharded checkpoint record", FORMAT)
    return doc
