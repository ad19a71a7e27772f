"""GLUE fine-tuning of a pre-trained checkpoint with the model core's sequence head.

One run = one (task, hyper-parameters, seed): the encoder is loaded fresh from the
checkpoint, ``ExLMForSequencePrediction`` adds the head (classification, or regression with
one output for STS-B), and :func:`smiexlm.finetuning.fit` trains it with RoBERTa's GLUE
settings (AdamW β = (0.9, 0.98), eps 1e-6, weight decay 0.1 on matrices, linear warmup then
linear decay to 0, no clipping) and scores the dev split after every epoch. A task result is
the **median over seeds** (5 by default, as in the paper) of the end-of-training dev scores
(``select="last"``: the dev split is the reported one, so it picks no epoch).

Table 11 of the paper is :func:`table11_grid` (read from ``configs/finetune/glue.toml`` on
first use); :func:`grid_search` runs every point of it (5 seeds each) on the task loaded and
tokenised once, and keeps the point with the best median primary metric. On CPU use
``max_steps`` / ``max_train_rows`` to keep runs small.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import statistics
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smiexlm.device import resolve_device
from smiexlm.errors import ConfigError, check_fraction, check_positive_int
from smiexlm.glue.metrics import compute_metrics, majority_baseline
from smiexlm.glue.tasks import GlueSplit, GlueTask, get_task, load_task
from smiexlm.moleculenet.task import check_seeds
from smiexlm.paths import PACKAGE_DIR, check_output, file_sha256, write_json
from smiexlm.training.workers import set_threads

CONFIG_PATH = PACKAGE_DIR / "configs" / "finetune" / "glue.toml"


@functools.cache
def glue_settings() -> dict[str, Any]:
    """``configs/finetune/glue.toml``: the shared ``defaults`` and Table 11's ``grid``."""
    with open(CONFIG_PATH, "rb") as handle:
        return tomllib.load(handle)


def table11_grid() -> dict[str, dict[str, tuple]]:
    """Table 11's search space: ``large`` (MNLI, QNLI, QQP, SST-2) and ``small`` (RTE, MRPC,
    CoLA, STS-B, and WNLI, not in the paper's table)."""
    return {
        size: {key: tuple(values) for key, values in grid.items() if key != "tasks"}
        for size, grid in glue_settings()["grid"].items()
    }


def grid_points(task: str | GlueTask) -> list[dict[str, Any]]:
    """Every hyper-parameter combination of Table 11 for ``task``."""
    task = task if isinstance(task, GlueTask) else get_task(task)
    large = task.name in glue_settings()["grid"]["large"]["tasks"]
    grid = table11_grid()["large" if large else "small"]
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
    # None = the shared setting of glue.toml's [defaults]
    seeds: tuple[int, ...] | None = None  # the paper's 5
    weight_decay: float | None = None
    adam_betas: tuple[float, float] | None = None
    adam_eps: float | None = None
    clip_norm: float | None = None  # 0 = no clipping
    pooler_dropout: float | None = None
    max_length: int | None = None  # tokens incl. specials; longer pairs truncated
    max_steps: int | None = None  # cap on updates per run (small CPU runs)
    max_train_rows: int | None = None  # first N training rows only (small CPU runs)
    max_eval_rows: int | None = None
    eval_split: str = "dev"
    threads: int | None = None  # torch.set_num_threads; None leaves it
    device: str = "auto"  # auto (CUDA when available) | cpu | cuda[:N]; bf16 autocast on CUDA

    def __post_init__(self) -> None:
        defaults = glue_settings()["defaults"]
        for name in ("seeds", "weight_decay", "adam_betas", "adam_eps", "clip_norm",
                     "pooler_dropout", "max_length"):  # fmt: skip
            if getattr(self, name) is None:
                setattr(self, name, defaults[name])
        self.task = get_task(self.task).name
        self.seeds = tuple(int(s) for s in self.seeds)
        self.adam_betas = tuple(float(b) for b in self.adam_betas)
        if not self.seeds:
            raise ConfigError("seeds", self.seeds, "at least one seed")
        check_seeds(self.seeds)  # distinct: a repeated one would count its run twice
        resolve_device(self.device)  # an unknown device or missing CUDA fails here, early
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ConfigError("lr", self.lr, "a positive number")
        for name in ("batch_size", "epochs", "max_length"):
            check_positive_int(name, getattr(self, name))
        if self.max_length < 8:
            raise ConfigError("max_length", self.max_length, "at least 8")
        check_fraction("warmup_ratio", self.warmup_ratio)
        for name in ("max_steps", "max_train_rows", "max_eval_rows", "threads"):
            check_positive_int(name, getattr(self, name), optional=True)

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
    extra: dict[str, Any] = field(default_factory=dict)  # vocabulary, objective, data sha256
    spread: dict[str, tuple[float, float]] = field(default_factory=dict)  # (min, max) over seeds

    @property
    def score(self) -> float:
        """Median of the task's primary metric (the paper's number, as a fraction)."""
        return self.median[get_task(self.task).primary_metric]

    def summary(self) -> str:
        """One line: the medians, each with its range over seeds, next to the majority-class
        baseline."""

        def one(metric: str, value: float) -> str:
            low, high = self.spread.get(metric, (value, value))
            return f"{metric} {100 * value:.1f} [{100 * low:.1f}, {100 * high:.1f}]"

        shown = "  ".join(one(k, v) for k, v in self.median.items())
        base = "  ".join(f"{k} {100 * v:.1f}" for k, v in self.majority.items())
        return (
            f"{self.task}: {shown}  (majority: {base}; {len(self.runs)} seeds, n_dev={self.n_eval})"
        )

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
    from smiexlm.finetuning import Examples, FitRun, LoopConfig, fit
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel

    torch.manual_seed(seed)
    encoder = ExLMModel(model_config)
    encoder.load_state_dict(base_state)
    task_type = "regression" if task.is_regression else "multiclass"
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

    fitted = fit(model, Examples(train_rows, labels), Examples(eval_rows), loop, primary,
                 FitRun(seed, progress, f"{task.name} seed {seed}"))  # fmt: skip
    history = [record | scores[i] for i, record in enumerate(fitted.history)]
    return GlueRun(seed, dict(scores[-1]), history, fitted.steps, fitted.seconds)


