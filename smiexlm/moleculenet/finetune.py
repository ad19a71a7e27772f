"""MoleculeNet (and user CSV) adapter of the fine-tuning engine.

Recipe (paper §5.1, Table 8): sequence head on the first state's features (dense → tanh →
pooler dropout → out_proj), multi-label BCE with missing labels masked (MSE on standardised
targets for regression), validation after every epoch, the best-valid epoch's weights scored
once on test. The loop itself (optimizer, schedule, clipping, AMP, bucketed batches, early
stopping) is :func:`smiexlm.finetuning.fit`; this module turns a DataFrame and a split into
its inputs and its results into a :class:`RunResult`. Inputs have the pretraining form
(BOS ... EOS; the model expands them for ExLM), from canonical SMILES unless
``canonicalize=False``.

Without a checkpoint the backbone is the shipped default model; a random init of a preset
is used only when asked (``Backbone(random_init=True)``).

A fine-tuned folder holds the backbone (``config.json``, ``vocab.json``, ``model.safetensors``),
``head.safetensors`` and ``finetune.json`` (task, label columns, config, target scaling, the
hybrid features' scaler); it is what ``predict`` reads. Several folders (seeds) make an
ensemble: the mean prediction and its standard deviation per molecule.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from torch import nn

from smiexlm.device import resolve_device
from smiexlm.errors import DataError
from smiexlm.moleculenet.configs import FinetuneConfig
from smiexlm.moleculenet.metrics import check_scorable, score
from smiexlm.moleculenet.report import RunResult
from smiexlm.moleculenet.splits import Split, make_split
from smiexlm.paths import ASSETS_DIR, atomic_dir, check_output

log = logging.getLogger(__name__)

HEAD_NAME = "head.safetensors"
META_NAME = "finetune.json"
DEFAULT_MODEL_DIR = ASSETS_DIR / "default_model"


def model_inputs(smiles: Sequence[str], canonicalize: bool) -> Sequence[str]:
    """What the model reads: the RDKit canonical SMILES of each input (each must already be
    parsable) when ``canonicalize``, else the inputs as written."""
    if not canonicalize:
        return smiles
    from smiexlm.data.normalize import canonical_smiles as canonical
    from smiexlm.errors import InvalidSmilesError

    out = []
    for s in smiles:
        c = canonical(s)
        if c is None:
            raise InvalidSmilesError(s, reason="RDKit cannot parse it")
        out.append(c)
    return out


@dataclass
class Backbone:
    """Where the encoder comes from: a checkpoint folder (default: the shipped model), or,
    only with ``random_init=True``, a preset initialised at random."""

    checkpoint: Path | None = None
    preset: str = "tiny"
    objective: str = "mlm"  # only for random init
    random_init: bool = False

    def __post_init__(self) -> None:
        if self.random_init and self.checkpoint is not None:
            from smiexlm.errors import ConfigError

            raise ConfigError("random_init", True, "no checkpoint (it ignores the weights)")
        if self.checkpoint is None and not self.random_init:
            self.checkpoint = DEFAULT_MODEL_DIR

    @property
    def name(self) -> str:
        if self.checkpoint is not None:
            return Path(self.checkpoint).name
        return f"random-init {self.preset} ({self.objective})"

    def tokenizer(self, corpus: Sequence[str]):
        """The checkpoint's vocabulary; for random init the shipped one, else one built from
        ``corpus`` (the dataset's SMILES: vocabulary only, no labels)."""
        from smiexlm.tokenizer import SmilesTokenizer

        if self.checkpoint is not None:
            return SmilesTokenizer.load(Path(self.checkpoint) / "vocab.json")
        try:
            return SmilesTokenizer()
        except DataError:
            return SmilesTokenizer.build(corpus)

    def build(self, tokenizer, dropout: float):
        from smiexlm.model.config import ExLMConfig
        from smiexlm.model.model import ExLMModel

        if self.checkpoint is not None:
            model = ExLMModel.from_pretrained(self.checkpoint)
        else:
            cfg = ExLMConfig.preset(
                self.preset, vocab_size=tokenizer.vocab_size, objective=self.objective,
                vocab_hash=tokenizer.vocab_hash,
            )  # fmt: skip
            model = ExLMModel(cfg)
        model.config.dropout = dropout
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = dropout
        return model


def encode_rows(tokenizer, smiles: Sequence[str], max_length: int) -> tuple[list[list[int]], int]:
    """Ids (BOS ... EOS) per SMILES, cut to ``max_length`` keeping EOS; and the number cut."""
    rows = tokenizer.encode_many(list(smiles))
    n_cut = 0
    for i, row in enumerate(rows):
        if len(row) > max_length:
            rows[i] = [*row[: max_length - 1], row[-1]]
            n_cut += 1
    return rows, n_cut


def loop_config(cfg: FinetuneConfig, higher_is_better: bool):
    """The engine's settings for a MoleculeNet config."""
    from smiexlm.finetuning import LoopConfig

    return LoopConfig(
        epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr, warmup_ratio=cfg.warmup_ratio,
        weight_decay=cfg.weight_decay, adam_betas=cfg.adam_betas, adam_eps=cfg.adam_eps,
        clip_norm=cfg.clip_norm, max_steps=cfg.max_train_steps, patience=cfg.patience,
        select="best", higher_is_better=higher_is_better, amp=cfg.amp,  # type: ignore[arg-type]
        eval_batch_size=cfg.eval_batch_size, freeze=cfg.freeze, freeze_layers=cfg.freeze_layers,
        device=cfg.device,
    )  # fmt: skip


def variant_name(backbone: Backbone, cfg: FinetuneConfig) -> str:
    """The report's row name: the backbone plus how it was fine-tuned."""
    name = backbone.name
    if cfg.freeze:
        name += " frozen"
    elif cfg.freeze_layers:
        name += f" ({cfg.freeze_layers} layers frozen)"
    return name + (f" + {cfg.features}" if cfg.features else "")


def _to_scores(logits: np.ndarray, task_type: str, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    if task_type == "classification":
        return 1.0 / (1.0 + np.exp(-logits))
    return logits * std + mean


def finetune_once(
    df: pd.DataFrame,
    split: Split,
    cfg: FinetuneConfig,
    seed: int,
    backbone: Backbone,
    save_dir: Path | None = None,
    inputs: list[str] | None = None,
    raw_features: np.ndarray | None = None,
    progress: bool = True,
) -> RunResult:
    """One seed: train on ``split.train``, select on valid per epoch, score test.

    ``inputs`` are the model-side SMILES when already prepared (canonical or as written);
    ``raw_features`` the unscaled hybrid features of every row, when already computed.
    """
    from smiexlm.finetuning import Examples, fit
    from smiexlm.finetuning import predict as engine_predict
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.moleculenet.features import FeatureScaler

    t0 = time.perf_counter()
    name, task_type = df.attrs.get("name", "data"), df.attrs.get("task_type", "classification")
    label_cols = df.attrs.get("label_cols") or [c for c in df.columns if c != "smiles"]
    smiles = df["smiles"].tolist()
    if inputs is None:
        inputs = model_inputs(smiles, cfg.canonicalize)
    tokenizer = backbone.tokenizer(inputs)
    rows, n_cut = encode_rows(tokenizer, inputs, cfg.max_length)
    y = df[label_cols].to_numpy(dtype=np.float32)  # (N, T), NaN = missing
    if task_type == "classification":
        check_scorable(y[split.test], label_cols, name, split.label)
    mean = np.zeros(len(label_cols), dtype=np.float32)
    std = np.ones(len(label_cols), dtype=np.float32)
    if task_type == "regression":
        mean = np.nanmean(y[split.train], axis=0)
        std = np.nanstd(y[split.train], axis=0) + 1e-6
    features, scaler = None, None
    if cfg.features:
        if raw_features is None:
            from smiexlm.fingerprints import molecule_features

            raw_features = molecule_features(inputs, cfg.features)
        scaler = FeatureScaler.fit(raw_features[np.asarray(split.train)], cfg.features)
        features = torch.from_numpy(scaler.transform(raw_features))

    torch.manual_seed(seed)
    head_type = "multilabel" if task_type == "classification" else "regression"
    model = ExLMForSequencePrediction(
        backbone.build(tokenizer, cfg.dropout), len(label_cols), head_type, cfg.pooler_dropout,
        cfg.pooling, n_features=0 if features is None else features.shape[1],  # type: ignore[arg-type]
    )  # fmt: skip
    data = Examples(rows, torch.from_numpy((y - mean) / std), features)
    train, valid, test = (
        data.subset(np.asarray(part)) for part in (split.train, split.valid, split.test)
    )
    loop = loop_config(cfg, higher_is_better=task_type == "classification")

    def valid_score(logits: np.ndarray) -> float:
        return score(task_type, y[split.valid], _to_scores(logits, task_type, mean, std)).mean

    fitted = fit(model, train, valid, loop, valid_score, seed, progress, f"{name} seed {seed}")
    # the test split is scored as `predict` serves (fp32, batch-invariant), so the reported
    # score is the one a user gets back from the saved model
    logits = engine_predict(model, test, cfg.eval_batch_size)
    test_score = score(task_type, y[split.test], _to_scores(logits, task_type, mean, std))
    if save_dir is not None:
        save_finetuned(model, tokenizer, save_dir, dict(
            dataset=name, task_type=task_type, label_cols=label_cols, config=cfg.to_dict(),
            seed=seed, split=split.label, target_mean=mean.tolist(), target_std=std.tolist(),
            backbone=backbone.name, best_epoch=fitted.best_epoch,
            feature_scaler=None if scaler is None else scaler.to_dict(),
        ))  # fmt: skip
    scale = 100.0 if task_type == "classification" else 1.0
    config = cfg.to_dict() | {"backbone": backbone.name, "n_truncated": n_cut} | fitted.summary()
    return RunResult(
        model=variant_name(backbone, cfg),
        dataset=name,
        seed=seed,
        split=split.label,
        metric="roc_auc" if task_type == "classification" else "rmse",
        test=test_score.mean * scale,
        valid=fitted.best_valid * scale,
        sizes=split.sizes,
        n_invalid=int(df.attrs.get("n_invalid", 0)),
        n_tasks_scored=test_score.n_scored,
        n_tasks=len(label_cols),
        wall_s=time.perf_counter() - t0,
        data_sha256=df.attrs.get("sha256"),
        best_epoch=fitted.best_epoch,
        config=config,
    )


def run_finetune(
    df: pd.DataFrame,
    cfg: FinetuneConfig,
    backbone: Backbone | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    save_dir: Path | None = None,
    progress: bool = True,
) -> list[RunResult]:
    """``finetune_once`` per seed on one split (deterministic kinds are computed once)."""
    backbone = backbone or Backbone()
    if save_dir is not None:
        check_output(save_dir, "--save-dir", "folder")  # before training, not after it
    results = []
    split = None
    smiles = df["smiles"].tolist()
    inputs = model_inputs(smiles, cfg.canonicalize)
    raw = None
    if cfg.features:
        from smiexlm.fingerprints import molecule_features

        raw = molecule_features(inputs, cfg.features)
    for seed in seeds:
        if split is None or split.seed is not None:
            split = make_split(smiles, cfg.split, seed)
        target = None if save_dir is None else Path(save_dir) / f"seed{seed}"
        results.append(finetune_once(df, split, cfg, seed, backbone, target, inputs, raw, progress))
        r = results[-1]
        log.info("%s seed %d: valid %.2f test %.2f", r.dataset, seed, r.valid, r.test)
    return results


def save_finetuned(model, tokenizer, directory: Path, meta: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    from smiexlm.model.integrity import record_checksums

    directory = Path(directory)
    with atomic_dir(directory) as tmp:  # the folder appears complete or not at all
        model.model.save_pretrained(tmp, tokenizer=tokenizer)
        head = {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()}
        save_file(head, str(tmp / HEAD_NAME), metadata={"format": "pt"})
        record_checksums(tmp, HEAD_NAME)  # beside the backbone's model.safetensors
        meta = meta | {"pooling": model.pooling, "n_outputs": int(head["out_proj.bias"].shape[0]),
                       "n_features": model.n_features}  # fmt: skip
        (tmp / META_NAME).write_text(json.dumps(meta, indent=1))
    return directory


def load_finetuned(directory: Path | str, device: str = "auto"):
    """(model, tokenizer, meta) from a folder written by ``finetune`` (see module docstring);
    each file is checked first (``finetune.json``'s keys, the weights' shapes and sha256)."""
    from smiexlm.model.checkpoint import load_module_weights
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel
    from smiexlm.moleculenet.folder import read_finetune_meta
    from smiexlm.tokenizer import SmilesTokenizer

    directory = Path(directory)
    if not (directory / META_NAME).is_file():
        raise DataError(
            f"--checkpoint {str(directory)!r}: no {META_NAME}; expected a folder written by "
            "`smiexlm finetune --save-dir DIR`, which writes DIR/seed0, DIR/seed1, ..."
        )
    meta = read_finetune_meta(directory / META_NAME)
    head_type = "multilabel" if meta["task_type"] == "classification" else "regression"
    model = ExLMForSequencePrediction(
        ExLMModel.from_pretrained(directory), meta["n_outputs"], head_type, 0.0, meta["pooling"],
        n_features=meta["n_features"],
    )  # fmt: skip
    load_module_weights(model.head, directory / HEAD_NAME, f"{META_NAME} and the backbone")
    return (
        model.to(resolve_device(device)).eval(),
        SmilesTokenizer.load(directory / "vocab.json"),
        meta,
    )


def _predict_one(
    directory: Path | str, smiles: list[str], batch_size: int, backend: str = "torch"
) -> tuple[np.ndarray, dict]:
    """(N, T) scores of one fine-tuned folder on parsable SMILES."""
    from smiexlm.finetuning import Examples
    from smiexlm.finetuning import predict as engine_predict
    from smiexlm.moleculenet.features import FeatureScaler

    if backend == "onnx":  # the folder's predictor.onnx (smiexlm export-onnx)
        from smiexlm.serving.onnx_runtime import OnnxPredictor

        model = OnnxPredictor(directory)
        tokenizer, meta = model.tokenizer, model.meta
    else:
        model, tokenizer, meta = load_finetuned(directory)
    cfg = meta["config"]
    inputs = model_inputs(smiles, cfg.get("canonicalize", True))
    rows, _ = encode_rows(tokenizer, inputs, cfg.get("max_length", 256))
    features = None
    if meta.get("feature_scaler"):
        from smiexlm.fingerprints import molecule_features

        scaler = FeatureScaler.from_dict(meta["feature_scaler"])
        features = torch.from_numpy(scaler.transform(molecule_features(inputs, scaler.kind)))
    if backend == "onnx":
        logits = model.logits(rows, None if features is None else features.numpy(), batch_size)
    else:
        logits = engine_predict(model, Examples(rows, None, features), batch_size)
    mean = np.asarray(meta["target_mean"], dtype=np.float32)
    std = np.asarray(meta["target_std"], dtype=np.float32)
    return _to_scores(logits, meta["task_type"], mean, std), meta


def predict(
    checkpoint: Path | str | Sequence[Path | str],
    smiles: Sequence[str],
    batch_size: int = 256,
    backend: Literal["torch", "onnx"] = "torch",
) -> pd.DataFrame:
    """Predictions per input SMILES: probabilities (classification) or values (regression).

    Several fine-tuned folders (e.g. the seeds of one run) make an ensemble: each label column
    is the mean over the models and ``<label>_std`` their standard deviation (ddof 0), the
    per-molecule uncertainty. Unparsable SMILES (and those longer than
    :data:`~smiexlm.data.normalize.MAX_SMILES_CHARS`) get NaN rows and ``valid = False``, never
    silently dropped. ``backend="onnx"`` serves each folder's ``predictor.onnx`` with
    onnxruntime (written by ``smiexlm export-onnx FOLDER``).
    """
    from smiexlm.data.normalize import smiles_problem

    if backend not in ("torch", "onnx"):
        from smiexlm.errors import ConfigError

        raise ConfigError("backend", backend, "'torch' or 'onnx'")

    folders = [checkpoint] if isinstance(checkpoint, (str, Path)) else list(checkpoint)
    if not folders:
        raise DataError("--checkpoint: expected at least one fine-tuned folder")
    ok = [smiles_problem(s) is None for s in smiles]  # too long or unparsable: a NaN row
    good = [s for s, v in zip(smiles, ok, strict=True) if v]
    runs, metas = [], []
    for folder in folders:
        values, meta = _predict_one(folder, good, batch_size, backend)
        if metas and (meta["label_cols"], meta["task_type"]) != (
            metas[0]["label_cols"], metas[0]["task_type"]
        ):  # fmt: skip
            raise DataError(
                f"--checkpoint {str(folder)!r}: predicts {meta['label_cols']} "
                f"({meta['task_type']}); expected {metas[0]['label_cols']} like {str(folders[0])!r}"
            )
        runs.append(values)
        metas.append(meta)
    labels = meta["label_cols"]
    stack = np.stack(runs).reshape(len(runs), len(good), len(labels))  # (M, N_good, T)
    valid_rows = np.asarray(ok, dtype=bool)
    out = np.full((len(smiles), len(labels)), np.nan)
    out[valid_rows] = stack.mean(axis=0)
    frame = pd.DataFrame(out, columns=labels)
    if len(folders) > 1:
        spread = np.full((len(smiles), len(labels)), np.nan)
        spread[valid_rows] = stack.std(axis=0)
        for j, label in enumerate(labels):
            frame[f"{label}_std"] = spread[:, j]
    frame.insert(0, "valid", ok)
    frame.insert(0, "smiles", list(smiles))
    return frame
