"""Run folders of fine-tuning: one per (set, seed), so that long work survives a stop.

``ROOT/<set>/seed<k>/`` holds, while the run trains, ``state/`` (rewritten after every epoch,
see :mod:`smiexlm.finetuning.state`); when it has finished, ``predictions.npz`` (the scores
of the validation and test molecules, with their row numbers in the task's table),
``history.json`` (each epoch's step, training loss and validation score: the curve a
selection was made on) and ``result.json`` (the
:class:`~smiexlm.moleculenet.report.RunResult`), written in that order, each atomically, after
which ``state/`` is removed. A folder with ``result.json`` is a finished run: it is read back,
never trained again.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from smiexlm.atomic import atomic_paths
from smiexlm.errors import DataError
from smiexlm.moleculenet import score_store
from smiexlm.moleculenet.report import RunResult
from smiexlm.moleculenet.splits import Split
from smiexlm.paths import read_json_file, write_json


class Backbone(Protocol):
    """What a run's identity reads of the backbone it fine-tunes
    (:class:`smiexlm.finetuning.backbone.Backbone`)."""

    name: str
    weights_sha256: str | None


RESULT_NAME = "result.json"
PREDICTIONS_NAME = "predictions.npz"
HISTORY_NAME = "history.json"
STATE_NAME = "state"
RESULT_FORMAT = "smiexlm-run-result/1"
HISTORY_FORMAT = "smiexlm-run-history/1"


def run_dir(root: Path, dataset: str, seed: int) -> Path:
    return Path(root) / dataset / f"seed{seed}"


def cells_root(row: Path) -> Path:
    """Where a row's cells ``<set>/seed<k>/`` are: ``row/runs/`` (fine-tuning and benchmark
    rows) when it is there, else ``row`` itself (the forests a blend script keeps)."""
    return Path(row) / "runs" if (Path(row) / "runs").is_dir() else Path(row)


def state_dir(folder: Path) -> Path:
    return Path(folder) / STATE_NAME


def settings(cfg) -> dict[str, Any]:
    """The fine-tuning settings a run's :func:`identity` holds: ``cfg``'s flat ones, those
    of later options left out where they are off, as runs older than the options hold them."""
    return cfg.recorded()


def identity(task, split: Split, cfg, backbone: Backbone) -> dict[str, Any]:
    """What a resumed run must share with the run that saved the state, beyond the loop."""
    return {
        "dataset": task.name, "data_sha256": task.sha256, "n_molecules": len(task),
        **task.record(), "split": split.label, "backbone": backbone.name,
        "backbone_sha256": backbone.weights_sha256, "finetune": settings(cfg),
    }  # fmt: skip


def is_main() -> bool:
    """Whether this process writes (rank 0, or the only process)."""
    from smiexlm.training.ranks import detect

    return detect().is_main


def processes() -> int:
    from smiexlm.training.ranks import detect

    return detect().world_size


def is_finished(root: Path, dataset: str, seed: int) -> bool:
    return (run_dir(root, dataset, seed) / RESULT_NAME).is_file()


def finished(folder: Path) -> RunResult | None:
    """The result of the finished run in ``folder``, or None when it has not finished."""
    path = Path(folder) / RESULT_NAME
    if not path.is_file():
        return None
    _, doc = read_json_file(path, "run result", RESULT_FORMAT)
    try:
        record = doc["result"]
        scores = {k: math.nan if record[k] is None else record[k] for k in ("test", "valid")}
        more = {k: math.nan if v is None else v for k, v in record.get("more", {}).items()}
        result = RunResult(**record | scores | {"sizes": tuple(record["sizes"]), "more": more})
    except (KeyError, TypeError) as err:
        raise DataError(f"run result {str(path)!r} is damaged: {err}") from None
    result.read_back = True  # its wall time stays the one it recorded
    return result


#: settings of how a run is carried out, not of what it computes: a finished run is read back
#: whatever they are now (its result records the precision it trained in)
HOW_RUN = frozenset({"device", "eval_batch_size", "precision"})


def check_finished(done: RunResult, folder: Path, expected: dict[str, Any],
                   config: type) -> RunResult:  # fmt: skip
    """``done``, read back from ``folder``, when it ran as ``expected`` (:func:`identity` of
    a config of the class ``config``) says; otherwise a DataError naming the first setting that differs, so that a resume with
    other settings never returns the result of a run made with the old ones, in either
    direction: a setting on in one and off in the other differs too. A setting the result does
    not record (runs older than it) is its default, or is not compared."""
    pairs = [("data_sha256", done.data_sha256, expected["data_sha256"]),
             ("split", done.split, expected["split"])]  # fmt: skip
    pairs += task_pairs(done, expected)
    refuse_a_difference(folder, pairs + _setting_pairs(done, expected, config))
    return done


def task_pairs(done: RunResult, record: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(option, as ``done`` was made with it, as ``record`` (``MoleculeTask.record``) asks) for
    the label columns and their kind; a result older than their record is not compared."""
    return [(name, done.config.get(key, record[key]), record[key])
            for key, name in (("labels", "--label-cols"), ("task_type", "--task-type"))]  # fmt: skip


