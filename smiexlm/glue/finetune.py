"""GLUE fine-tuning of a pre-trained checkpoint with the model core's sequence head.

One run = one (task, hyper-parameters, seed): the encoder is loaded fresh from the
checkpoint, ``ExLMForSequencePrediction`` adds the head (classification, or regression with
one output for STS-B), and :func:`smiexlm.finetuning.fit` trains it with RoBERTa's GLUE
settings (AdamW β = (0.9, 0.98), eps 1e-6, weight decay 0.1 on matrices, linear warmup then
linear decay to 0, no clipping) and scores the dev split after every epoch. A task result is
the **median over seeds** (5 by default, as in the paper) of the end-of-training dev scores
(``select="last"``: the dev split is the reported one, so it picks no epoch).

Table 11 of the paper is :data:`TABLE11_GRID`; :func:`grid_search` runs every point of it
(5 seeds each) and keeps the point with the best median primary metric. On CPU use
``max_steps`` / ``max_train_rows`` to keep runs small.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smiexlm.device import resolve_device
from smiexlm.errors import ConfigError
from smiexlm.glue.metrics import compute_metrics, majority_baseline
from smiexlm.glue.tasks import GlueSplit, GlueTask, get_task, load_task
from smiexlm.paths import PACKAGE_DIR, write_json

CONFIG_PATH = PACKAGE_DIR / "configs" / "finetune" / "glue.toml"


with open(CONFIG_PATH, "rb") as _handle:
    _CONFIG = tomllib.load(_handle)
_DEFAULTS = _CONFIG["defaults"]
#: Table 11: grid search space, read from ``configs/finetune/glue.toml``. ``large``: MNLI,
#: QNLI, QQP, SST-2; ``small``: RTE, MRPC, CoLA, STS-B (and WNLI, not in the paper's table).
TABLE11_GRID: dict[str, dict[str, tuple]] = {
    size: {key: tuple(values) for key, values in grid.items() if key != "tasks"}
    for size, grid in _CONFIG["grid"].items()
}
LARGE_TASKS = tuple(_CONFIG["grid"]["large"]["tasks"])
PAPER_SEEDS = tuple(_DEFAULTS["seeds"])


def grid_points(task: str | GlueTask) -> list[dict[str, Any]]:
    """Every hyper-parameter combination of Table 11 for ``task``."""
    task = task if isinstance(task, GlueTask) else get_task(task)
    grid = TABLE11_GRID["large" if task.name in LARGE_TASKS else "small"]
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*grid.values())]


@dataclass
class GlueConfig:
    """Hyper-parameters of GLUE fine-tuning (defaults: one point of Table 11's small grid;
    the shared settings come from ``configs/finetune/glue.toml``)."""

    task: str
    lr: float = 2e-5
    batch_size: int = 16
    epochs: int = 10
    warmup_ratio: float = 0.06
    seeds: tuple[int, ...] = PAPER_SEEDS
    weight_decay: float = _DEFAULTS["weight_decay"]
    adam_betas: tuple[float, float] = tuple(_DEFAULTS["adam_betas"])
    adam_eps: float = _DEFAULTS["adam_eps"]
    clip_norm: float = _DEFAULTS["clip_norm"]  # 0 = no clipping
    pooler_dropout: float = _DEFAULTS["pooler_dropout"]
    max_length: int = _DEFAULTS["max_length"]  # tokens incl. specials; longer pairs truncated
    max_steps: int | None = None  # cap on updates per run (small CPU runs)
    max_train_rows: int | None = None  # first N training rows only (small CPU runs)
    max_eval_rows: int | None = None
    eval_split: str = "dev"
    threads: int | None = None  # torch.set_num_threads; None leaves it
    device: str = "auto"  # auto (CUDA when available) | cpu | cuda[:N]; bf16 autocast on CUDA

    def __post_init__(self) -> None:
        self.task = get_task(self.task).name
        self.seeds = tuple(int(s) for s in self.seeds)
        self.adam_betas = tuple(float(b) for b in self.adam_betas)
        if not self.seeds:
            raise ConfigError("seeds", self.seeds, "at least one seed")
        resolve_device(self.device)  # an unknown device or missing CUDA fails here, early
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ConfigError("lr", self.lr, "a positive number")
        for name in ("batch_size", "epochs", "max_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(name, value, "a positive integer")
        if self.max_length < 8:
            raise ConfigError("max_length", self.max_length, "at least 8")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError("warmup_ratio", self.warmup_ratio, "a fraction in [0, 1)")
        for name in ("max_steps", "max_train_rows", "max_eval_rows"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(name, value, "a positive integer or None")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "seeds": list(self.seeds)}


@dataclass
class GlueRun:
    """One seed: final dev scores and the per-epoch history."""

    seed: int
    metrics: dict[str, float]
    history: list[dict[str, Any]]
    steps: int
    seconds: float


@dataclass
class GlueResult:
    """All seeds of one task and hyper-parameter point, with medians."""

    task: str
    config: dict[str, Any]
    runs: list[GlueRun]
    median: dict[str, float]
    majority: dict[str, float]
    n_train: int
    n_eval: int
    checkpoint: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def score(self) -> float:
        """Median of the task's primary metric (the paper's number, as a fraction)."""
        return self.median[get_task(self.task).primary_metric]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _encode(tokenizer, split: GlueSplit, max_length: int) -> list[list[int]]:
    if split.text_b is None:
        return [
            tokenizer.encode(a, max_length=max_length, truncation="truncate") for a in split.text_a
        ]
    return [
        tokenizer.encode_pair(a, b, max_length=max_length, truncation="truncate")
        for a, b in zip(split.text_a, split.text_b, strict=True)
    ]


def predict(model, rows: list[list[int]], batch_size: int = 64) -> np.ndarray:
    """Logits (N, C) of ``rows`` in order (eval mode, on the model's device)."""
    from smiexlm.finetuning import Examples
    from smiexlm.finetuning import predict as engine_predict

    return engine_predict(model, Examples(rows), batch_size)


def finetune_seed(
    base_state: dict[str, torch.Tensor],
    model_config,
    task: GlueTask,
    config: GlueConfig,
    seed: int,
    train_rows: list[list[int]],
    train_labels: list,
    eval_rows: list[list[int]],
    eval_labels: list,
    progress: bool = True,
) -> GlueRun:
    """Fine-tune a fresh copy of the encoder for one seed and score it on the eval rows."""
    from smiexlm.finetuning import Examples, LoopConfig, fit
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel

    torch.manual_seed(seed)
    encoder = ExLMModel(model_config)
    encoder.load_state_dict(base_state)
    task_type = "regression" if task.is_regression else "classification"
    model = ExLMForSequencePrediction(
        encoder, task.num_labels, task_type=task_type, pooler_dropout=config.pooler_dropout
    )
    if task.is_regression:
        labels = torch.tensor(train_labels, dtype=torch.float32)[:, None]  # (N, 1)
    else:
        labels = torch.tensor(train_labels, dtype=torch.long)  # (N,)
    loop = LoopConfig(
        epochs=config.epochs, batch_size=config.batch_size, lr=config.lr,
        warmup_ratio=config.warmup_ratio, weight_decay=config.weight_decay,
        adam_betas=config.adam_betas, adam_eps=config.adam_eps, clip_norm=config.clip_norm,
        max_steps=config.max_steps, select="last", device=config.device,
    )  # fmt: skip
    scores: list[dict[str, float]] = []

    def primary(logits: np.ndarray) -> float:
        scores.append(compute_metrics(task, logits, eval_labels))
        return scores[-1][task.primary_metric]

    fitted = fit(model, Examples(train_rows, labels), Examples(eval_rows), loop, primary, seed,
                 progress, f"{task.name} seed {seed}")  # fmt: skip
    history = [record | scores[i] for i, record in enumerate(fitted.history)]
    return GlueRun(seed, dict(scores[-1]), history, fitted.steps, fitted.seconds)


def _clean(scores: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in scores.items() if k not in ("epoch", "step", "train_loss")}


def run_glue(
    checkpoint: str | Path,
    config: GlueConfig,
    root: str | Path | None = None,
    progress: bool = True,
) -> GlueResult:
    """Fine-tune ``checkpoint`` on ``config.task`` for every seed; medians over seeds."""
    from smiexlm.model.model import ExLMModel
    from smiexlm.tokenizer import load_tokenizer

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    task = get_task(config.task)
    base = ExLMModel.from_pretrained(checkpoint)
    tokenizer = load_tokenizer(Path(checkpoint))
    train = load_task(task.name, "train", root).subset(config.max_train_rows)
    evaluation = load_task(task.name, config.eval_split, root).subset(config.max_eval_rows)
    if evaluation.labels is None:
        raise ConfigError("eval_split", config.eval_split, "a split with labels (dev)")
    max_length = min(config.max_length, base.config.max_positions)
    train_rows = _encode(tokenizer, train, max_length)
    eval_rows = _encode(tokenizer, evaluation, max_length)
    state = {k: v.clone() for k, v in base.state_dict().items()}
    runs = []
    for seed in config.seeds:
        run = finetune_seed(
            state, base.config, task, config, seed, train_rows, train.labels,
            eval_rows, evaluation.labels, progress,
        )  # fmt: skip
        run.metrics = _clean(run.metrics)
        runs.append(run)
    median = {m: float(statistics.median(r.metrics[m] for r in runs)) for m in runs[0].metrics}
    return GlueResult(
        task=task.name,
        config=config.to_dict(),
        runs=runs,
        median=median,
        majority=majority_baseline(task, train.labels, evaluation.labels),
        n_train=len(train),
        n_eval=len(evaluation),
        checkpoint=str(checkpoint),
        extra={"vocab_hash": tokenizer.vocab_hash, "objective": base.config.objective},
    )


def grid_search(
    checkpoint: str | Path,
    config: GlueConfig,
    root: str | Path | None = None,
    progress: bool = True,
) -> GlueResult:
    """Every point of Table 11 (each with ``config.seeds``); the best median primary score
    wins. The other points' medians are kept in ``extra["grid"]``."""
    task = get_task(config.task)
    best, table = None, []
    for point in grid_points(task):
        result = run_glue(checkpoint, dataclasses.replace(config, **point), root, progress)
        table.append({**point, **result.median})
        if best is None or _better(result.score, best.score):
            best = result
    best.extra["grid"] = table
    return best


def _better(a: float, b: float) -> bool:
    return not math.isnan(a) and (math.isnan(b) or a > b)


def save_result(result: GlueResult, path: str | Path) -> Path:
    """Write the result as JSON (NaN written as null)."""
    return write_json(result.to_dict(), path)
