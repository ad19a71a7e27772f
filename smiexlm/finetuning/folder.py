"""A fine-tuned folder written (:func:`save_finetuned`); where such folders are written and
which are read.

A fine-tuned folder holds the backbone (``config.json``, ``vocab.json``, ``model.safetensors``,
its normalisation), ``head.safetensors``, ``finetune.json`` (task, label columns, config,
target scaling, the hybrid features' scaler) and ``reference.safetensors`` (what the
applicability domain and calibration need, :mod:`smiexlm.trust.reference`), with
``finetune --forest`` the forest blended with the model (``forest.skops``,
:mod:`smiexlm.forests.forest`), each file's sha256 in ``checksums.json``. It is read, every file checked, by
:class:`smiexlm.modelio.folder.FinetunedFolder` and loaded by
:func:`smiexlm.modelio.pretrained.load_finetuned` (torch) or
:class:`smiexlm.serving.onnx_predictor.OnnxPredictor` (its ONNX graph).

``finetune --save-dir DIR`` writes ``DIR/seed<N>``; :func:`check_free_seed_folders` refuses,
before any training, to replace one that holds something already. An ensemble names each
folder once (:func:`finetuned_folders`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smiexlm.atomic import atomic_dir
from smiexlm.errors import DataError
from smiexlm.modelio.layout import FINETUNE_NAME, HEAD_NAME


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
    from smiexlm.finetuning.ensemble import ENSEMBLE_NAME, is_ensemble

    if not folder.is_dir():
        return "a file"
    try:
        name = ENSEMBLE_NAME if is_ensemble(folder) else FINETUNE_NAME
        meta = json.loads((folder / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = None
    if not isinstance(meta, dict):
        return "files that are not a fine-tuned model"
    return (
        f"the fine-tuned model of task {meta.get('dataset', '?')!r} "
        f"({meta.get('task_type', '?')}, seed {meta.get('seed', '?')})"
    )


def seed_folders(folder: Path | str) -> list[Path]:
    """The ``seed<N>`` fine-tuned (or ensemble) folders a ``finetune --save-dir`` folder
    holds, by N; none when ``folder`` is such a folder itself or holds no seed folder."""
    from smiexlm.finetuning.ensemble import is_ensemble

    folder = Path(folder).expanduser()
    if not folder.is_dir() or (folder / FINETUNE_NAME).is_file() or is_ensemble(folder):
        return []
    seeds = [(int(p.name[4:]), p) for p in folder.iterdir()
             if p.name.startswith("seed") and p.name[4:].isdigit()
             and ((p / FINETUNE_NAME).is_file() or is_ensemble(p))]  # fmt: skip
    return [p for _, p in sorted(seeds)]


def finetuned_folders(folders: Path | str | Sequence[Path | str]) -> list[Path | str]:
    """The fine-tuned folders of ``--checkpoint`` as a list: at least one, each once (a folder
    named twice, by any path, would count as two agreeing models and shrink ``<label>_std``).
    A ``finetune --save-dir`` folder stands for its seeds (:func:`seed_folders`): an ensemble."""
    given = [folders] if isinstance(folders, (str, Path)) else list(folders)
    listed: list[Path | str] = []
    for folder in given:
        listed += seed_folders(folder) or [folder]
    if not listed:
        raise DataError("--checkpoint: expected at least one fine-tuned folder")
    seen: dict[Path, Path | str] = {}
    for folder in listed:
        key = Path(folder).expanduser().resolve()
        if key in seen:
            raise DataError(
                f"--checkpoint {str(folder)!r} names {str(key)!r} a second time (as "
                f"{str(seen[key])!r} did): expected each fine-tuned folder once"
            )
        seen[key] = folder
    return listed


def save_finetuned(
    model, tokenizer, folder: Path, meta: dict[str, Any], normalization=None, reference=None,
    forest=None, corpus_tokens: tuple[Any, str] | None = None, kernels=None,
) -> Path:  # fmt: skip
    """Write the folder ``predict`` reads (see the module docstring) atomically: the backbone
    as a model folder with its normalisation (the default's when None), the head,
    ``finetune.json`` and, when given, the :class:`~smiexlm.trust.reference.Reference`,
    the :class:`~smiexlm.forests.forest.KeptForest`, the
    :class:`~smiexlm.forests.members.KernelMembers` (their record is ``meta["members"]``) and
    ``corpus_tokens.json`` (``(counts, source)``: what the weights were trained on)."""
    from safetensors.torch import save_file

    from smiexlm.data.normalize import REWRITES
    from smiexlm.modelio.integrity import record_checksums
    from smiexlm.modelio.records import (
        DEFAULT_NORMALIZATION,
        write_corpus_tokens,
        write_normalization,
    )

    folder = Path(folder)
    normalization = normalization or DEFAULT_NORMALIZATION
    with atomic_dir(folder) as tmp:  # the folder appears complete or not at all
        model.model.save_pretrained(tmp, tokenizer=tokenizer)
        kept = write_normalization(tmp, normalization)
        if corpus_tokens is not None:
            write_corpus_tokens(tmp, tokenizer.tokens, *corpus_tokens)
        head = {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()}
        save_file(head, str(tmp / HEAD_NAME), metadata={"format": "pt"})
        meta = meta | {"pooling": model.pooling, "n_outputs": int(head["out_proj.bias"].shape[0]),
                       "n_features": model.n_features, "layers": model.layers,
                       "head": model.head.kind,
                       "normalization": {n: getattr(normalization, n) for n in REWRITES}}  # fmt: skip
        names = [HEAD_NAME, FINETUNE_NAME, kept.name]
        if forest is not None:
            meta["forest"] = forest.record()
            names.append(forest.save(tmp).name)
        if kernels is not None:
            names += kernels.save(tmp)
        (tmp / FINETUNE_NAME).write_text(json.dumps(meta, indent=1))
        if reference is not None:
            names.append(reference.save(tmp).name)
        record_checksums(tmp, *names)  # beside the backbone's model.safetensors
    return folder