def check_settings(done: RunResult, folder: Path, cfg, backbone: Backbone) -> RunResult:
    """:func:`check_finished` without the data and split, for a caller that has not read
    the set: ``done`` when it was made with ``backbone`` and ``cfg``'s settings."""
    refuse_a_difference(folder, setting_differences(done, cfg, backbone))
    return done


def setting_differences(done: RunResult, cfg, backbone: Backbone) -> list[tuple[str, Any, Any]]:
    """(setting, as ``done`` was made with it, as ``backbone`` and ``cfg`` ask for it) for
    each that differs; empty when ``done`` is what they would make."""
    expected = {"backbone": backbone.name, "backbone_sha256": backbone.weights_sha256,
                "finetune": settings(cfg)}  # fmt: skip
    pairs = _setting_pairs(done, expected, type(cfg))
    return [(key, was, now) for key, was, now in pairs if was != now]


def _setting_pairs(done: RunResult, expected: dict[str, Any],
                   config: type) -> list[tuple[str, Any, Any]]:  # fmt: skip
    """(setting, as the finished run recorded it, as ``expected`` asks) for the backbone and
    every fine-tuning setting but how the run was carried out (:data:`HOW_RUN`); ``config``:
    the run config's class (:class:`~smiexlm.finetuning.config.FinetuneConfig`)."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)
                if f.default is not dataclasses.MISSING}  # fmt: skip
    recorded = json.loads(json.dumps(done.config))  # tuples and lists alike
    wanted = json.loads(json.dumps(expected["finetune"]))
    pairs = [(key, recorded.get(key, expected[key]), expected[key])
             for key in ("backbone", "backbone_sha256")]  # fmt: skip
    for key, want in wanted.items():
        if key in HOW_RUN:
            continue
        if key in recorded or key in defaults:
            pairs.append((key, recorded.get(key, defaults.get(key)), want))
    # a setting the run had on and this one has off (left out of ``expected``)
    off = json.loads(json.dumps(config().to_dict()))
    was_on = config.recorded_of(recorded)
    pairs += [(key, recorded[key], off[key])
              for key in sorted(was_on.keys() - wanted.keys() - HOW_RUN)]  # fmt: skip
    return pairs


def refuse_a_difference(folder: Path, pairs: list[tuple[str, Any, Any]]) -> None:
    """A DataError naming the first (setting, as the finished run in ``folder`` was made with
    it, as this run asks for it) of ``pairs`` that differs."""
    for key, was, now in pairs:
        if was != now:
            raise DataError(
                f"run folder {str(folder)!r} holds a finished run made with {key} = {was!r}, "
                f"but this run asks for {key} = {now!r}: give another --out, or the settings "
                "it was made with"
            )


def check_fresh(root: Path, dataset: str, seeds: Sequence[int]) -> None:
    """Refuse to start over a run that is already there (finished or stopped) unless asked."""
    for seed in seeds:
        folder = run_dir(root, dataset, seed)
        if (folder / RESULT_NAME).is_file():
            what = "a finished run"
        elif state_dir(folder).is_dir():
            what = "a stopped run"
        else:
            continue
        raise DataError(
            f"--out {str(root)!r} holds {what} of {dataset} seed {seed} ({str(folder)!r}): pass "
            "--resume to keep it and go on, or give another --out"
        )


def write_predictions(
    folder: Path, split: Split, valid: np.ndarray, test: np.ndarray, reference: Any = None,
    nearness: dict[str, np.ndarray] | None = None, parts: dict[str, np.ndarray] | None = None,
) -> None:  # fmt: skip
    """The validation and test scores (probabilities or values, float32) and their rows; with
    the run's :class:`~smiexlm.trust.reference.Reference` and the test molecules'
    ``nearness`` to the training molecules, also each validation and test molecule's nearest
    training similarity (``valid_tanimoto``, ``valid_cosine``, ``test_tanimoto``,
    ``test_cosine``; runs finished before they were kept lack them). A run with a forest
    beside its model keeps the blend as ``valid`` and ``test`` and the two alone in ``parts``
    (``valid_model``, ``test_model``, ``valid_forest``, ``test_forest``)."""
    arrays = {
        "valid_rows": np.asarray(split.valid, dtype=np.int64), "valid": valid.astype(np.float32),
        "test_rows": np.asarray(split.test, dtype=np.int64), "test": test.astype(np.float32),
    }  # fmt: skip
    if reference is not None and nearness is not None:
        arrays |= {"valid_tanimoto": reference.valid_tanimoto,
                   "valid_cosine": reference.valid_cosine,
                   "test_tanimoto": nearness["tanimoto"], "test_cosine": nearness["cosine"]}  # fmt: skip
    arrays |= {key: value.astype(np.float32) for key, value in (parts or {}).items()}
    path = Path(folder) / PREDICTIONS_NAME
    with atomic_paths(path) as (tmp,), open(tmp, "wb") as handle:
        np.savez_compressed(handle, **arrays)


def read_predictions(folder: Path, task) -> dict[str, np.ndarray]:
    """The validation and test scores and rows kept in ``folder`` (:func:`write_predictions`;
    or its compact copy, :mod:`~smiexlm.moleculenet.score_store`), with the similarities and
    parts kept beside them, checked against ``task``: rows inside its table, one column per label.
    DataError naming the file otherwise."""
    path = Path(folder) / PREDICTIONS_NAME
    arrays = kept_arrays(folder)
    if arrays is None:
        raise DataError(
            f"{str(path)!r}: no such file, nor its compact copy "
            f"{score_store.STORE_NAME}; expected a finished run's predictions"
        )
    for part in ("valid", "test"):
        rows = arrays[f"{part}_rows"]
        if rows.max(initial=-1) >= len(task) or arrays[part].shape != (
            len(rows),
            task.labels.shape[1],
        ):
            raise DataError(
                f"{str(path)!r}: the {part} scores, shape {arrays[part].shape}, do not fit "
                f"{task.name} ({len(task)} rows, {task.labels.shape[1]} labels)"
            )
    return arrays


def has_predictions(folder: Path) -> bool:
    """Whether the cell ``folder`` kept its scores, in its own file or its compact copy."""
    return any(
        (Path(folder) / name).is_file() for name in (PREDICTIONS_NAME, score_store.STORE_NAME)
    )


def kept_arrays(folder: Path) -> dict[str, np.ndarray] | None:
    """Every array the cell ``folder`` kept, unchecked (its own file first, else its compact
    copy); None when it kept none."""
    path = Path(folder) / PREDICTIONS_NAME
    if path.is_file():
        with np.load(path) as saved:
            return {key: saved[key] for key in saved.files}
    return score_store.read(folder)


def add_measures(folder: Path, task) -> bool:
    """Give the finished run in ``folder`` the measures beside its score
    (:func:`~smiexlm.moleculenet.metrics.more_scores`) from the test predictions it kept,
    when it finished before they were recorded; the rest of its result is kept as it was.
    False when it has them already, has not finished or kept no predictions."""
    from smiexlm.moleculenet.metrics import more_scores

    done = finished(folder)
    if done is None or done.more or not has_predictions(folder):
        return False
    kept = read_predictions(folder, task)
    done.more = more_scores(task.task_type, task.labels[kept["test_rows"]], kept["test"])
    finish(folder, done)
    return True


def keep_predictions(
    root: Path | None, dataset: str, seed: int, split: Split, valid: np.ndarray, test: np.ndarray
) -> None:
    """:func:`write_predictions` into the cell ``root/<dataset>/seed<seed>/`` (made when
    missing) of a probe or forest; nothing when ``root`` is None."""
    if root is not None:
        folder = run_dir(root, dataset, seed)
        folder.mkdir(parents=True, exist_ok=True)
        write_predictions(folder, split, valid, test)


def write_history(folder: Path, history: Sequence[dict[str, float]]) -> None:
    """``history.json``: one record per epoch of a fine-tuning run (``epoch``, ``step``,
    ``train_loss`` and, with a validation split, ``valid``; epoch 0 is ``head_epochs``')."""
    write_json({"format": HISTORY_FORMAT, "history": list(history)}, Path(folder) / HISTORY_NAME)


def finish(folder: Path, result: RunResult) -> None:
    """Write ``result.json`` (atomically), then drop the state it no longer needs."""
    record = dataclasses.asdict(result) | {"sizes": list(result.sizes)}
    write_json({"format": RESULT_FORMAT, "result": record}, Path(folder) / RESULT_NAME)
    shutil.rmtree(state_dir(folder), ignore_errors=True)
