"""A fine-tuning run's state after each epoch, so that a stopped run goes on where it was.

``RUN/state/`` is rewritten after every epoch, atomically (a folder renamed into place):

* ``model.safetensors`` — every weight of the model (encoder and head), float32;
* ``best.safetensors`` — the trainable weights of the best epoch so far (``select="best"``);
* ``average.safetensors`` — the moving average of the trainable weights (``ema_half_life``);
* ``optimizer.safetensors`` — AdamW's moments and step counts (``state.<i>.<name>``);
* ``rng.safetensors`` — torch's CPU generator state of every process (``torch_cpu.<rank>``;
  the CPU dropout masks are drawn from it, see :mod:`smiexlm.model.dropout`);
* ``state.json`` — the validation history, the best epoch and score, the epochs without a
  better one, the batch order's generator, steps and seconds so far, and the run's
  *identity*: the loop settings, seed, split sizes, process count and what the caller adds
  (data, backbone, features). A state is restored only into a run of the same identity.

``checksums.json`` records the sha256 of each, and a file that no longer matches is refused
by name. No pickle. Restoring puts back exactly what the next epoch reads, so a resumed run takes the
same batches, masks and updates as one that was never stopped: the same best epoch and the
same weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from smiexlm.atomic import atomic_dir
from smiexlm.errors import DataError, SmiexlmError
from smiexlm.modelio.integrity import load_tensors, record_checksums, verify_checksum
from smiexlm.modelio.layout import WEIGHTS_NAME
from smiexlm.paths import read_json_file

FORMAT = "smiexlm-finetune-state/1"
STATE_JSON = "state.json"
MODEL_FILE = WEIGHTS_NAME  # the weights, named as in a model folder
BEST_FILE = "best.safetensors"
AVERAGE_FILE = "average.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
RNG_FILE = "rng.safetensors"
STATE_FILES = (STATE_JSON, MODEL_FILE, BEST_FILE, AVERAGE_FILE, OPTIMIZER_FILE, RNG_FILE)


class StateMismatchError(SmiexlmError, ValueError):
    """A saved state belongs to another run (other settings, data, backbone or processes)."""


@dataclass
class EpochState:
    """Everything besides tensors that the next epoch needs (``state.json``)."""

    identity: dict[str, Any]
    progress: dict[str, Any]  # FitResult fields: steps, epochs_run, best_*, history, seconds
    since_best: int
    batch_rng: dict[str, Any]  # numpy Generator.bit_generator.state
    optimizer_groups: list[dict[str, Any]]


def _tensors(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Independent contiguous CPU copies: safetensors refuses tensors that share memory
    (tied weights), and a state must not change with the live model."""
    return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in values.items()}


def save_state(
    folder: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    best: dict[str, torch.Tensor] | None,
    rng_states: list[torch.Tensor],
    state: EpochState,
    average: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``folder`` whole or not at all; returns it."""
    from smiexlm.training.run_state import optimizer_to_tensors

    optim_tensors, groups = optimizer_to_tensors(optimizer)
    state.optimizer_groups = groups
    with atomic_dir(folder) as tmp:
        save_file(_tensors(model.state_dict()), str(tmp / MODEL_FILE))
        if best is not None:
            save_file(_tensors(best), str(tmp / BEST_FILE))
        if average is not None:
            save_file(_tensors(average), str(tmp / AVERAGE_FILE))
        save_file(optim_tensors, str(tmp / OPTIMIZER_FILE))
        rng = {f"torch_cpu.{rank}": s.contiguous() for rank, s in enumerate(rng_states)}
        save_file(rng, str(tmp / RNG_FILE))
        doc = {"format": FORMAT, **state.__dict__}
        (tmp / STATE_JSON).write_text(json.dumps(doc, indent=1))
        record_checksums(tmp, *(p.name for p in tmp.iterdir()))
    return Path(folder)


@dataclass
class LoadedState:
    """A state read back and checked, not yet put into a model."""

    state: EpochState
    model: dict[str, torch.Tensor]
    best: dict[str, torch.Tensor] | None
    optimizer: dict[str, torch.Tensor]
    rng: list[torch.Tensor]
    average: dict[str, torch.Tensor] | None = None


def load_state(folder: Path, identity: dict[str, Any]) -> LoadedState | None:
    """The state in ``folder`` (None when there is none), refused with
    :class:`StateMismatchError` when it was saved by a run of another ``identity``, and
    with a DataError naming the file when it is damaged."""
    folder = Path(folder)
    if not (folder / STATE_JSON).is_file():
        return None
    for name in STATE_FILES:  # against the sha256 it records (a state kept before: unchecked)
        if (folder / name).is_file():
            verify_checksum(folder / name, required=False)
    _, doc = read_json_file(folder / STATE_JSON, "fine-tuning state", FORMAT)
    try:
        state = EpochState(**{k: v for k, v in doc.items() if k != "format"})
    except TypeError as err:
        raise DataError(f"fine-tuning state {str(folder / STATE_JSON)!r}: {err}") from None
    check_identity(folder, state.identity, identity)
    best, average = (
        load_tensors(folder / name) if (folder / name).is_file() else None
        for name in (BEST_FILE, AVERAGE_FILE)
    )
    rng = load_tensors(folder / RNG_FILE)
    return LoadedState(
        state,
        load_tensors(folder / MODEL_FILE),
        best,
        load_tensors(folder / OPTIMIZER_FILE),
        [rng[f"torch_cpu.{rank}"] for rank in range(len(rng))],
        average,
    )


# Identity keys added after states (and hpopt studies) were first kept: one saved before a key
# resumes as it did (not compared on it); one that records it is.
ADDED_LATER = ("backbone_sha256", "labels", "task_type")


def as_kept(current: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """``current`` without the keys of :data:`ADDED_LATER` that ``saved`` predates."""
    return {k: v for k, v in current.items() if k in saved or k not in ADDED_LATER}


#: settings a resumed run may change (each says how the run goes on, not what it computes up
#: to here): the precision it goes on in is recorded in its result (``FitResult.precision``)
MAY_CHANGE = ("loop.precision", "finetune.precision")


def check_identity(folder: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """Raise naming the first differing settings when ``saved`` is not ``current`` (beside
    :data:`MAY_CHANGE`)."""
    saved = {k: v for k, v in _flat(saved).items() if k not in MAY_CHANGE}
    current = {k: v for k, v in as_kept(_flat(current), saved).items() if k not in MAY_CHANGE}
    changed = sorted(k for k in saved.keys() | current.keys() if saved.get(k) != current.get(k))
    if changed:
        said = "; ".join(f"{k}: {saved.get(k)!r} then, {current.get(k)!r} now" for k in changed[:3])
        more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
        raise StateMismatchError(
            f"--resume: the run in {str(folder.parent)!r} was started with other settings "
            f"({said}{more}); resume it with its own settings, or use another --out"
        )


def _flat(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"loop": {"lr": 1e-4}}`` -> ``{"loop.lr": 1e-4}``, values as JSON gives them back."""
    out: dict[str, Any] = {}
    for key, value in json.loads(json.dumps(doc)).items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out
