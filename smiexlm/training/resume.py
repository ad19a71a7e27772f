"""Where a run starts: a fresh state, or ``--resume`` from its newest checkpoint, checked.

* The checkpoint must hold the same model and vocabulary (:func:`checkpoint.restore_training_state`).
* The dataset must be the run's own: every checkpoint records the dataset's folder and content
  id (:func:`dataset_id`), and ``--resume --data OTHER`` is refused naming both.
* ``metrics.jsonl`` is cut back to the steps up to the resumed one (:func:`cut_metrics`): a
  killed run logged steps after its last checkpoint, ``--skip-bad-checkpoints`` goes back
  further still, and the resumed run logs those steps again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from smiexlm.data.shards import read_manifest
from smiexlm.errors import VocabularyMismatchError
from smiexlm.paths import write_text_atomic
from smiexlm.training import checkpoint as ckpt


def dataset_id(data_dir: Path) -> str:
    """A short hash of what training reads from a dataset folder: the vocabulary hash and the
    splits of ``manifest.json`` (shard names, counts and sha256). A moved or copied folder
    keeps its id; another build of other molecules gets another."""
    manifest = read_manifest(data_dir)
    content = {"vocab_hash": manifest.get("vocab_hash"), "splits": manifest["splits"]}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]


def start_state(
    out_dir: Path, data_dir: Path, vocab_hash: str, model, optimizer, resume: bool,
    skip_bad_checkpoints: bool,
) -> tuple[Path | None, ckpt.TrainerState]:  # fmt: skip
    """``(checkpoint restored or None, state to start from)``; with ``resume`` the newest
    checkpoint of ``out_dir`` is restored into ``model`` and ``optimizer`` and checked against
    the dataset in ``data_dir``."""
    data_dir = Path(data_dir)
    fresh = ckpt.TrainerState(
        vocab_hash=vocab_hash, data_dir=str(data_dir.resolve()), data_id=dataset_id(data_dir)
    )
    if not resume:
        return None, fresh
    start, state = ckpt.resume_checkpoint(out_dir, model, optimizer, skip_bad_checkpoints)
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
