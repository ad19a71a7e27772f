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

from smiexlm.errors import ConfigError, check_positive_int, check_spellings
from smiexlm.fingerprints import FEATURE_KINDS
from smiexlm.model.pooling import pooling_parts
from smiexlm.moleculenet.features import FeatureScaler
from smiexlm.moleculenet.metrics import TaskScores, score
from smiexlm.moleculenet.report import RunResult
from smiexlm.moleculenet.runs import keep_predictions
from smiexlm.moleculenet.splits import check_split_kind
from smiexlm.moleculenet.task import MoleculeTask, check_task, run_seeds


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
    (:func:`~smiexlm.data.augment.random_smiles`, seed 0)."""
    from smiexlm.device import resolve_device
    from smiexlm.finetuning import Examples
    from smiexlm.finetuning import predict as engine_predict
    from smiexlm.model.heads import ExLMForSequencePrediction

    tokenizer = backbone.tokenizer(inputs)
    encoder = backbone.build(tokenizer, 0.0)
    spec, layers = cfg.pooling or backbone.pooling, cfg.layers or backbone.layers
    # every part of a combined pooling and every block from one pass (the head is not used)
    model = ExLMForSequencePrediction(encoder, 1, pooling=spec, layers=layers)  # type: ignore[arg-type]  # fmt: skip
    device = resolve_device(cfg.device)
    model.to(device).eval()

    def embed(texts: Sequence[str]) -> np.ndarray:
        rows, _ = backbone.inputs(tokenizer).rows(list(texts), cfg.max_length)
        return engine_predict(model, Examples(rows), cfg.batch_size, output="pooled")

    x = embed(inputs)
    if cfg.tta:
        from smiexlm.data.augment import random_smiles

        for view in zip(*random_smiles(list(inputs), cfg.tta, 0), strict=True):
            x += embed(view)
        x /= cfg.tta + 1
    if not cfg.whiten:
        return x
    whitening = backbone.whitening(spec, layers)
    if whitening is None:
        raise ConfigError("whiten", True, f"False: {backbone.name} stores no whitening for "
                          f"{spec} pooling of the last {layers} block(s) (`smiexlm whiten` fits "
                          "one)")  # fmt: skip
    return whitening(x)


def _fit_task(x_tr, y_tr, x_ev, task_type: str, c: float, cfg: ProbeConfig, seed: int):
    from sklearn.linear_model import LogisticRegression, Ridge

    if task_type == "classification":
        if len(np.unique(y_tr)) < 2:
            return np.full(len(x_ev), y_tr.mean() if len(y_tr) else 0.5)
        weight = None if cfg.class_weight == "none" else "balanced"
        clf = LogisticRegression(C=c, class_weight=weight, max_iter=2000, random_state=seed)
        return clf.fit(x_tr, y_tr).predict_proba(x_ev)[:, 1]
    return Ridge(alpha=1.0 / c).fit(x_tr, y_tr).predict(x_ev)


class ProbeScores(NamedTuple):
    """The probe on one split: the valid and test scores, the C chosen per task, and every
    valid and test molecule's prediction (probabilities, or values for regression)."""

    valid: TaskScores
    test: TaskScores
    chosen: list[float]
    valid_pred: np.ndarray
    test_pred: np.ndarray


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
    train, valid, test = (np.asarray(p) for p in (split.train, split.valid, split.test))
    if features is not None:
        fill = FeatureScaler.fit(features[train], cfg.features or "features")
        x = np.hstack([x, fill.fill(features)])
    mean, std = x[train].mean(0), x[train].std(0)
    z = (x - mean) / np.where(std > 1e-8, std, 1.0)
    higher = task_type == "classification"
    valid_pred = np.zeros((len(valid), y.shape[1]))
    test_pred = np.zeros((len(test), y.shape[1]))
    chosen = []
    for t in range(y.shape[1]):
        known = train[~np.isnan(y[train, t])]
        best = None
        for c in cfg.c_grid:
            pred = _fit_task(z[known], y[known, t], z[np.r_[valid, test]], task_type, c, cfg, seed)
            v = score(task_type, y[valid, t : t + 1], pred[: len(valid), None]).mean
            wins = not np.isnan(v) and (best is None or np.isnan(best[0]) or (
                v > best[0] if higher else v < best[0]))  # fmt: skip
            if best is None or wins:  # ties keep the stronger regularisation
                best = (v, c, pred)
        chosen.append(best[1])
        valid_pred[:, t], test_pred[:, t] = best[2][: len(valid)], best[2][len(valid) :]
    return ProbeScores(score(task_type, y[valid], valid_pred), score(task_type, y[test], test_pred),
                       chosen, valid_pred, test_pred)  # fmt: skip


def run_probe(
    task: MoleculeTask,
    backbone=None,
    seeds: Sequence[int] = (0, 1, 2),
    cfg: ProbeConfig | None = None,
    run_root: Path | None = None,
) -> list[RunResult]:
    """The linear probe on ``task`` for each seed; with ``run_root``, each seed's valid and
    test predictions are kept as fine-tuning keeps them, in
    ``run_root/<set>/seed<k>/predictions.npz``."""
    from smiexlm.moleculenet.backbone import Backbone

    cfg = cfg or ProbeConfig()
    backbone = backbone or Backbone()
    task = check_task(task)
    start = time.perf_counter()
    inputs = backbone.model_texts(task.smiles, cfg.canonicalize)
    x = pooled_embeddings(backbone, inputs, cfg)
    raw = None
    if cfg.features:
        from smiexlm.fingerprints import molecule_features

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
        got = fitted[key]
        keep_predictions(run_root, task.name, seed, split, got.valid_pred, got.test_pred)
        config = asdict(cfg) | {"backbone": backbone.name, "chosen_c": got.chosen,
                                "backbone_sha256": backbone.weights_sha256,
                                "pooling": cfg.pooling or backbone.pooling,
                                "layers": cfg.layers or backbone.layers}  # fmt: skip
        return task.result(name, split, seed, got.valid.mean, got.test, 0.0, config,
                           test_pred=got.test_pred)  # fmt: skip

    return run_seeds(task, seeds, cfg.split, one_seed, shared_s=time.perf_counter() - start)