def _clean(scores: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in scores.items() if k not in ("epoch", "step", "train_loss")}


@dataclass
class _PreparedTask:
    """A GLUE task tokenised for one checkpoint: what every seed and grid point shares."""

    task: GlueTask
    checkpoint: str
    base_state: dict[str, torch.Tensor]
    model_config: Any
    train_rows: list[list[int]]
    train_labels: list
    eval_rows: list[list[int]]
    eval_labels: list
    majority: dict[str, float]
    extra: dict[str, Any]

    @classmethod
    def load(cls, checkpoint: str | Path, config: GlueConfig, root: str | Path | None):
        from smiexlm.modelio.pretrained import load_pretrained

        task = get_task(config.task)
        pre = load_pretrained(checkpoint)
        if not hasattr(pre.tokenizer, "encode_pair"):
            raise ConfigError("--checkpoint", str(checkpoint), "a text model (GLUE reads "
                              "sentences: pretrain one with a text_* config, docs/text_glue.md), "
                              f"not a {type(pre.tokenizer).__name__} model")  # fmt: skip
        train = load_task(task.name, "train", root).subset(config.max_train_rows)
        evaluation = load_task(task.name, config.eval_split, root).subset(config.max_eval_rows)
        if evaluation.labels is None:
            raise ConfigError("eval_split", config.eval_split, "a split with labels (dev)")
        max_length = min(config.max_length, pre.model.config.max_positions)
        return cls(
            task, str(checkpoint), {k: v.clone() for k, v in pre.model.state_dict().items()},
            pre.model.config, _encode(pre.tokenizer, train, max_length), train.labels,
            _encode(pre.tokenizer, evaluation, max_length), evaluation.labels,
            majority_baseline(task, train.labels, evaluation.labels),
            {"vocab_hash": pre.tokenizer.vocab_hash, "objective": pre.model.config.objective,
             "train_sha256": file_sha256(train.path), "eval_sha256": file_sha256(evaluation.path)},
        )  # fmt: skip

    def run(self, config: GlueConfig, progress: bool) -> GlueResult:
        """Every seed of one hyper-parameter point; medians over seeds."""
        runs = []
        for seed in config.seeds:
            run = finetune_seed(
                self.base_state, self.model_config, self.task, config, seed, self.train_rows,
                self.train_labels, self.eval_rows, self.eval_labels, progress,
            )  # fmt: skip
            run.metrics = _clean(run.metrics)
            runs.append(run)
        scores = {m: [r.metrics[m] for r in runs] for m in runs[0].metrics}
        return GlueResult(
            task=self.task.name, config=config.to_dict(), runs=runs,
            median={m: float(statistics.median(v)) for m, v in scores.items()},
            majority=self.majority, n_train=len(self.train_rows), n_eval=len(self.eval_rows),
            checkpoint=self.checkpoint, extra=dict(self.extra),
            spread={m: (float(min(v)), float(max(v))) for m, v in scores.items()},
        )  # fmt: skip


def run_glue(
    checkpoint: str | Path,
    config: GlueConfig,
    root: str | Path | None = None,
    progress: bool = True,
) -> GlueResult:
    """Fine-tune ``checkpoint`` on ``config.task`` for every seed; medians over seeds."""
    if config.threads is not None:
        set_threads(config.threads, "--threads")
    return _PreparedTask.load(checkpoint, config, root).run(config, progress)


def grid_search(
    checkpoint: str | Path,
    config: GlueConfig,
    root: str | Path | None = None,
    progress: bool = True,
) -> GlueResult:
    """Every point of Table 11 (each with ``config.seeds``) on the task loaded and tokenised
    once; the best median primary score wins. The other points' medians are kept in
    ``extra["grid"]``."""
    if config.threads is not None:
        set_threads(config.threads, "--threads")
    prepared = _PreparedTask.load(checkpoint, config, root)
    best, table = None, []
    for point in grid_points(prepared.task):
        result = prepared.run(dataclasses.replace(config, **point), progress)
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


def run_tasks(
    task: str,
    checkpoint: str | Path,
    settings: dict[str, Any],
    grid: bool = False,
    out: Path | None = None,
    root: str | Path | None = None,
) -> Iterator[tuple[str, GlueResult | None, str | None]]:
    """``(name, result, None)`` per task of ``task`` ("all": every task whose train and dev
    files are present; the others give ``(name, None, why)``); ``settings`` are the
    :class:`GlueConfig` fields besides the task; ``grid`` searches Table 11; each result is
    saved to ``out/NAME.json`` when ``out`` is given."""
    from smiexlm.glue.tasks import TASKS, task_path

    if out is not None:
        out = check_output(out, "--out", kind="folder")  # before any training
    every = task.lower() == "all"
    for name in list(TASKS) if every else [get_task(task).name]:
        spec = get_task(name)
        missing = [s for s in ("train", "dev") if not task_path(spec, s, root).is_file()]
        if every and missing:
            yield name, None, f"skipped, no {', '.join(spec.files[s] for s in missing)}"
            continue
        config = GlueConfig(name, **settings)
        result = (grid_search if grid else run_glue)(checkpoint, config, root)
        if out is not None:
            save_result(result, Path(out) / f"{name}.json")
        yield name, result, None
