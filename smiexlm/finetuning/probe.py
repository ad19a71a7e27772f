"""Linear probe: scikit-learn logistic (or ridge) regression on pooled embeddings.

The encoder runs over the dataset (eval mode, no dropout) and its pooled features (one
pooling, or several side by side: ``pooling="cls+mean"``), optionally with the hybrid
features beside them (a missing value takes the train median), are standardised on the train
split. One model per task is fitted on the train rows whose label is known; the
regularisation strength is chosen on the valid split from ``c_grid`` (the test split is never
used for a choice), and test is scored once. It takes seconds and is the baseline to read
next to full fine-tuning.
Logistic regression with lbfgs is deterministic, so the seeds differ only where the split
does (the seeded split kinds); on a deterministic split (scaffold) the probe is fitted once
and its result serves every seed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from smiexlm.chemistry.fingerprints import FEATURE_KINDS
from smiexlm.errors import ConfigError, check_positive_int, check_spellings
from smiexlm.finetuning.folder import check_free_seed_folders
from smiexlm.forests.features import FeatureScaler
from smiexlm.model.pooling import pooling_parts
from smiexlm.moleculenet.metrics import TaskScores, score
from smiexlm.moleculenet.report import RunResult
from smiexlm.moleculenet.runs import keep_predictions
from smiexlm.moleculenet.splits import check_split_kind
from smiexlm.moleculenet.task import MoleculeTask, check_task, run_seeds
from smiexlm.paths import check_output


@dataclass
class ProbeConfig:
    """``c_grid``: inverse regularisation strengths tried (logistic C; ridge alpha = 1/C)."""

    c_grid: tuple[float, ...] = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
    # None: the backbone's own (its folder's embedding.json); "cls+mean": side by side
    pooling: str | None = None
    split: str = "scaffold"
    canonicalize: bool = True
    max_length: int = 256
    features: str | None = None
    whiten: bool = False  # the checkpoint's corpus whitening (whitening.safetensors) first
    tta: int = 0  # each embedding the mean over the canonical and this many random SMILES
    # the pooled outputs of the last this many blocks, side by side; None: the backbone's own
    layers: int | None = None
    class_weight: str = "balanced"  # "balanced" | "none"
    batch_size: int = 256
    device: str = "auto"

    def __post_init__(self) -> None:
        self.c_grid = tuple(float(c) for c in self.c_grid)
        if not self.c_grid or min(self.c_grid) <= 0:
            raise ConfigError("c_grid", self.c_grid, "one or more positive numbers")
        if self.pooling is not None:
            pooling_parts(self.pooling)
        check_split_kind(self.split)
        if self.features is not None and self.features not in FEATURE_KINDS:
            raise ConfigError("features", self.features, f"one of {', '.join(FEATURE_KINDS)}")
        if self.class_weight not in ("balanced", "none"):
            raise ConfigError("class_weight", self.class_weight, "'balanced' or 'none'")
        check_spellings("tta", self.tta)
        check_positive_int("layers", self.layers, optional=True)


def pooled_embeddings(backbone, inputs: Sequence[str], cfg: ProbeConfig) -> np.ndarray:
    """(N, d) pooled encoder features of ``inputs`` (eval mode, length-sorted batches); a
    combined pooling such as ``cls+mean`` gives the poolings side by side, (N, 2d), and
    ``cfg.layers`` = n the last n blocks' (the last first), (N, n·d). With ``cfg.tta`` = K,
    each row is the mean over the molecule's canonical SMILES and K random ones
    (:func:`~smiexlm.data.augment.random_smiles`, seed 0); with ``cfg.whiten``, the corpus
    whitening (:func:`probe_whitening`) is applied last."""
    x = _pooled(backbone, inputs, cfg)
    whitening = probe_whitening(backbone, cfg)
    return x if whitening is None else whitening(x)


def probe_whitening(backbone, cfg: ProbeConfig):
    """The backbone's corpus whitening of the probe's pooling and blocks when ``cfg.whiten``
    (a ConfigError when it stores none), else None."""
    if not cfg.whiten:
        return None
    spec, layers = cfg.pooling or backbone.pooling, cfg.layers or backbone.layers
    whitening = backbone.whitening(spec, layers)
    if whitening is None:
        raise ConfigError("whiten", True, f"False: {backbone.name} stores no whitening for "
                          f"{spec} pooling of the last {layers} block(s) (`smiexlm whiten` fits "
                          "one)")  # fmt: skip
    return whitening


def _pooled(backbone, inputs: Sequence[str], cfg: ProbeConfig) -> np.ndarray:
    """(N, d) pooled features as the encoder gives them (mean over the TTA views)."""
    from smiexlm.device import resolve_device
    from smiexlm.finetuning import Examples
    from smiexlm.finetuning import predict as engine_predict

    tokenizer = backbone.tokenizer(inputs)
    model = _probe_model(backbone, tokenizer, cfg, 1)
    model.to(resolve_device(cfg.device)).eval()

    def embed(texts: Sequence[str]) -> np.ndarray:
        rows, _ = backbone.inputs(tokenizer).rows(list(texts), cfg.max_length)
        return engine_predict(model, Examples(rows), cfg.batch_size, output="pooled")

    x = embed(inputs)
    if cfg.tta:
        from smiexlm.data.augment import random_smiles

        for view in zip(*random_smiles(list(inputs), cfg.tta, 0), strict=True):
            x += embed(view)
        x /= cfg.tta + 1
    return x


def _probe_model(backbone, tokenizer, cfg: ProbeConfig, n_outputs: int, task_type="multilabel"):
    """The frozen encoder with a linear head on the probe's pooling and blocks: one pass
    gives every part of a combined pooling and every block."""
    from smiexlm.model.heads import ExLMForSequencePrediction

    spec, layers = cfg.pooling or backbone.pooling, cfg.layers or backbone.layers
    return ExLMForSequencePrediction(backbone.build(tokenizer, 0.0), n_outputs, task_type,
                                     0.0, spec, layers=layers, head="linear")  # fmt: skip


def _fit_task(x_tr, y_tr, x_ev, task_type: str, c: float, cfg: ProbeConfig, seed: int):
    """(predictions of ``x_ev``, coefficients (D,), intercept) of one task's fit: the
    logistic regression's logit (or the ridge's value) is ``x @ coefficients + intercept``."""
    from sklearn.linear_model import LogisticRegression, Ridge

    if task_type == "classification":
        if len(np.unique(y_tr)) < 2:  # one class: its share, as a constant logit
            p = float(np.clip(y_tr.mean() if len(y_tr) else 0.5, 1e-6, 1 - 1e-6))
            return np.full(len(x_ev), p), np.zeros(x_tr.shape[1]), float(np.log(p / (1 - p)))
        weight = None if cfg.class_weight == "none" else "balanced"
        clf = LogisticRegression(C=c, class_weight=weight, max_iter=2000, random_state=seed)
        clf.fit(x_tr, y_tr)
        return clf.predict_proba(x_ev)[:, 1], clf.coef_[0], float(clf.intercept_[0])
    ridge = Ridge(alpha=1.0 / c).fit(x_tr, y_tr)
    return ridge.predict(x_ev), ridge.coef_, float(ridge.intercept_)


class ProbeScores(NamedTuple):
    """The probe on one split: the valid and test scores, the C chosen per task, every valid
    and test molecule's prediction (probabilities, or values for regression), and the fitted
    map: ``logits = ((x - center) / scale) @ coef.T + intercept`` of the probe's input ``x``."""

    valid: TaskScores
    test: TaskScores
    chosen: list[float]
    valid_pred: np.ndarray
    test_pred: np.ndarray
    coef: np.ndarray  # (T, D)
    intercept: np.ndarray  # (T,)
    center: np.ndarray  # (D,)
    scale: np.ndarray  # (D,)

    def linear_map(self, whitening=None) -> tuple[np.ndarray, np.ndarray]:
        """(weight (T, d), bias (T,)) float64 of the logits as one affine map of the pooled
        features themselves: the standardisation and, when given, the whitening
        ``(x - mean) @ matrix`` folded in."""
        coef = self.coef / self.scale  # (T, D)
        offset = self.center
        if whitening is None:
            weight = coef
        else:
            matrix = whitening.matrix.astype(np.float64)
            weight = coef @ matrix.T  # (T, d)
            offset = offset + whitening.mean.astype(np.float64) @ matrix
        return weight, self.intercept - coef @ offset


