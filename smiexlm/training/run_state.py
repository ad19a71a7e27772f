"""Training checkpoints: a folder ``ExLMModel.from_pretrained`` loads, plus the training state.

``RUN_DIR/checkpoints/step_000100/`` holds

* ``config.json``, ``vocab.json``, ``model.safetensors`` — the model, as ``save_pretrained``
  writes it (``from_pretrained`` needs nothing else);
* ``optimizer.safetensors`` — Adam's moment and step tensors, keyed ``state.<i>.<name>``;
* ``rng.safetensors`` — torch CPU (and CUDA) generator states as uint8 tensors;
* ``trainer_state.json`` — step, data position, schedule, optimiser hyper-parameters, the
  numpy / Python RNG states as lists, best validation loss, vocabulary hash, the dataset's
  folder and content id;
* ``train_config.json`` — the resolved :class:`TrainConfig`.

No pickle anywhere. A folder is written under a temporary name and renamed into place, so a
crash never leaves a half-written checkpoint under a real name. ``best/`` and ``last/`` are
independent copies (never hard links: a file damaged in one folder stays whole in the others);
only the newest ``keep_last`` ``step_*`` folders are kept.

``--resume`` restores only a checkpoint of the same model: its ``config.json`` is compared
with the run's model config before any weight is loaded (:class:`ResumeMismatchError`).
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from smiexlm.atomic import atomic_dir
from smiexlm.errors import DataError, SmiexlmError, VocabularyMismatchError, first_line
from smiexlm.modelio.integrity import load_tensors, record_checksums, verify_checksum
from smiexlm.modelio.layout import CONFIG_NAME, WEIGHTS_NAME
from smiexlm.paths import read_json_file

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.safetensors"
RNG_FILE = "rng.safetensors"
CONFIG_FILE = "train_config.json"


@dataclass
class TrainerState:
    """Where a run stands; everything besides tensors that resume needs."""

    step: int = 0  # optimiser updates done
    epoch: int = 0  # epoch of the next micro-batch
    batch_in_epoch: int = 0  # index (in the epoch's global batch order) of the next micro-batch
    tokens_seen: int = 0  # real (non-pad) tokens consumed, all processes
    best_valid_loss: float | None = None
    best_step: int | None = None
    vocab_hash: str | None = None
    data_dir: str | None = None  # the dataset folder the run trains on
    data_id: str | None = None  # its content id (see resume.dataset_id)
    world_size: int | None = None  # processes training it: the global batch is update_freq x N
    extra: dict[str, Any] = field(default_factory=dict)


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step:06d}"


# ------------------------------------------------------------------ optimiser state
def optimizer_to_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict, list[dict]]:
    """Split an optimiser state dict into safetensors-able tensors and JSON-able groups."""
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    for index, values in state["state"].items():
        for name, value in values.items():
            if not torch.is_tensor(value):
                value = torch.tensor(value)
            tensors[f"state.{index}.{name}"] = value.detach().cpu().contiguous()
    groups = [
        {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items()}
        for group in state["param_groups"]
    ]
    return tensors, groups


def optimizer_from_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], groups: list[dict]
) -> None:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = value
    param_groups = [
        {k: (tuple(v) if k == "betas" else v) for k, v in group.items()} for group in groups
    ]
    optimizer.load_state_dict({"state": state, "param_groups": param_groups})


# ------------------------------------------------------------------------ RNG state
def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda_{i}"] = s
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, py_state, gauss_next = random.getstate()
    scalars = {
        "numpy": [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)],
        "python": [version, list(py_state), gauss_next],
    }
    return tensors, scalars


def set_rng_state(tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = [tensors[k] for k in sorted(tensors) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)
    kind, keys, pos, has_gauss, cached = scalars["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    version, py_state, gauss_next = scalars["python"]
    random.setstate((version, tuple(py_state), gauss_next))


# ------------------------------------------------------------------------ save/load
def save_training_state(
    folder: Path,
    model,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    schedule: dict[str, Any],
    train_config: dict[str, Any],
    tokenizer: Any,
) -> Path:
    """Write one checkpoint folder atomically; returns its final path."""
    with atomic_dir(folder) as tmp:
        model.save_pretrained(tmp, tokenizer=tokenizer)
        tensors, groups = optimizer_to_tensors(optimizer)
        save_file(tensors, str(tmp / OPTIMIZER_FILE))
        rng_tensors, rng_scalars = rng_state()
        save_file({k: v.contiguous() for k, v in rng_tensors.items()}, str(tmp / RNG_FILE))
        payload = {
            "format": "smiexlm-trainer-state/1",
            "state": asdict(state),
            "schedule": schedule,
            "optimizer_groups": groups,
            "rng": rng_scalars,
        }
        (tmp / STATE_FILE).write_text(json.dumps(payload, indent=1))
        (tmp / CONFIG_FILE).write_text(json.dumps(train_config, indent=2))
        record_checksums(tmp, OPTIMIZER_FILE, RNG_FILE, STATE_FILE, CONFIG_FILE)  # and weights'
    return Path(folder)


class CheckpointError(DataError):
    """A training checkpoint that cannot be read back (truncated, corrupted, incomplete)."""


class ResumeMismatchError(SmiexlmError, ValueError):
    """``--resume`` with settings the run was not started with (model config, dataset)."""


def check_model_config(folder: Path, saved: dict[str, Any], model) -> None:
    """Raise when the checkpoint's ``config.json`` (``saved``) describes another model than
    ``model``; fields absent from an older checkpoint are not compared."""
    current = model.config.to_dict()
    if saved.get("vocab_hash") not in (None, current.get("vocab_hash")):
        raise VocabularyMismatchError(
            f"checkpoint {str(folder)!r} was trained with vocabulary {saved['vocab_hash']} but "
            f"the dataset has {current.get('vocab_hash')}"
        )
    changed = [k for k in current if k != "vocab_hash" and k in saved and saved[k] != current[k]]
    if changed:
        was = ", ".join(f"model.{k} = {saved[k]!r}" for k in changed[:3])
        now = ", ".join(f"model.{k} = {current[k]!r}" for k in changed[:3])
        more = f" (and {len(changed) - 3} more fields)" if len(changed) > 3 else ""
        raise ResumeMismatchError(
            f"--resume: checkpoint {str(folder)!r} holds a model with {was}{more} but the "
            f"config gives {now}; resume with the run's model settings or start a new --out"
        )


def restore_training_state(folder: Path, model, optimizer: torch.optim.Optimizer) -> TrainerState:
    """Restore weights, optimiser and RNG state in place; returns the trainer state.

    Every file is read and checked (against the sha256 the folder records of it) before
    anything is restored, so a bad checkpoint raises :class:`CheckpointError` (naming the
    folder and the file) and leaves the model and the optimiser untouched. A checkpoint
    written before the training files' sha256 were recorded is checked by its weights'."""
    folder = Path(folder)
    try:
        for name in (CONFIG_NAME, WEIGHTS_NAME, OPTIMIZER_FILE, STATE_FILE):
            if not (folder / name).is_file():
                raise DataError(f"{name} is missing")
        for name in (WEIGHTS_NAME, OPTIMIZER_FILE, RNG_FILE, STATE_FILE):
            if (folder / name).is_file():
                verify_checksum(folder / name, required=name == WEIGHTS_NAME)
        _, saved_config = read_json_file(folder / CONFIG_NAME, f"checkpoint {CONFIG_NAME}")
        weights = load_tensors(folder / WEIGHTS_NAME)
        _, payload = read_json_file(folder / STATE_FILE, STATE_FILE)
        if not all(k in payload for k in ("state", "optimizer_groups", "rng")):
            raise DataError(f"{STATE_FILE} lacks state, optimizer_groups or rng")
        state = TrainerState(**payload["state"])
        optim_tensors = load_tensors(folder / OPTIMIZER_FILE)
        rng = load_tensors(folder / RNG_FILE) if (folder / RNG_FILE).is_file() else None
    except (DataError, TypeError) as err:
        raise CheckpointError(f"checkpoint {str(folder)!r} is unreadable: {err}") from None
    check_model_config(folder, saved_config, model)
    try:
        model.load_state_dict(weights)
        optimizer_from_tensors(optimizer, optim_tensors, payload["optimizer_groups"])
    except (RuntimeError, ValueError, KeyError) as err:
        raise CheckpointError(f"checkpoint {str(folder)!r} does not fit this model and "
                              f"optimiser: {first_line(err)}") from None  # fmt: skip
    if rng is not None:
        set_rng_state(rng, payload["rng"])
    return state


def resume_checkpoint(
    run_dir: Path, model, optimizer: torch.optim.Optimizer, fallback: bool = False
) -> tuple[Path | None, TrainerState | None]:
    """Restore the newest ``step_*`` checkpoint of ``run_dir``: ``(folder, state)``, or
    ``(None, None)`` when there is none.

    A bad newest checkpoint raises CheckpointError naming it and the older ones; with
    ``fallback`` the newest good one is restored instead (each bad one is logged)."""
    import logging

    root = Path(run_dir) / "checkpoints"
    steps = by_step(p for p in root.glob("step_*") if p.is_dir())[::-1]
    bad: list[str] = []
    for i, folder in enumerate(steps):
        try:
            return folder, restore_training_state(folder, model, optimizer)
        except CheckpointError as err:
            older = [p.name for p in steps[i + 1 :]]
            if not fallback:
                hint = (
                    f"; pass --skip-bad-checkpoints to resume from the newest good one of {older}"
                    if older else "; no older checkpoint is left"
                )  # fmt: skip
                raise CheckpointError(f"{err}{hint}") from None
            logging.getLogger(__name__).warning("%s; trying the previous checkpoint", err)
            bad.append(folder.name)
    if bad:
        raise CheckpointError(
            f"no readable checkpoint in {str(root)!r}: {bad} are all truncated or corrupted"
        )
    return None, None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete ``step_*`` folder of a run, or None."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return None
    steps = by_step(p for p in root.glob("step_*") if (p / STATE_FILE).is_file())
    return steps[-1] if steps else None


def by_step(folders) -> list[Path]:
    """``step_<N>`` folders, oldest first by N (as text, ``step_1000000`` came before
    ``step_999999``); a name whose N is not a number goes first."""

    def step(path: Path) -> int:
        number = path.name.removeprefix("step_")
        return int(number) if number.isdigit() else -1

    return sorted(folders, key=lambda p: (step(p), p.name))


def copy_checkpoint(source: Path, target: Path) -> Path:
    """Replace ``target`` with an independent copy of the folder ``source``, atomically."""
    with atomic_dir(target) as tmp:
        for item in Path(source).iterdir():
            shutil.copy2(item, tmp / item.name)
    return Path(target)


def prune_checkpoints(run_dir: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` ``step_*`` folders; returns those deleted."""
    root = Path(run_dir) / "checkpoints"
    steps = by_step(p for p in root.glob("step_*") if p.is_dir())
    doomed = steps[:-keep_last] if keep_last > 0 else steps
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed
