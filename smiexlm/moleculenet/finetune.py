"""MoleculeNet (and user CSV) adapter of the fine-tuning engine.

Recipe (paper §5.1, Table 8): sequence head on the first state's features (dense → tanh →
pooler dropout → out_proj), multi-label BCE with missing labels masked (MSE on standardised
targets for regression), validation after every epoch, the best-valid epoch's weights scored
once on test. The loop itself (optimizer, schedule, clipping, AMP, bucketed batches, early
stopping) is :func:`smiexlm.finetuning.fit`; this module turns a DataFrame and a split into
its inputs and its results into a :class:`RunResult`. Inputs have the pretraining form
(BOS ... EOS; the model expands them for ExLM), from canonical SMILES unless
``canonicalize=False``.

Where the encoder comes from, with its vocabulary and SMILES normalisation, is a
:class:`~smiexlm.moleculenet.backbone.Backbone`.

A fine-tuned folder holds the backbone (``config.json``, ``vocab.json``, ``model.safetensors``),
``head.safetensors`` and ``finetune.json`` (task, label columns, config, target scaling, the
hybrid features' scaler); it is what ``predict`` reads. Several folders (seeds) make an
ensemble: the mean prediction and its standard deviation per molecule.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from smiexlm.data.normalize import NormalizeConfig
from smiexlm.device import resolve_device
from smiexlm.errors import DataError
from smiexlm.model.pretrained import DEFAULT_NORMALIZATION, write_normalization
from smiexlm.moleculenet import runs
from smiexlm.moleculenet.backbone import Backbone
from smiexlm.moleculenet.configs import FinetuneConfig
from smiexlm.moleculenet.folder import (
    META_NAME,
    check_free_seed_folders,
    finetuned_folders,
    read_finetune_meta,
)
from smiexlm.moleculenet.metrics import TaskScores, score
from smiexlm.moleculenet.report import RunResult
from smiexlm.moleculenet.splits import Split
from smiexlm.moleculenet.task import MoleculeTask, as_task, check_seeds, run_seeds
from smiexlm.paths import atomic_dir, check_output

log = logging.getLogger(__name__)

HEAD_NAME = "head.safetensors"
__all__ = ["Backbone", "finetune_once", "load_finetuned", "predict", "run_finetune"]


def loop_config(cfg: FinetuneConfig, higher_is_better: bool):
    """The engine's settings for a MoleculeNet config: its loop, selecting the best epoch."""
    return dataclasses.replace(cfg.loop, select="best", higher_is_better=higher_is_better)


def variant_name(backbone: Backbone, cfg: FinetuneConfig) -> str:
    """The report's row name: the backbone plus how it was fine-tuned."""
    name = backbone.name
    if cfg.loop.freeze:
        name += " frozen"
    elif cfg.loop.freeze_layers:
        name += f" ({cfg.loop.freeze_layers} layers frozen)"
    return name + (f" + {cfg.features}" if cfg.features else "")


