"""Where a run starts: a fresh state, or ``--resume`` from its newest checkpoint, checked.

* The checkpoint must hold the same model and vocabulary (:func:`checkpoint.restore_training_state`).
* The dataset must be the run's own: every checkpoint records the dataset's folder and content
  id (:func:`dataset_id`), and ``--resume --data OTHER`` is refused naming both.
* Settings the run reads afresh at each step (:data:`CHANGEABLE`: learning-rate schedule,
  ``max_steps``, intervals, device...) may change on resume: each change is said on stderr and
  recorded, with the old and the new value and the step it applies from, in
  ``config.changes.json`` (:func:`record_config_changes`); so is a precision of ``auto`` that
  resolves otherwise on the machine resumed on (:func:`resolved_precision_change`). Any other
  setting (``seed``, the batch, the optimiser's restored state) is refused naming it
  (:func:`config_changes`); the model's own fields are checked with its checkpoint
  (``checkpoint.check_model_config``).
* ``metrics.jsonl`` is cut back to the steps up to the resumed one (:func:`cut_metrics`): a
  killed run logged steps after its last checkpoint, ``--skip-bad-checkpoints`` goes back
  further still, and the resumed run logs those steps again.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from smiexlm.atomic import write_text_atomic
from smiexlm.data.shards import read_manifest
from smiexlm.device import resolved_precision
from smiexlm.errors import VocabularyMismatchError
from smiexlm.paths import read_json_file, write_json
from smiexlm.training import run_state as ckpt

logger = logging.getLogger(__name__)

CHANGES_FILE = "config.changes.json"
CHANGES_FORMAT = "smiexlm-config-changes/1"
# Read afresh at every step (the schedule is rebuilt from the config on resume): a resumed run
# may change them. The optimiser's betas, eps and weight decay are restored with its state, and
# seed, max_tokens and the global batch fix which batches the run sees: those stay.
CHANGEABLE = ("max_steps", "total_steps", "warmup_steps", "lr", "end_lr", "lr_power",
              "clip_norm", "device", "precision", "num_threads", "num_workers", "log_every",
              "valid_every", "valid_batches", "save_every", "keep_last", "tensorboard",
              "progress")  # fmt: skip
GLOBAL_BATCH = "update_freq x processes"  # update_freq is per process: compared as a product
RESOLVED_PRECISION = "precision as resolved"  # what "auto" meant where the run trained


def dataset_id(data_dir: Path) -> str:
    """A short hash of what training reads from a dataset folder: the vocabulary hash and the
    splits of ``manifest.json`` (shard names, counts and sha256). A moved or copied folder
    keeps its id; another build of other molecules gets another."""
    manifest = read_manifest(data_dir)
    content = {"vocab_hash": manifest.get("vocab_hash"), "splits": manifest["splits"]}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def start_state(
    out_dir: Path, data_dir: Path, vocab_hash: str, model, optimizer, resume: bool,
    skip_bad_checkpoints: bool, gather: Callable[[int], list[int]] = lambda step: [step],
) -> tuple[Path | None, ckpt.TrainerState]:  # fmt: skip
    """``(checkpoint restored or None, state to start from)``; with ``resume`` the newest
    checkpoint of ``out_dir`` is restored into ``model`` and ``optimizer`` and checked against
    the dataset in ``data_dir``. ``gather`` collects a number from every process: the
    processes must all resume from the same step, or none (an ``--out`` that is not one
    folder for every node would start some afresh beside the others)."""
    data_dir = Path(data_dir)
    fresh = ckpt.TrainerState(
        vocab_hash=vocab_hash, data_dir=str(data_dir.resolve()), data_id=dataset_id(data_dir)
    )
    if not resume:
        return None, fresh
    start, state = ckpt.resume_checkpoint(out_dir, model, optimizer, skip_bad_checkpoints)
    steps = gather(-1 if start is None or state is None else state.step)
    if len(set(steps)) > 1:
        found = ", ".join(
            f"rank {r}: {'none' if s < 0 else f'step {s}'}" for r, s in enumerate(steps)
        )
        raise ckpt.ResumeMismatchError(
            f"--resume: the processes found different checkpoints in --out {str(out_dir)!r} "
            f"({found}); expected one --out folder that every node sees (a shared file system)"
        )
    if start is None or state is None:  # nothing saved yet: from scratch
        return None, fresh
    if state.vocab_hash not in (None, vocab_hash):
        raise VocabularyMismatchError(
            f"checkpoint {start} was trained with vocabulary {state.vocab_hash} but the "
            f"dataset {str(data_dir)!r} has {vocab_hash}"
        )
    if state.data_id not in (None, fresh.data_id):
        raise ckpt.ResumeMismatchError(
            f"--resume: run {str(out_dir)!r} was trained on dataset {state.data_dir!r} (content "
            f"id {state.data_id}) but --data {str(data_dir)!r} is another dataset (content id "
            f"{fresh.data_id}); pass the run's dataset or start a new --out"
        )
    state.data_dir, state.data_id = fresh.data_dir, fresh.data_id  # the same data, maybe moved
    return start, state


def config_changes(
    checkpoint: Path | None, state: ckpt.TrainerState, config, world_size: int
) -> dict[str, tuple[Any, Any]]:
    """``{setting: (value at the checkpoint, value now)}`` for each of :data:`CHANGEABLE` that
    ``config`` changes against the ``train_config.json`` of ``checkpoint`` (None: a fresh run,
    nothing to compare); any other change raises ResumeMismatchError naming it. ``state``
    records the number of processes (``world_size``) from here on."""
    saved_world, state.world_size = state.world_size, world_size
    path = None if checkpoint is None else Path(checkpoint) / ckpt.CONFIG_FILE
    if path is None or not path.is_file():
        return {}
    _, doc = read_json_file(path, "training config")
    old, new = _comparable(doc, saved_world), _comparable(config.to_dict(), world_size)
    changed = {k: (old[k], v) for k, v in new.items() if k in old and old[k] != v}
    refused = [k for k in changed if k not in CHANGEABLE]
    if refused:
        was = ", ".join(f"{k} = {changed[k][0]!r}" for k in refused)
        now = ", ".join(f"{k} = {changed[k][1]!r}" for k in refused)
        raise ckpt.ResumeMismatchError(
            f"--resume: checkpoint {str(checkpoint)!r} was trained with {was} but the config "
            f"gives {now}; these stay fixed for a whole run (a resume may change only "
            f"{', '.join(CHANGEABLE)}): resume with the run's values or start a new --out"
        )
    return changed


def resolved_precision_change(
    state: ckpt.TrainerState, device, precision: str
) -> dict[str, tuple[str, str]]:
    """``{RESOLVED_PRECISION: (then, now)}`` when ``precision`` resolves on ``device`` to
    another precision than the run trained in so far (``auto`` resumed on a CPU with native
    bf16 after one without, or the other way round), else ``{}``; ``state`` records the one
    it trains in from here on, so the change is said and recorded like a changed setting."""
    now = resolved_precision(device, precision)
    then = state.extra.get(RESOLVED_PRECISION)
    state.extra = {**state.extra, RESOLVED_PRECISION: now}
    return {} if then in (None, now) else {RESOLVED_PRECISION: (then, now)}


def _comparable(doc: dict[str, Any], world_size: int | None) -> dict[str, Any]:
    """A resolved config as a resume compares it: the decay horizon rather than an unset
    ``total_steps``, the global batch rather than the per-process ``update_freq`` (left out
    when the number of processes was not recorded), the model left to its own check."""
    doc = {k: v for k, v in doc.items() if k != "model"}
    doc["total_steps"] = doc.get("total_steps") or doc.get("max_steps")
    update_freq = doc.pop("update_freq", None)
    if world_size is not None and isinstance(update_freq, int):
        doc[GLOBAL_BATCH] = update_freq * world_size
    return doc


def record_config_changes(out_dir: Path, checkpoint: Path, step: int, changes: dict) -> None:
    """Say the settings a resume changed on stderr and append them to ``config.changes.json``
    (old and new values, the checkpoint and the step they apply from); nothing without any."""
    if not changes:
        return
    path = Path(out_dir) / CHANGES_FILE
    history = read_json_file(path, "config history", CHANGES_FORMAT)[1] if path.is_file() else {}
    entries = list(history.get("changes", []))
    entries.append({
        "from_step": step, "checkpoint": Path(checkpoint).name,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": {k: {"old": old, "new": new} for k, (old, new) in changes.items()},
    })  # fmt: skip
    write_json({"format": CHANGES_FORMAT, "changes": entries}, path)
    said = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in changes.items())
    logger.warning("--resume from %s changes settings from step %d: %s (recorded in %s)",
                   Path(checkpoint).name, step, said, path)  # fmt: skip


def cut_metrics(path: Path, step: int) -> int:
    """Keep the records of the JSON-lines log ``path`` up to ``step``; the number removed.

    A line cut short by a killed run (it can only be the last) goes too."""
    path = Path(path)
    if not path.is_file():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if _step_of(line) is not None and _step_of(line) <= step]
    if len(kept) < len(lines):
        write_text_atomic(path, "".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


def elapsed_before(path: Path, step: int) -> float:
    """Wall seconds the run had trained when it logged ``step`` (the ``elapsed_s`` of the last
    record up to it; 0 without one), so that a resumed run's clock goes on from there."""
    path = Path(path)
    if not path.is_file():
        return 0.0
    elapsed = 0.0
    for line in path.read_text(encoding="utf-8").splitlines():
        at = _step_of(line)
        if at is not None and at <= step:
            elapsed = float(json.loads(line).get("elapsed_s", elapsed))
    return elapsed


def _step_of(line: str) -> int | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    value = record.get("step") if isinstance(record, dict) else None
    return value if isinstance(value, int) else None