def probe_split(
    x: np.ndarray,
    y: np.ndarray,
    split,
    task_type: str,
    cfg: ProbeConfig,
    seed: int,
    features: np.ndarray | None = None,
) -> ProbeScores:
    """The probe on one split. ``features`` (N, F), the raw hybrid features (NaN = not
    computable), go beside ``x`` with each missing value the train median (:meth:`FeatureScaler.fill`); every column is then standardised
    with the train mean and standard deviation: no statistic reads a valid or test row."""
    train, valid, test = (
        np.asarray(p, dtype=np.intp) for p in (split.train, split.valid, split.test)
    )
    if features is not None:
        fill = FeatureScaler.fit(features[train], cfg.features or "features")
        x = np.hstack([x, fill.fill(features)])
    mean, std = x[train].mean(0), x[train].std(0)
    z = (x - mean) / np.where(std > 1e-8, std, 1.0)
    higher = task_type == "classification"
    valid_pred = np.zeros((len(valid), y.shape[1]))
    test_pred = np.zeros((len(test), y.shape[1]))
    coef, intercept = np.zeros((y.shape[1], x.shape[1])), np.zeros(y.shape[1])
    chosen = []
    for t in range(y.shape[1]):
        known = train[~np.isnan(y[train, t])]
        best = None
        for c in cfg.c_grid:
            fitted = _fit_task(z[known], y[known, t], z[np.r_[valid, test]], task_type, c, cfg,
                               seed)  # fmt: skip
            v = score(task_type, y[valid, t : t + 1], fitted[0][: len(valid), None]).mean
            wins = not np.isnan(v) and (best is None or np.isnan(best[0]) or (
                v > best[0] if higher else v < best[0]))  # fmt: skip
            if best is None or wins:  # ties keep the stronger regularisation
                best = (v, c, *fitted)
        chosen.append(best[1])
        pred, coef[t], intercept[t] = best[2:]
        valid_pred[:, t], test_pred[:, t] = pred[: len(valid)], pred[len(valid) :]
    return ProbeScores(score(task_type, y[valid], valid_pred), score(task_type, y[test], test_pred),
                       chosen, valid_pred, test_pred, coef, intercept, mean,
                       np.where(std > 1e-8, std, 1.0))  # fmt: skip