def _to_scores(logits: np.ndarray, task_type: str, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    if task_type == "classification":
        return 1.0 / (1.0 + np.exp(-logits))
    return logits * std + mean


@dataclass
class _Targets:
    """Labels as the head is trained on them: standardised on train for regression."""

    y: np.ndarray  # (N, T) float32, NaN = missing
    mean: np.ndarray
    std: np.ndarray
    task_type: str

    @classmethod
    def fit(cls, task: MoleculeTask, split: Split) -> _Targets:
        y = task.labels.astype(np.float32)
        mean = np.zeros(y.shape[1], dtype=np.float32)
        std = np.ones(y.shape[1], dtype=np.float32)
        if not task.is_classification:
            mean = np.nanmean(y[split.train], axis=0)
            std = np.nanstd(y[split.train], axis=0) + 1e-6
        return cls(y, mean, std, task.task_type)

    def scaled(self) -> torch.Tensor:
        return torch.from_numpy((self.y - self.mean) / self.std)

    def to_scores(self, logits: np.ndarray) -> np.ndarray:
        """Probabilities, or values in the labels' units."""
        return _to_scores(logits, self.task_type, self.mean, self.std)

    def score(self, rows: Sequence[int], logits: np.ndarray):
        if not len(rows):  # a split without test rows (hpopt's): nothing to score
            n = self.y.shape[1]
            return TaskScores(float("nan"), [float("nan")] * n, 0, list(range(n)))
        return score(self.task_type, self.y[rows], self.to_scores(logits))


def _hybrid_features(cfg: FinetuneConfig, inputs: list[str], raw: np.ndarray | None, split: Split):
    """(features tensor, scaler) of the hybrid head, scaled on train; (None, None) without."""
    from smiexlm.moleculenet.features import FeatureScaler

    if not cfg.features:
        return None, None
    if raw is None:
        from smiexlm.fingerprints import molecule_features

        raw = molecule_features(inputs, cfg.features)
    scaler = FeatureScaler.fit(raw[np.asarray(split.train)], cfg.features)
    return torch.from_numpy(scaler.transform(raw)), scaler


def _variants(backbone, tokenizer, inputs, rows, n: int, cfg: FinetuneConfig, seed: int):
    """``n`` random SMILES of each molecule ``rows`` as token ids, or None when n is 0 (the
    spellings depend on the seed and the molecule, :func:`~smiexlm.data.augment.random_smiles`)."""
    if not n:
        return None
    from smiexlm.data.augment import random_smiles

    texts = [inputs[i] for i in rows]
    spellings = random_smiles(texts, n, seed)
    flat, _ = backbone.inputs(tokenizer).rows([s for per in spellings for s in per], cfg.max_length)
    return [flat[k * n : (k + 1) * n] for k in range(len(texts))]


def finetune_once(
    data: MoleculeTask | pd.DataFrame,
    split: Split,
    cfg: FinetuneConfig,
    seed: int,
    backbone: Backbone,
    save_dir: Path | None = None,
    inputs: list[str] | None = None,
    raw_features: np.ndarray | None = None,
    progress: bool = True,
    run_dir: Path | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
) -> RunResult:
    """One seed: train on ``split.train``, select on valid per epoch, score test (NaN when
    ``split.test`` is empty); ``on_epoch(epoch, valid score)`` is the loop's hook.

    ``inputs`` are the model-side SMILES when already prepared (:meth:`Backbone.model_texts`);
    ``raw_features`` the unscaled hybrid features of every row, when already computed.
    ``run_dir`` keeps the run's state after every epoch (``state/``, and a run that finds one
    there goes on from it) and, at the end, its scores (``predictions.npz``) and result
    (``result.json``); see :mod:`smiexlm.moleculenet.runs`.
    """
    from smiexlm.finetuning import Examples, fit, predict_views
    from smiexlm.model.heads import ExLMForSequencePrediction

    t0 = time.perf_counter()
    task = as_task(data)
    inputs = inputs if inputs is not None else backbone.model_texts(task.smiles, cfg.canonicalize)
    tokenizer = backbone.tokenizer(inputs)
    rows, n_cut = backbone.inputs(tokenizer).rows(inputs, cfg.max_length)
    targets = _Targets.fit(task, split)
    features, scaler = _hybrid_features(cfg, inputs, raw_features, split)
    torch.manual_seed(seed)
    model = ExLMForSequencePrediction(
        backbone.build(tokenizer, cfg.dropout), len(task.label_cols),
        "multilabel" if task.is_classification else "regression", cfg.pooler_dropout,
        cfg.pooling, n_features=0 if features is None else features.shape[1],  # type: ignore[arg-type]
    )  # fmt: skip
    examples = Examples(rows, targets.scaled(), features)
    train, valid, test = (examples.subset(np.asarray(p)) for p in (split.train, split.valid, split.test))  # fmt: skip
    train.variants = _variants(backbone, tokenizer, inputs, split.train, cfg.augment, cfg, seed)
    valid.variants = _variants(backbone, tokenizer, inputs, split.valid, cfg.tta, cfg, seed)
    test.variants = _variants(backbone, tokenizer, inputs, split.test, cfg.tta, cfg, seed)
    loop = loop_config(cfg, higher_is_better=task.is_classification)
    state = None if run_dir is None else runs.state_dir(run_dir)
    identity = runs.identity(task, split, cfg, backbone.name)
    fitted = fit(model, train, valid, loop, lambda logits: targets.score(split.valid, logits).mean,
                 seed, progress, f"{task.name} seed {seed}", state, identity, on_epoch)  # fmt: skip
    # the test split is scored as `predict` serves (fp32, batch-invariant), so the reported
    # score is the one a user gets back from the saved model
    test_views = predict_views(model, test, cfg.loop.eval_batch_size)  # (V, N, T)
    test_logits = test_views.mean(axis=0)
    test_score = targets.score(split.test, test_logits)
    if not runs.is_main():
        save_dir = run_dir = None  # one process writes
    if run_dir is not None:
        valid_logits = predict_views(model, valid, cfg.loop.eval_batch_size).mean(axis=0)
        runs.write_predictions(run_dir, split, targets.to_scores(valid_logits),
                               targets.to_scores(test_logits))  # fmt: skip
    if save_dir is not None:
        save_finetuned(model, tokenizer, save_dir, normalization=backbone.normalization, meta=dict(
            dataset=task.name, task_type=task.task_type, label_cols=task.label_cols,
            config=cfg.to_dict(), seed=seed, split=split.label, target_mean=targets.mean.tolist(),
            target_std=targets.std.tolist(), backbone=backbone.name, best_epoch=fitted.best_epoch,
            feature_scaler=None if scaler is None else scaler.to_dict(),
        ))  # fmt: skip
    config = cfg.to_dict() | {"backbone": backbone.name, "n_truncated": n_cut} | fitted.summary()
    config["processes"] = runs.processes()
    if len(test_views) > 1:  # what the canonical SMILES alone scores, beside the mean
        config["test_canonical"] = targets.score(split.test, test_views[0]).mean * task.scale
    result = task.result(variant_name(backbone, cfg), split, seed, fitted.best_valid, test_score,
                         time.perf_counter() - t0, config, fitted.best_epoch)  # fmt: skip
    if run_dir is not None:
        runs.finish(run_dir, result)
    return result


def run_finetune(
    data: MoleculeTask | pd.DataFrame,
    cfg: FinetuneConfig,
    backbone: Backbone | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    save_dir: Path | None = None,
    progress: bool = True,
    run_root: Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> list[RunResult]:
    """``finetune_once`` per seed (a deterministic split is made once); ``save_dir`` gets one
    fine-tuned folder per seed (``seed0``, ``seed1``, ...), replacing one that exists only
    when ``overwrite`` (a finished run read back with ``resume`` keeps the one it wrote).

    ``run_root`` keeps each (set, seed) run in ``run_root/<set>/seed<k>/``: its state after
    every epoch, then its result. With ``resume`` a finished run's result is read back instead
    of trained again, and a stopped run goes on from its last epoch; without it, a run folder
    that is already there is refused (:func:`smiexlm.moleculenet.runs.check_fresh`)."""
    task = as_task(data)
    if run_root is not None and not resume:
        runs.check_fresh(run_root, task.name, seeds)
    backbone = backbone or Backbone()
    if save_dir is not None:  # before training, not after it
        check_output(save_dir, "--save-dir", "folder")
        check_seeds(seeds)
        fresh = [
            s for s in seeds if run_root is None or not runs.is_finished(run_root, task.name, s)
        ]
        check_free_seed_folders(Path(save_dir), fresh, overwrite)  # a finished run's are its own
    inputs = backbone.model_texts(task.smiles, cfg.canonicalize)
    raw = None
    if cfg.features:
        from smiexlm.fingerprints import molecule_features

        raw = molecule_features(inputs, cfg.features)

    def one_seed(split: Split, seed: int) -> RunResult:
        run_dir = None if run_root is None else runs.run_dir(run_root, task.name, seed)
        if run_dir is not None and (done := runs.finished(run_dir)) is not None:
            log.info("%s seed %d: finished before (%s)", task.name, seed, run_dir)
            return done
        target = None if save_dir is None else Path(save_dir) / f"seed{seed}"
        r = finetune_once(task, split, cfg, seed, backbone, target, inputs, raw, progress,
                          run_dir)  # fmt: skip
        log.info("%s seed %d: valid %.2f test %.2f", r.dataset, seed, r.valid, r.test)
        return r

    return run_seeds(task, seeds, cfg.split, one_seed)


def save_finetuned(
    model, tokenizer, directory: Path, meta: dict[str, Any],
    normalization: NormalizeConfig = DEFAULT_NORMALIZATION,
) -> Path:  # fmt: skip
    """The folder ``predict`` reads: the backbone as a model folder (with its normalisation),
    the head and ``finetune.json``."""
    from safetensors.torch import save_file

    from smiexlm.model.integrity import record_checksums

    directory = Path(directory)
    with atomic_dir(directory) as tmp:  # the folder appears complete or not at all
        model.model.save_pretrained(tmp, tokenizer=tokenizer)
        write_normalization(tmp, normalization)
        head = {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()}
        save_file(head, str(tmp / HEAD_NAME), metadata={"format": "pt"})
        meta = meta | {"pooling": model.pooling, "n_outputs": int(head["out_proj.bias"].shape[0]),
                       "n_features": model.n_features}  # fmt: skip
        (tmp / META_NAME).write_text(json.dumps(meta, indent=1))
        record_checksums(tmp, HEAD_NAME, META_NAME)  # beside the backbone's model.safetensors
    return directory


def load_finetuned(directory: Path | str, device: str = "auto"):
    """(model, inputs, meta) from a folder written by ``finetune`` (see module docstring):
    the model in eval mode, its :class:`~smiexlm.model.inputs.ModelInputs` (vocabulary and
    normalisation) and ``finetune.json``; each file is checked first (``finetune.json``'s
    keys and values, the weights' shapes, and the sha256 of both)."""
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


def _predict_one(
    directory: Path | str, smiles: list[str], batch_size: int, backend: str = "torch", tta: int = 0
) -> tuple[np.ndarray, dict]:
    """(V, N, T) scores of one fine-tuned folder on parsable SMILES: V = 1 + ``tta`` spellings
    of each molecule, the model's own (canonical) first, then random ones."""
    from smiexlm.data.augment import random_smiles
    from smiexlm.finetuning import Examples
    from smiexlm.finetuning import predict as engine_predict
    from smiexlm.moleculenet.features import FeatureScaler

    if backend == "onnx":  # the folder's predictor.onnx (smiexlm export-onnx)
        from smiexlm.serving.onnx_runtime import OnnxPredictor

        model = OnnxPredictor(directory)
        inputs, meta = model.inputs, model.meta
    else:
        model, inputs, meta = load_finetuned(directory)
    cfg = meta["config"]
    texts = inputs.texts(smiles, cfg.get("canonicalize", True))
    features = None
    if meta.get("feature_scaler"):
        from smiexlm.fingerprints import molecule_features

        scaler = FeatureScaler.from_dict(meta["feature_scaler"])
        features = torch.from_numpy(scaler.transform(molecule_features(texts, scaler.kind)))
    spellings = [texts] + (list(zip(*random_smiles(texts, tta, 0), strict=True)) if tta else [])
    mean = np.asarray(meta["target_mean"], dtype=np.float32)
    std = np.asarray(meta["target_std"], dtype=np.float32)
    views = []
    for view in spellings:
        rows, _ = inputs.rows(list(view), cfg.get("max_length", 256))
        if backend == "onnx":
            logits = model.logits(rows, None if features is None else features.numpy(), batch_size)
        else:
            logits = engine_predict(model, Examples(rows, None, features), batch_size)
        views.append(_to_scores(logits, meta["task_type"], mean, std))
    return np.stack(views), meta


def predict(
    checkpoint: Path | str | Sequence[Path | str],
    smiles: Sequence[str],
    batch_size: int = 256,
    backend: Literal["torch", "onnx"] = "torch",
    tta: int = 0,
) -> pd.DataFrame:
    """Predictions per input SMILES: probabilities (classification) or values (regression).

    Several fine-tuned folders (e.g. the seeds of one run) make an ensemble: each label column
    is the mean over the models and ``<label>_std`` their standard deviation (ddof 0), the
    per-molecule uncertainty. ``tta=K`` scores each molecule as the mean over its canonical
    SMILES and K random ones (:mod:`smiexlm.data.augment`), and ``<label>_tta_std`` is their
    standard deviation (averaged over the models). Unparsable SMILES (and those longer than
    :data:`~smiexlm.data.normalize.MAX_SMILES_CHARS`) get NaN rows and ``valid = False``, never
    silently dropped. ``backend="onnx"`` serves each folder's ``predictor.onnx`` with
    onnxruntime (written by ``smiexlm export-onnx FOLDER``).
    """
    from smiexlm.data.normalize import smiles_problem
    from smiexlm.errors import ConfigError

    if backend not in ("torch", "onnx"):
        raise ConfigError("backend", backend, "'torch' or 'onnx'")
    if not isinstance(tta, int) or tta < 0:
        raise ConfigError("tta", tta, "0 (none) or a positive number of random SMILES")

    folders = finetuned_folders(checkpoint)
    ok = [smiles_problem(s) is None for s in smiles]  # too long or unparsable: a NaN row
    good = [s for s, v in zip(smiles, ok, strict=True) if v]
    per_model, metas = [], []
    for folder in folders:
        values, meta = _predict_one(folder, good, batch_size, backend, tta)
        if metas and (meta["label_cols"], meta["task_type"]) != (
            metas[0]["label_cols"], metas[0]["task_type"]
        ):  # fmt: skip
            raise DataError(
                f"--checkpoint {str(folder)!r}: predicts {meta['label_cols']} "
                f"({meta['task_type']}); expected {metas[0]['label_cols']} like {str(folders[0])!r}"
            )
        per_model.append(values)
        metas.append(meta)
    labels = meta["label_cols"]
    stack = np.stack(per_model).reshape(
        len(folders), tta + 1, len(good), len(labels)
    )  # (M, V, N, T)
    frame = pd.DataFrame(_rows_of(stack.mean(axis=(0, 1)), ok), columns=labels)
    spreads = {"std": stack.mean(axis=1).std(axis=0) if len(folders) > 1 else None,
               "tta_std": stack.std(axis=1).mean(axis=0) if tta else None}  # fmt: skip
    for suffix, spread in spreads.items():
        if spread is not None:
            values = _rows_of(spread, ok)
            for j, label in enumerate(labels):
                frame[f"{label}_{suffix}"] = values[:, j]
    frame.insert(0, "valid", ok)
    frame.insert(0, "smiles", list(smiles))
    return frame


def _rows_of(values: np.ndarray, ok: list[bool]) -> np.ndarray:
    """(len(ok), T): ``values`` in the rows marked ok, NaN in the others."""
    out = np.full((len(ok), values.shape[1]), np.nan)
    out[np.asarray(ok, dtype=bool)] = values
    return out
