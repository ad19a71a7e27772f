"""A fine-tuned folder: written (:func:`save_finetuned`), read (:func:`load_finetuned`), its
record ``finetune.json`` checked; where such folders are written and which are read.

A fine-tuned folder holds the backbone (``config.json``, ``vocab.json``, ``model.safetensors``,
its normalisation), ``head.safetensors``, ``finetune.json`` (task, label columns, config,
target scaling, the hybrid features' scaler) and ``reference.safetensors`` (what the
applicability domain and calibration need, :mod:`smiexlm.moleculenet.reference`), each file's
sha256 in ``checksums.json``.

``predict`` trusts nothing it has not checked here: every key it reads is present and of the
right kind, and the sizes agree (one label, target mean and target std per output; a feature
scaler exactly when the head takes features), each target std is positive, and the file
matches the sha256 its folder's ``checksums.json`` records (folders saved before the record
covered ``finetune.json`` load without it). The weights are checked by
:func:`smiexlm.model.checkpoint.load_module_weights` and ``ExLMModel.from_pretrained``.

``finetune --save-dir DIR`` writes ``DIR/seed<N>``; :func:`check_free_seed_folders` refuses,
before any training, to replace one that holds something already. An ensemble names each
folder once (:func:`finetuned_folders`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smiexlm.errors import DataError
from smiexlm.model.integrity import verify_checksum
from smiexlm.model.pooling import POOLINGS
from smiexlm.paths import atomic_dir, read_json_file

META_NAME = "finetune.json"
HEAD_NAME = "head.safetensors"
TASK_TYPES = ("classification", "regression")


def read_finetune_meta(path: Path) -> dict[str, Any]:
    """``finetune.json`` as a dict; DataError naming the file, the key and what was expected."""
    path, meta = read_json_file(path, "fine-tuned model record")

    def bad(key: str, expected: str) -> DataError:
        value = meta.get(key, "missing")
        return DataError(f"{str(path)!r}: key {key!r} is {value!r}: expected {expected}")

    if meta.get("task_type") not in TASK_TYPES:
        raise bad("task_type", f"one of {TASK_TYPES}")
    if meta.get("pooling") not in POOLINGS:
        raise bad("pooling", f"one of {POOLINGS}")
    n = meta.get("n_outputs")
    if type(n) is not int or n < 1:
        raise bad("n_outputs", "a positive integer")
    labels = meta.get("label_cols")
    if (
        not isinstance(labels, list)
        or len(labels) != n
        or not all(isinstance(x, str) for x in labels)
    ):
        raise bad("label_cols", f"a list of n_outputs = {n} column names")
    for key in ("target_mean", "target_std"):
        values = meta.get(key)
        if not isinstance(values, list) or len(values) != n or not all(_finite(v) for v in values):
            raise bad(key, f"a list of n_outputs = {n} finite numbers")
    if not all(v > 0 for v in meta["target_std"]):  # 0 makes every prediction the mean
        raise bad("target_std", f"a list of n_outputs = {n} positive numbers")
    if not isinstance(meta.get("config"), dict):
        raise bad("config", "an object (the fine-tuning config)")
    n_features = meta.setdefault("n_features", 0)
    if type(n_features) is not int or n_features < 0:
        raise bad("n_features", "a non-negative integer")
    scaler = meta.get("feature_scaler")
    if (n_features > 0) != isinstance(scaler, dict):
        raise bad("feature_scaler", f"an object exactly when n_features ({n_features}) > 0")
    if scaler and not _scaler_fits(scaler, n_features):
        raise DataError(
            f"{str(path)!r}: key 'feature_scaler' is not a scaler of {n_features} features: "
            "expected 'kind', 'clip' and 'median', 'mean', 'std' lists of that length"
        )
    verify_checksum(path, required=False)  # older folders record the weights only
    return meta


def check_free_seed_folders(save_dir: Path, seeds: Sequence[int], overwrite: bool) -> None:
    """DataError naming ``--save-dir`` and what it holds when a ``save_dir/seed<N>`` of
    ``seeds`` exists and is not empty, unless ``overwrite``: another run's model is never
    replaced unasked. Other seeds' folders, and empty ones, are left as they are."""
    if overwrite:
        return
    for seed in seeds:
        folder = Path(save_dir) / f"seed{seed}"
        if not folder.exists() or (folder.is_dir() and not any(folder.iterdir())):
            continue
        raise DataError(
            f"--save-dir {str(save_dir)!r}: {str(folder)!r} holds {_holding(folder)} already; "
            "expected a new or empty folder (pass --overwrite to replace it, or choose "
            "another --save-dir)"
        )


