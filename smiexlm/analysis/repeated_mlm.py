"""Repeated MLM (ExLM §3, Appendices B–G) on SMILES: corrupted semantics vs unreal tokens.

For every cell (k, p) of the grid:

1. **Data.** Every ordinary token of the pre-training set is repeated k times in place
   (BOS/EOS kept once), written as a dataset folder next to the run (same vocabulary).
2. **Pre-training.** The project's trainer (:func:`smiexlm.pretraining.pretrain`) trains an MLM
   on it with mask probability p; every other setting is the same across cells except
   ``max_positions`` (× k, as the paper's 512·k) and the token budget (× k, so a step sees
   as many molecules whatever k, like the paper's batch of samples).
3. **Corrupted semantics.** Held-out molecules (the dataset's valid split) are repeated and
   masked with ``mask_tokens`` at p; the measured share of original tokens with all k copies
   masked is reported next to p^k and Appendix C's standard deviation √(p^k(1−p^k)/N).
4. **Entropy.** Mean prediction entropy in bits over fully masked tokens only, each token
   the mean over its k copies (Appendix E.1's filter).
5. **Downstream.** BBBP fine-tuning with a shortened schedule through
   :func:`smiexlm.finetuning.adapter.finetune_once` (deterministic scaffold split); the
   inputs are repeated k times as in pre-training (Appendix B.2).

Cells whose p^k is below ``min_ratio`` are left blank, as the paper's grey cells.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn

from smiexlm.analysis import cells, measures
from smiexlm.analysis.plots import plot_repeated_mlm
from smiexlm.analysis.report import write_rows
from smiexlm.data.collate import collate
from smiexlm.data.shards import TokenDataset, write_shard
from smiexlm.errors import ConfigError, DataError
from smiexlm.finetuning.adapter import finetune_once
from smiexlm.finetuning.backbone import Backbone
from smiexlm.finetuning.config import finetune_config
from smiexlm.model.expansion import repeat_layout
from smiexlm.model.masking import mask_tokens, repeat_tokens
from smiexlm.moleculenet import MoleculeTask, load_task
from smiexlm.moleculenet.splits import make_split
from smiexlm.paths import VOCAB_NAME, write_json
from smiexlm.pretraining.config import load_config
from smiexlm.pretraining.trainer import pretrain
from smiexlm.tokenizer.special import IGNORE_INDEX, N_SPECIAL_TOKENS
from smiexlm.training.run_state import latest_checkpoint


@dataclass
class RepeatedMLMConfig:
    """The grid and the shared recipe of every cell."""

    ks: tuple[int, ...] = (1, 2, 4)
    ps: tuple[float, ...] = (0.15, 0.387, 0.622)
    # Cells with p^k below this are skipped (the paper blanks those ≤ 0.05 %).
    min_ratio: float = 0.001
    # A shipped pre-training config name or a TOML path, plus key=value overrides.
    train_config: str = "mol_tiny_mlm"
    overrides: tuple[str, ...] = ()
    steps: int = 2000
    max_molecules: int | None = 100_000  # training molecules repeated per cell (None = all)
    eval_molecules: int = 1000  # held-out molecules for the ratio and the entropy
    eval_batch_size: int = 64
    downstream: bool = True
    bbbp_epochs: int = 5
    bbbp_max_steps: int | None = None
    bbbp_rows: int | None = None  # a seeded subset of BBBP (None = all 2039 rows)
    bbbp_seeds: tuple[int, ...] = (0,)
    seed: int = 0
    device: str = "auto"
    keep_data: bool = False  # keep the repeated dataset folders

    def __post_init__(self) -> None:
        self.ks, self.ps = tuple(self.ks), tuple(self.ps)
        if not self.ks or any(not isinstance(k, int) or k < 1 for k in self.ks):
            raise ConfigError("k", self.ks, "positive integers")
        if not self.ps or any(not 0.0 < p < 1.0 for p in self.ps):
            raise ConfigError("p", self.ps, "mask probabilities in (0, 1)")
        for name in ("steps", "eval_molecules", "eval_batch_size", "bbbp_epochs"):
            if getattr(self, name) < 1:
                raise ConfigError(name, getattr(self, name), "a positive integer")
        if not 0.0 <= self.min_ratio < 1.0:
            raise ConfigError("min_ratio", self.min_ratio, "a fraction in [0, 1)")
        if not self.cells():
            raise ConfigError("k/p", (self.ks, self.ps), f"at least one cell whose p^k reaches "
                              f"--min-ratio {self.min_ratio} (every one would be skipped)")  # fmt: skip

    def cells(self) -> list[tuple[int, float]]:
        return [
            (k, p)
            for k in self.ks
            for p in self.ps
            if measures.expected_corrupted_ratio(p, k) >= self.min_ratio
        ]


@dataclass
class RepeatedMLMResult:
    rows: list[dict[str, Any]]
    config: dict[str, Any]
    files: list[Path] = field(default_factory=list)

    def table(self, column: str) -> dict[str, dict[str, Any]]:
        """{k: {p: value}}: the layout of Figures 3–5 (rows k, columns p)."""
        out: dict[str, dict[str, Any]] = {}
        for row in self.rows:
            out.setdefault(str(row["k"]), {})[f"{row['p']:g}"] = row.get(column)
        return out

    def findings(self) -> dict[str, Any]:
        """Spread of each figure along constant p^k vs constant p (§3.2's comparison)."""
        return {col: spreads(self.rows, col) for col in ("bbbp_test_auc", "entropy_bits")}


# ----------------------------------------------------------------------- repetition
def repeat_with_sources(ids: Tensor, mask: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """``repeat_tokens`` plus the original column of every position: (B, Lx) ×3."""
    mask = mask.bool()
    counts = torch.where(mask & (ids >= N_SPECIAL_TOKENS), k, 1) * mask  # (B, T)
    source, _, valid = repeat_layout(counts)
    rep_ids, rep_mask = repeat_tokens(ids, mask, k)
    return rep_ids, rep_mask, source.masked_fill(~valid, 0)


def repeat_array(row: np.ndarray, k: int) -> np.ndarray:
    """One uint16 row with every ordinary token repeated k times (BOS/EOS/UNK once)."""
    return np.repeat(row, np.where(row >= N_SPECIAL_TOKENS, k, 1)).astype(np.uint16)


def write_repeated_dataset(
    source: Path, out: Path, k: int, max_molecules: int | None = None
) -> Path:
    """A dataset folder (same format and vocabulary) whose molecules are repeated k times."""
    source, out = Path(source), Path(out)
    manifest = json.loads((source / "manifest.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split in ("train", "valid"):
        if split not in manifest.get("splits", {}):
            continue
        data = TokenDataset(source, split=split)
        n = (
            len(data)
            if max_molecules is None or split == "valid"
            else min(len(data), max_molecules)
        )
        rows = [repeat_array(data[i], k) for i in range(n)]
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        ids = np.concatenate(rows) if rows else np.zeros(0, np.uint16)
        hashes = np.array(
            [int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest(), "little")
             for r in rows], dtype=np.uint64,
        )  # fmt: skip
        info = write_shard(out, f"{split}-00000", ids, lengths, hashes)
        splits[split] = {"molecules": n, "tokens": int(lengths.sum()), "shards": [info.to_dict()]}
    shutil.copyfile(source / VOCAB_NAME, out / VOCAB_NAME)
    doc = {
        k_: manifest[k_] for k_ in ("format", "dtype", "vocab_hash", "vocab_size") if k_ in manifest
    }
    doc.update(splits=splits, repeated_from=str(source), repeat_k=k)
    write_json(doc, out / "manifest.json")
    return out


# ----------------------------------------------------------------------- measures
@torch.no_grad()
def measure_cell(
    model, items: list[np.ndarray], k: int, p: float, seed: int, batch_size: int = 64
) -> dict[str, Any]:
    """Corrupted-semantics ratio, Appendix-E entropy and mask accuracy on ``items``."""
    model.eval()
    device = next(model.parameters()).device
    n_tokens = n_fully = 0
    entropies, correct, n_masked = [], 0, 0
    for b in range(0, len(items), batch_size):
        ids, mask = collate(items[b : b + batch_size])  # (B, T)
        counted = mask & (ids >= N_SPECIAL_TOKENS)  # original ordinary tokens
        rep, rep_mask, source = repeat_with_sources(ids, mask, k)  # (B, Lx)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + b)
        masked, labels = mask_tokens(rep, rep_mask, mask_prob=p, generator=gen)
        selected = labels != IGNORE_INDEX
        fully, _ = measures.fully_masked_tokens(selected, source, rep_mask, ids.shape[1])
        n_tokens += int(counted.sum())
        n_fully += int((fully & counted).sum())
        logits = model(masked.to(device), rep_mask.to(device)).logits.cpu()  # (B, Lx, V)
        h = measures.prediction_entropy_bits(logits)  # (B, Lx)
        entropies.append(measures.token_entropy_bits(h, selected, source, rep_mask, counted))
        correct += int((logits.argmax(-1) == labels)[selected].sum())
        n_masked += int(selected.sum())
    ent = torch.cat(entropies).double()
    expected = measures.expected_corrupted_ratio(p, k)
    return {
        "unreal_ratio": p,
        "expected_corrupted": expected,
        "measured_corrupted": n_fully / max(n_tokens, 1),
        "corrupted_std": math.sqrt(measures.corrupted_ratio_variance(p, k, max(n_tokens, 1))),
        "n_tokens": n_tokens,
        "n_fully_masked": n_fully,
        "entropy_bits": float(ent.mean()) if len(ent) else math.nan,
        "mask_accuracy": correct / max(n_masked, 1),
    }


def spreads(rows: list[dict[str, Any]], column: str) -> dict[str, float | None]:
    """Mean range of ``column`` within groups of equal p^k (5 % tolerance) and of equal p.

    The paper's reading: a small spread at constant corruption and a large one at constant
    mask ratio means corrupted semantics matter more than unreal tokens."""

    def mean_range(groups: list[list[float]]) -> float | None:
        ranges = [max(g) - min(g) for g in groups if len(g) > 1]
        return float(np.mean(ranges)) if ranges else None

    vals = [(r["p"], r["expected_corrupted"], r.get(column)) for r in rows]
    vals = [(p, q, v) for p, q, v in vals if v is not None and math.isfinite(v)]
    by_ratio: list[tuple[float, list[float]]] = []
    for _, q, v in sorted(vals, key=lambda t: t[1]):
        if by_ratio and abs(q - by_ratio[-1][0]) <= 0.05 * by_ratio[-1][0]:
            by_ratio[-1][1].append(v)
        else:
            by_ratio.append((q, [v]))
    by_p: dict[float, list[float]] = {}
    for p, _, v in vals:
        by_p.setdefault(p, []).append(v)
    return {
        "spread_at_equal_corruption": mean_range([g for _, g in by_ratio]),
        "spread_at_equal_mask_ratio": mean_range(list(by_p.values())),
    }


# ----------------------------------------------------------------------- downstream
class RepeatedInputEncoder(nn.Module):
    """An encoder whose ``encode`` repeats every ordinary token k times first (App. B.2)."""

    def __init__(self, model, k: int):
        super().__init__()
        self.model, self.k, self.config = model, k, model.config

    def encode(
        self, input_ids: Tensor, attention_mask: Tensor, pooling="cls", layer: int = -1,
        pooled_only: bool = False,
    ):  # fmt: skip
        ids, mask = repeat_tokens(input_ids, attention_mask, self.k, pad_id=self.config.pad_id)
        return self.model.encode(ids, mask, pooling=pooling, layer=layer, pooled_only=pooled_only)

    def save_pretrained(self, directory, tokenizer=None, dtype=None):
        return self.model.save_pretrained(directory, tokenizer=tokenizer, dtype=dtype)


def _repeated_backbone(checkpoint: Path, k: int):
    class RepeatedBackbone(Backbone):
        def build(self, tokenizer, dropout: float):
            return RepeatedInputEncoder(super().build(tokenizer, dropout), k)

    return RepeatedBackbone(checkpoint=Path(checkpoint))


def bbbp_task(rows: int | None, seed: int) -> MoleculeTask:
    """BBBP as the MoleculeNet loader gives it, or a seeded subset of ``rows`` molecules
    (the rows ``DataFrame.sample(n=rows, random_state=seed)`` picks)."""
    task = load_task("bbbp", allow_download=False)
    if rows is not None and rows < len(task):
        picked = pd.RangeIndex(len(task)).to_series().sample(n=rows, random_state=seed)
        task = task.subset(picked.tolist())
    return task


def downstream_bbbp(checkpoint: Path, k: int, config: RepeatedMLMConfig, task: MoleculeTask) -> dict[str, Any]:  # fmt: skip
    """Mean valid/test ROC-AUC (×100) over ``bbbp_seeds`` on the deterministic scaffold split."""
    cfg = finetune_config(
        "bbbp", epochs=config.bbbp_epochs, max_train_steps=config.bbbp_max_steps,
        device=config.device, split="scaffold", forest="none",  # the model's own score
    )  # fmt: skip
    split = make_split(task.smiles, "scaffold", config.seed)
    backbone = _repeated_backbone(checkpoint, k)
    runs = [finetune_once(task, split, cfg, seed, backbone) for seed in config.bbbp_seeds]
    return {
        "bbbp_valid_auc": float(np.mean([r.valid for r in runs])),
        "bbbp_test_auc": float(np.mean([r.test for r in runs])),
        "bbbp_split": f"{split.label} {split.sizes}",
    }


# ----------------------------------------------------------------------- the grid
def run_repeated_mlm(data_dir: Path, out_dir: Path, config: RepeatedMLMConfig,
                     resume: bool = False) -> RepeatedMLMResult:  # fmt: skip
    """Train and measure every cell; writes ``repeated_mlm.{csv,json,png}`` into ``out_dir``.
    Each finished cell keeps its row (:mod:`smiexlm.analysis.cells`): a folder holding one is
    refused unless ``resume``, which reads the finished cells back and trains the others."""
    from tqdm.auto import tqdm

    data_dir, out_dir = Path(data_dir), Path(out_dir)
    if not (data_dir / "manifest.json").is_file():
        raise DataError(
            f"--data {str(data_dir)!r}: no manifest.json; expected a dataset folder written by "
            "`smiexlm preprocess`"
        )
    if not resume:
        cells.check_fresh(out_dir, config.cells())
    try:
        valid = TokenDataset(data_dir, split="valid")
    except ConfigError:
        valid = TokenDataset(data_dir, split="train")
    if len(valid) == 0:
        valid = TokenDataset(data_dir, split="train")
    items = [valid[i] for i in range(min(len(valid), config.eval_molecules))]
    task = bbbp_task(config.bbbp_rows, config.seed) if config.downstream else None
    rows, grid = [], cells.identity(config, data_dir)
    for k, p in tqdm(config.cells(), desc="repeated MLM", unit="cell"):
        made_as = grid | {"k": k, "p": p}
        row = cells.finished_row(out_dir, k, p, made_as)
        if row is None:
            row = _train_cell(data_dir, cells.cell_dir(out_dir, k, p), k, p, config, items, task)
            cells.keep_row(out_dir, k, p, made_as, row)
        rows.append(row)
    result = RepeatedMLMResult(rows, _config_doc(config, data_dir))
    write_repeated_mlm(result, out_dir)
    return result


def _train_cell(data_dir: Path, cell: Path, k: int, p: float, config: RepeatedMLMConfig,
                items: list, task: MoleculeTask | None) -> dict[str, Any]:  # fmt: skip
    """One cell from its start: its repeated data, its MLM, its measures and its BBBP score."""
    data = write_repeated_dataset(data_dir, cell / "data", k, config.max_molecules)
    train = load_config(config.train_config, list(config.overrides))
    positions = train.model.config.max_positions
    repeated = dict(objective="mlm", mask_prob=p, mask_policy="all_mask")
    overrides = {**train.model.overrides, **repeated, "max_positions": positions * k}
    train.model = dataclasses.replace(train.model, overrides=overrides)
    train.max_tokens *= k
    train.seed, train.device = config.seed + 1, config.device
    run = cell / "run"
    resume = latest_checkpoint(run) is not None  # a cell stopped mid-run goes on from it
    if run.is_dir() and not resume:  # stopped before its first checkpoint: trained again
        shutil.rmtree(run)
    result = pretrain(train, data, run, max_steps=config.steps, resume=resume)
    if result.interrupted_by is not None:  # no record: the next run goes on from its checkpoint
        raise SystemExit(f"analyze repeated-mlm: cell k={k} p={p:g} stopped by "
                         f"{result.interrupted_by} at step {result.step}; the same command with "
                         "--resume goes on from its last checkpoint")  # fmt: skip
    row: dict[str, Any] = {"k": k, "p": p}
    row |= measure_cell(result.model, items, k, p, config.seed, config.eval_batch_size)
    row |= {"train_loss": result.last_loss, "valid_loss": result.last_valid_loss}
    checkpoint = cell / "run" / "checkpoints" / "last"
    if task is not None:
        row |= downstream_bbbp(checkpoint, k, config, task)
    row["checkpoint"] = str(checkpoint)
    if not config.keep_data:
        shutil.rmtree(data)
    return row


def _config_doc(config: RepeatedMLMConfig, data_dir: Path) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(config) | {"data": str(data_dir)}


def write_repeated_mlm(result: RepeatedMLMResult, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    curves = {
        f"k={r['k']} p={r['p']:g}": Path(r["checkpoint"]).parents[1] / "metrics.jsonl"
        for r in result.rows
    }
    doc = {
        "analysis": "repeated-mlm",
        "config": result.config,
        "figure3_bbbp_test_auc": result.table("bbbp_test_auc"),
        "figure4_corrupted_measured": result.table("measured_corrupted"),
        "figure4_corrupted_expected": result.table("expected_corrupted"),
        "figure5_entropy_bits": result.table("entropy_bits"),
        "findings": result.findings(),
        "rows": result.rows,
    }
    result.files = [
        write_rows(result.rows, out_dir / "repeated_mlm.csv"),
        write_json(doc, out_dir / "repeated_mlm.json"),
        plot_repeated_mlm(result, curves, out_dir / "repeated_mlm.png"),
    ]
    return result.files
