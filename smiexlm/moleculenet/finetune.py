"""Fine-tune an ExLM/MLM/MAE-LM checkpoint (or a random init of a preset) on one dataset.

Recipe (paper §5.1, Table 8): sequence head on the first state's features (dense → tanh →
pooler dropout → out_proj), multi-label BCE with missing labels masked (MSE on standardised
targets for regression), AdamW with linear warmup then linear decay to zero, gradient clipping,
evaluation on valid after every epoch, the best-valid epoch's weights scored once on test.
Inputs have the pretraining form (BOS ... EOS; the model expands them for ExLM), from
canonical SMILES unless ``canonicalize=False``.

A fine-tuned folder holds the backbone (``config.json``, ``vocab.json``, ``model.safetensors``),
``head.safetensors`` and ``finetune.json`` (task, label columns, config, target scaling); it is
what ``predict`` reads.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from smiexlm.device import resolve_device
from smiexlm.errors import DataError
from smiexlm.moleculenet.configs import FinetuneConfig
from smiexlm.moleculenet.metrics import check_scorable, score
from smiexlm.moleculenet.report import RunResult
from smiexlm.moleculenet.splits import Split, make_split

log = logging.getLogger(__name__)

HEAD_NAME = "head.safetensors"
META_NAME = "finetune.json"


def canonical_smiles(smiles: Sequence[str]) -> list[str]:
    """RDKit canonical SMILES (the input must already be parsable)."""
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    out = []
    for s in smiles:
        mol = Chem.MolFromSmiles(s)
        if mol is None:
            from smiexlm.errors import InvalidSmilesError

            raise InvalidSmilesError(s, reason="RDKit cannot parse it")
        out.append(Chem.MolToSmiles(mol))
    return out


@dataclass
class Backbone:
    """Where the encoder comes from: a checkpoint folder, or a preset initialised at random."""

    checkpoint: Path | None = None
    preset: str = "tiny"
    objective: str = "mlm"  # only for random init

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


def pad_batch(rows: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """(B, T) long ids with PAD = 0 and (B, T) bool mask, True = real token."""
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return ids, ids != 0


def linear_warmup_decay(step: int, warmup: int, total: int) -> float:
    """LR multiplier: 0 → 1 over ``warmup`` steps, then 1 → 0 linearly at ``total``."""
    if step < warmup:
        return (step + 1) / max(1, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


@torch.no_grad()
def predict_rows(model, rows: list[list[int]], batch_size: int, device: torch.device) -> np.ndarray:
    """Raw head outputs (N, T) in input order."""
    model.eval()
    out = []
    for start in range(0, len(rows), batch_size):
        ids, mask = pad_batch(rows[start : start + batch_size])
        out.append(model(ids.to(device), mask.to(device)).logits.float().cpu())
    return torch.cat(out).numpy() if out else np.zeros((0, 0))


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
) -> RunResult:
    """One seed: train on ``split.train``, select on valid per epoch, score test.

    ``inputs`` are the model-side SMILES when already prepared (canonical or as written).
    """
    from smiexlm.model.heads import ExLMForSequencePrediction

    t0 = time.perf_counter()
    torch.manual_seed(seed)
    device = resolve_device(cfg.device)
    name, task_type = df.attrs.get("name", "data"), df.attrs.get("task_type", "classification")
    label_cols = df.attrs.get("label_cols") or [c for c in df.columns if c != "smiles"]
    smiles = df["smiles"].tolist()
    if inputs is None:
        inputs = canonical_smiles(smiles) if cfg.canonicalize else smiles
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
    y_train = torch.from_numpy((y - mean) / std)

    encoder = backbone.build(tokenizer, cfg.dropout)
    head_type = "multilabel" if task_type == "classification" else "regression"
    model = ExLMForSequencePrediction(
        encoder,
        len(label_cols),
        head_type,
        cfg.pooler_dropout,
        cfg.pooling,  # type: ignore[arg-type]
    ).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=cfg.adam_betas, eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
    )  # fmt: skip
    steps_per_epoch = math.ceil(len(split.train) / cfg.batch_size)
    total = cfg.epochs * steps_per_epoch
    if cfg.max_train_steps is not None:
        total = min(total, cfg.max_train_steps)
    warmup = int(cfg.warmup_ratio * total)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: linear_warmup_decay(s, warmup, total)
    )
    rng = np.random.default_rng(seed)
    train_idx = np.asarray(split.train)
    valid_rows = [rows[i] for i in split.valid]
    better = (lambda a, b: a > b) if task_type == "classification" else (lambda a, b: a < b)
    best_valid, best_epoch, best_state = float("nan"), 0, None
    step, epoch = 0, 0
    bar = tqdm(total=total, desc=f"{name} seed {seed}", leave=False, unit="step")
    while step < total:
        epoch += 1
        model.train()
        order = train_idx[rng.permutation(len(train_idx))]
        for start in range(0, len(order), cfg.batch_size):
            batch = order[start : start + cfg.batch_size]
            ids, mask = pad_batch([rows[i] for i in batch])
            out = model(ids.to(device), mask.to(device), y_train[batch].to(device))
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{out.loss.item():.3f}", epoch=epoch)
            if step >= total:
                break
        pred = _to_scores(
            predict_rows(model, valid_rows, cfg.eval_batch_size, device), task_type, mean, std
        )
        valid = score(task_type, y[split.valid], pred).mean
        if best_state is None or (
            not math.isnan(valid) and (math.isnan(best_valid) or better(valid, best_valid))
        ):
            best_valid, best_epoch = valid, epoch
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        bar.set_postfix(valid=f"{valid:.3f}", best=f"{best_valid:.3f}@{best_epoch}")
    bar.close()
    model.load_state_dict(best_state)
    test_rows = [rows[i] for i in split.test]
    test_pred = _to_scores(
        predict_rows(model, test_rows, cfg.eval_batch_size, device), task_type, mean, std
    )
    test = score(task_type, y[split.test], test_pred)
    if save_dir is not None:
        save_finetuned(model, tokenizer, save_dir, dict(
            dataset=name, task_type=task_type, label_cols=label_cols, config=cfg.to_dict(),
            seed=seed, split=split.label, target_mean=mean.tolist(), target_std=std.tolist(),
            backbone=backbone.name, best_epoch=best_epoch,
        ))  # fmt: skip
    scale = 100.0 if task_type == "classification" else 1.0
    config = cfg.to_dict() | {"backbone": backbone.name, "n_truncated": n_cut, "steps": step}
    return RunResult(
        model=backbone.name,
        dataset=name,
        seed=seed,
        split=split.label,
        metric="roc_auc" if task_type == "classification" else "rmse",
        test=test.mean * scale,
        valid=best_valid * scale,
        sizes=split.sizes,
        n_invalid=int(df.attrs.get("n_invalid", 0)),
        n_tasks_scored=test.n_scored,
        n_tasks=len(label_cols),
        wall_s=time.perf_counter() - t0,
        data_sha256=df.attrs.get("sha256"),
        best_epoch=best_epoch,
        config=config,
    )


def run_finetune(
    df: pd.DataFrame,
    cfg: FinetuneConfig,
    backbone: Backbone,
    seeds: Sequence[int] = (0, 1, 2),
    save_dir: Path | None = None,
) -> list[RunResult]:
    """``finetune_once`` per seed on one split (deterministic kinds are computed once)."""
    results = []
    split = None
    smiles = df["smiles"].tolist()
    inputs = canonical_smiles(smiles) if cfg.canonicalize else smiles
    for seed in seeds:
        if split is None or split.seed is not None:
            split = make_split(smiles, cfg.split, seed)
        target = None if save_dir is None else Path(save_dir) / f"seed{seed}"
        results.append(finetune_once(df, split, cfg, seed, backbone, target, inputs))
        r = results[-1]
        log.info("%s seed %d: valid %.2f test %.2f", r.dataset, seed, r.valid, r.test)
    return results


def save_finetuned(model, tokenizer, directory: Path, meta: dict[str, Any]) -> Path:
    from safetensors.torch import save_file

    directory = Path(directory)
    model.model.save_pretrained(directory, tokenizer=tokenizer)
    head = {k: v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()}
    save_file(head, str(directory / HEAD_NAME), metadata={"format": "pt"})
    meta = meta | {"pooling": model.pooling, "n_outputs": int(head["out_proj.bias"].shape[0])}
    (directory / META_NAME).write_text(json.dumps(meta, indent=1))
    return directory


def load_finetuned(directory: Path | str, device: str = "auto"):
    """(model, tokenizer, meta) from a folder written by ``finetune`` (see module docstring)."""
    from safetensors.torch import load_file

    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel
    from smiexlm.tokenizer import SmilesTokenizer

    directory = Path(directory)
    if not (directory / META_NAME).is_file():
        raise DataError(
            f"--checkpoint {str(directory)!r}: no {META_NAME}; expected a folder written by "
            "`smiexlm finetune --save-dir` (e.g. runs/finetune/bbbp/seed0)"
        )
    meta = json.loads((directory / META_NAME).read_text())
    head_type = "multilabel" if meta["task_type"] == "classification" else "regression"
    model = ExLMForSequencePrediction(
        ExLMModel.from_pretrained(directory), meta["n_outputs"], head_type, 0.0, meta["pooling"]
    )
    model.head.load_state_dict(load_file(str(directory / HEAD_NAME)))
    return (
        model.to(resolve_device(device)).eval(),
        SmilesTokenizer.load(directory / "vocab.json"),
        meta,
    )


def predict(checkpoint: Path | str, smiles: Sequence[str], batch_size: int = 256) -> pd.DataFrame:
    """Predictions per input SMILES: probabilities (classification) or values (regression).

    Unparsable SMILES get NaN rows and ``valid = False``, never silently dropped.
    """
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    model, tokenizer, meta = load_finetuned(checkpoint)
    device = next(model.parameters()).device
    ok = [Chem.MolFromSmiles(s) is not None for s in smiles]
    good = [s for s, v in zip(smiles, ok, strict=True) if v]
    cfg = meta["config"]
    inputs = canonical_smiles(good) if cfg.get("canonicalize", True) else good
    rows, _ = encode_rows(tokenizer, inputs, cfg.get("max_length", 256))
    mean = np.asarray(meta["target_mean"], dtype=np.float32)
    std = np.asarray(meta["target_std"], dtype=np.float32)
    values = _to_scores(predict_rows(model, rows, batch_size, device), meta["task_type"], mean, std)
    out = np.full((len(smiles), len(meta["label_cols"])), np.nan)
    out[np.asarray(ok, dtype=bool)] = values
    frame = pd.DataFrame(out, columns=meta["label_cols"])
    frame.insert(0, "valid", ok)
    frame.insert(0, "smiles", list(smiles))
    return frame