def run_probe(
    task: MoleculeTask,
    backbone=None,
    seeds: Sequence[int] = (0, 1, 2),
    cfg: ProbeConfig | None = None,
    run_root: Path | None = None,
    save_dir: Path | None = None,
    overwrite: bool = False,
) -> list[RunResult]:
    """The linear probe on ``task`` for each seed; with ``run_root``, each seed's valid and
    test predictions are kept as fine-tuning keeps them, in
    ``run_root/<set>/seed<k>/predictions.npz``. ``save_dir`` keeps each distinct fit as a
    folder ``predict`` serves (:func:`save_probe`), in ``save_dir/seed<k>`` of the first seed
    it serves: one folder for a deterministic split, whose fit serves every seed."""
    from smiexlm.finetuning.backbone import Backbone

    cfg = cfg or ProbeConfig()
    backbone = backbone or Backbone()
    task = check_task(task)
    if save_dir is not None:  # before any work
        _check_savable(cfg)
        check_output(save_dir, "--save-dir", "folder")
        check_free_seed_folders(Path(save_dir), seeds, overwrite)
    start = time.perf_counter()
    inputs = backbone.model_texts(task.smiles, cfg.canonicalize)
    pooled = _pooled(backbone, inputs, cfg)
    whitening = probe_whitening(backbone, cfg)
    x = pooled if whitening is None else whitening(pooled)
    raw = None
    if cfg.features:
        from smiexlm.chemistry.fingerprints import molecule_features

        # filled per split, on its train rows
        raw = molecule_features(inputs, cfg.features, cache=True)
    kind = "logistic" if task.is_classification else "ridge"
    name = f"{backbone.name} linear probe ({kind})" + (", whitened" if cfg.whiten else "")
    name += f" + {cfg.features}" if cfg.features else ""
    name += f", last {cfg.layers} blocks" if cfg.layers and cfg.layers > 1 else ""
    name += f", mean of {cfg.tta + 1} SMILES" if cfg.tta else ""

    fitted: dict[tuple, ProbeScores] = {}  # a deterministic split's fits serve every seed

    def one_seed(split, seed: int) -> RunResult:
        key = (split.label, None if split.seed is None else seed)
        if key not in fitted:
            fitted[key] = probe_split(x, task.labels, split, task.task_type, cfg, seed, raw)
            if save_dir is not None:
                save_probe(Path(save_dir) / f"seed{seed}", backbone, task, split, seed, cfg,
                           fitted[key], inputs, pooled, whitening)  # fmt: skip
        got = fitted[key]
        keep_predictions(run_root, task.name, seed, split, got.valid_pred, got.test_pred)
        return task.result(name, split, seed, got.valid.mean, got.test, 0.0,
                           _record(cfg, backbone, got), test_pred=got.test_pred)  # fmt: skip

    return run_seeds(task, seeds, cfg.split, one_seed, shared_s=time.perf_counter() - start)