def _holding(folder: Path) -> str:
    """What ``folder`` holds, for a message: the task and seed of a fine-tuned model."""
    if not folder.is_dir():
        return "a file"
    try:
        meta = json.loads((folder / META_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = None
    if not isinstance(meta, dict):
        return "files that are not a fine-tuned model"
    return (
        f"the fine-tuned model of task {meta.get('dataset', '?')!r} "
        f"({meta.get('task_type', '?')}, seed {meta.get('seed', '?')})"
    )


def finetuned_folders(checkpoint: Path | str | Sequence[Path | str]) -> list[Path | str]:
    """The fine-tuned folders of ``--checkpoint`` as a list: at least one, each once (a folder
    named twice, by any path, would count as two agreeing models and shrink ``<label>_std``)."""
    folders = [checkpoint] if isinstance(checkpoint, (str, Path)) else list(checkpoint)
    if not folders:
        raise DataError("--checkpoint: expected at least one fine-tuned folder")
    seen: dict[Path, Path | str] = {}
    for folder in folders:
        key = Path(folder).expanduser().resolve()
        if key in seen:
            raise DataError(
                f"--checkpoint {str(folder)!r} names {str(key)!r} a second time (as "
                f"{str(seen[key])!r} did): expected each fine-tuned folder once"
            )
        seen[key] = folder
    return folders


def _scaler_fits(scaler: dict, n_features: int) -> bool:
    arrays = [scaler.get(key) for key in ("median", "mean", "std")]
    sized = all(isinstance(a, list) and len(a) == n_features for a in arrays)
    return sized and isinstance(scaler.get("kind"), str) and _finite(scaler.get("clip"))


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def save_finetuned(
    model, tokenizer, directory: Path, meta: dict[str, Any], normalization=None, reference=None,
) -> Path:  # fmt: skip
    """Write the folder ``predict`` reads (see the module docstring) atomically: the backbone
    as a model folder with its normalisation (the default's when None), the head,
    ``finetune.json`` and, when given, the :class:`~smiexlm.moleculenet.reference.Reference`."""
    from safetensors.torch import save_file

    from smiexlm.model.integrity import record_checksums
    from smiexlm.model.pretrained import DEFAULT_NORMALIZATION, write_normalization

    directory = Path(directory)
    with atomic_dir(directory) as tmp:  # the folder appears complete or not at all
        model.model.save_pretrained(tmp, tokenizer=tokenizer)
        write_normalization(tmp, normalization or DEFAULT_NORMALIZATION)
        head = {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()}
        save_file(head, str(tmp / HEAD_NAME), metadata={"format": "pt"})
        meta = meta | {"pooling": model.pooling, "n_outputs": int(head["out_proj.bias"].shape[0]),
                       "n_features": model.n_features}  # fmt: skip
        (tmp / META_NAME).write_text(json.dumps(meta, indent=1))
        names = [HEAD_NAME, META_NAME]
        if reference is not None:
            names.append(reference.save(tmp).name)
        record_checksums(tmp, *names)  # beside the backbone's model.safetensors
    return directory


def load_finetuned(directory: Path | str, device: str = "auto"):
    """(model, inputs, meta) from a fine-tuned folder: the model in eval mode, its
    :class:`~smiexlm.model.inputs.ModelInputs` (vocabulary and normalisation) and
    ``finetune.json``; each file is checked first (``finetune.json``'s keys and values, the
    weights' shapes, and the sha256 of both)."""
    from smiexlm.device import resolve_device
    from smiexlm.model.checkpoint import load_module_weights
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.pretrained import load_pretrained
    from smiexlm.paths import check_not_a_file

    directory = check_not_a_file(directory, "--checkpoint")
    if not (directory / META_NAME).is_file():
        raise DataError(
            f"--checkpoint {str(directory)!r}: no {META_NAME}; expected a folder written by "
            "`smiexlm finetune --save-dir DIR`, which writes DIR/seed0, DIR/seed1, ..."
        )
    meta = read_finetune_meta(directory / META_NAME)
    head_type = "multilabel" if meta["task_type"] == "classification" else "regression"
    pre = load_pretrained(directory)
    model = ExLMForSequencePrediction(
        pre.model, meta["n_outputs"], head_type, 0.0, meta["pooling"], n_features=meta["n_features"]
    )  # fmt: skip
    load_module_weights(model.head, directory / HEAD_NAME, f"{META_NAME} and the backbone")
    return model.to(resolve_device(device)).eval(), pre.inputs(), meta