def _record(cfg: ProbeConfig, backbone, got: ProbeScores) -> dict:
    """The result's config: the probe's settings, its backbone and the C chosen per task."""
    return asdict(cfg) | {"backbone": backbone.name, "chosen_c": got.chosen,
                          "backbone_sha256": backbone.weights_sha256,
                          "pooling": cfg.pooling or backbone.pooling,
                          "layers": cfg.layers or backbone.layers}  # fmt: skip


def _check_savable(cfg: ProbeConfig) -> None:
    """ConfigError for what a saved probe could not serve as it was scored."""
    if cfg.features:
        raise ConfigError("features", cfg.features, "None with --save-dir (a saved probe "
                          "serves the embedding alone)")  # fmt: skip
    if cfg.tta:
        raise ConfigError("tta", cfg.tta, "0 with --save-dir (a saved probe reads each "
                          "molecule's canonical SMILES; predict --tta averages its scores)")  # fmt: skip


def save_probe(folder: Path, backbone, task: MoleculeTask, split, seed: int, cfg: ProbeConfig,
               got: ProbeScores, inputs: list[str], pooled: np.ndarray, whitening) -> Path:  # fmt: skip
    """Write the probe as a fine-tuned folder ``predict`` serves: the backbone's encoder with a
    linear head (``finetune.json``'s ``head = "linear"``) whose weights are the fitted map of
    the pooled features, the standardisation and the whitening folded in, and the reference
    of the applicability domain and calibration (:func:`~smiexlm.finetuning.folder.save_finetuned`)."""
    import torch

    from smiexlm.finetuning.folder import save_finetuned
    from smiexlm.finetuning.inference import to_scores
    from smiexlm.trust.reference import Reference

    _check_savable(cfg)
    weight, bias = got.linear_map(whitening)
    tokenizer = backbone.tokenizer(inputs)
    n = len(task.label_cols)
    model = _probe_model(backbone, tokenizer, cfg, n,
                         "multilabel" if task.is_classification else "regression")  # fmt: skip
    with torch.no_grad():
        model.head.out_proj.weight.copy_(torch.from_numpy(weight))
        model.head.out_proj.bias.copy_(torch.from_numpy(bias))
    train, valid = np.asarray(split.train, np.intp), np.asarray(split.valid, np.intp)
    logits = pooled[valid].astype(np.float64) @ weight.T + bias
    zeros, ones = np.zeros(n, dtype=np.float32), np.ones(n, dtype=np.float32)
    reference = Reference.build(
        [inputs[i] for i in train], pooled[train], [inputs[i] for i in valid], pooled[valid],
        task.labels[valid], logits, to_scores(logits, task.task_type, zeros, ones),
    )  # fmt: skip
    config = asdict(cfg) | {"pooling": cfg.pooling or backbone.pooling,
                            "layers": cfg.layers or backbone.layers, "chosen_c": got.chosen}  # fmt: skip
    meta = dict(
        dataset=task.name, task_type=task.task_type, label_cols=task.label_cols, config=config,
        seed=seed, split=split.label, target_mean=zeros.tolist(), target_std=ones.tolist(),
        backbone=backbone.name, best_epoch=None, feature_scaler=None,
    )  # fmt: skip
    counts = None if backbone.folder is None else backbone.folder.corpus_tokens
    corpus = None if counts is None else (counts, f"the pretraining corpus of {backbone.name}")
    return save_finetuned(model, tokenizer, folder, meta, normalization=backbone.normalization,
                          reference=reference, corpus_tokens=corpus)  # fmt: skip
