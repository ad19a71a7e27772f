"""The one fine-tuning loop: MoleculeNet, GLUE and a user's own CSV are thin adapters on it.

An adapter builds the model (an encoder + head whose forward takes ``input_ids``,
``attention_mask``, ``labels``, ``features`` or ``pooled`` and returns ``.loss``/``.logits``),
turns its data into :class:`~smiexlm.finetuning.batches.Examples` and gives a ``score``
function of the validation logits. :func:`fit` then does the rest, the same way for all:

- AdamW with pre-training's decay groups (``smiexlm.training.optim.adamw_with_decay_groups``), linear
  warmup then linear decay to 0 (``PolynomialDecaySchedule``, power 1);
- ``layer_decay`` < 1: layer-wise learning rates, the head's ``lr`` and each block below it
  ``layer_decay`` times the one above (``adamw_with_decay_groups``);
- gradient clipping (``clip_norm``; 0 = none);
- precision (``precision="auto"``, :data:`smiexlm.device.Precision`): bf16 autocast on CUDA,
  and on CPUs with native bf16 instructions (AVX512-BF16 or AMX), where it measured 1.3x
  faster than fp32 on BBBP with the same test score; fp32 on other CPUs, where bf16 is
  emulated. ``"bf16"`` forces it, ``"fp32"`` never;
- length-bucketed training batches, length-sorted evaluation under ``torch.inference_mode``
  (at most ``EVAL_MAX_TOKENS`` padded positions per batch); :func:`predict` serves in fp32
  unless told otherwise, so that an output does not depend on its batch;
- validation after every epoch; ``select="best"`` keeps the best epoch's weights (ties keep
  the earlier epoch), ``"last"`` the final ones; ``patience`` stops after that many epochs
  without a better validation score (None = run the whole schedule); ``on_epoch(epoch,
  score)`` is called after each validation, and an exception it raises (a search's
  ``optuna.TrialPruned``) ends the run there and propagates.

``ema_half_life=H`` (epochs; 0 = off) keeps an exponential moving average of the trainable
weights, updated after every step with the weight of an update halving every H epochs (and
a short warm-up, ``min(decay, (1 + t) / (10 + t))``, so the random head's start fades fast).
Validation, selection and the weights kept are the average's, not the raw ones': one run's
weights smoothed over its last epochs, at the cost of one copy of the trainable weights.

``head_epochs=E`` first trains the head alone for E epochs on the frozen encoder's features
(cached, as with ``freeze``), at ``head_lr`` decaying linearly to 0, then the whole model
trains on the schedule as usual (LP-FT, Kumar et al., 2022: a random head's first gradients
pull the pretrained features towards itself; a fitted head leaves them less to undo). The
head-only stage draws its own batches and dropout, so the schedule that follows sees the
batches and masks it would have seen without it. It is validated as epoch 0, which selection
may keep.

Each epoch logs one line at INFO (``smiexlm.finetuning.engine``): the step, the training loss,
the validation score and the best so far, and the time left at the run's pace; a log file's
progress, beside the optional progress bar.

``freeze=True`` trains the head only: the encoder runs once, in eval mode, over every example,
and the head trains on those cached features (seconds instead of minutes).
``freeze_layers=N`` freezes the embeddings and the first N encoder blocks.

With ``state_dir``, the run's state is written there after every epoch
(:mod:`~smiexlm.finetuning.state`) and a run that finds one there goes on from it, to the
result it would have had without the stop. Under several processes (``torchrun``, or
``smiexlm finetune --processes N``) each computes its share of every batch
(:mod:`~smiexlm.finetuning.parallel`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from smiexlm.device import (
    autocast,
    resolve_device,
    resolved_precision,
)
from smiexlm.errors import ConfigError
from smiexlm.finetuning.batches import (
    Examples,
    bucketed_batches,
    to_batch,
)
from smiexlm.finetuning.inference import predict
from smiexlm.finetuning.loop_config import LoopConfig
from smiexlm.finetuning.parallel import Replicas, present_labels
from smiexlm.settings import recorded

log = logging.getLogger(__name__)


@dataclass
class FitResult:
    """What happened in one run; ``history`` has one record per epoch."""

    best_epoch: int
    best_valid: float
    epochs_run: int
    steps: int
    stopped_early: bool
    seconds: float
    cpu_seconds: float = 0.0  # process CPU time (all threads): robust to a busy machine
    precision: str = "fp32"  # what the run's precision resolved to: "bf16" or "fp32"
    history: list[dict[str, float]] = field(default_factory=list)
    resumed_seconds: float = 0.0  # wall seconds of the segments before a resume
    #: earlier precisions of a run resumed in another one: [precision, its last epoch] each
    precision_before: list[list] = field(default_factory=list)

    def precision_record(self) -> str:
        """The precision as reports say it: ``fp32``, or ``bf16 to epoch 21, then fp32``."""
        earlier = [f"{p} to epoch {last}" for p, last in self.precision_before]
        return ", then ".join([*earlier, self.precision])

    def summary(self) -> dict[str, Any]:
        return {
            "best_epoch": self.best_epoch,
            "epochs_run": self.epochs_run,
            "steps": self.steps,
            "stopped_early": self.stopped_early,
            "train_seconds": round(self.seconds, 2),
            "train_cpu_seconds": round(self.cpu_seconds, 2),
            "precision": self.precision_record(),
        } | ({"resumed_seconds": round(self.resumed_seconds, 2)} if self.resumed_seconds else {})


def freeze_encoder(model: nn.Module, n_layers: int | None) -> None:
    """Freeze ``model.model`` (an ExLMModel): all of it (``None``), or the embeddings and the
    first ``n_layers`` blocks."""
    encoder = model.model
    if n_layers is None:
        encoder.requires_grad_(False)
        return
    total = len(encoder.encoder.layers)
    if n_layers > total:
        raise ConfigError("freeze_layers", n_layers, f"at most the encoder's {total} layers")
    if n_layers:
        encoder.embed.requires_grad_(False)
        for block in encoder.encoder.layers[:n_layers]:
            block.requires_grad_(False)


def fit(
    model: nn.Module,
    train: Examples,
    valid: Examples | None,
    config: LoopConfig,
    score: Callable[[np.ndarray], float] | None,
    seed: int = 0,
    progress: bool = False,
    desc: str = "fine-tune",
    state_dir: Path | None = None,
    identity: dict[str, Any] | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
) -> FitResult:
    """Train ``model`` in place on ``train``; select on ``score(valid logits)`` per epoch.

    ``state_dir``: where the state is kept after every epoch, and resumed from when present;
    ``identity``: what else (data, backbone, features) a resumed run must share with the one
    that saved the state, beside the loop settings, the seed and the split sizes;
    ``on_epoch(epoch, valid score)``: called after each validation (epochs count from 1)."""
    run = _Fit(model, train, valid, config, score, seed)
    if state_dir is not None:
        run.keep_state(Path(state_dir), identity or {})
    return run.run(progress, desc, on_epoch)


class _Fit:
    """One :func:`fit` run in named steps: :meth:`_epoch` (one pass of :meth:`_update`),
    :meth:`_validate` (score and selection), :meth:`_patience_spent` (early stop),
    :meth:`_save` / :meth:`keep_state` (the state after each epoch) and :meth:`_select`
    (the weights kept)."""

    def __init__(self, model, train, valid, config: LoopConfig, score, seed: int):
        from smiexlm.training.optim import PolynomialDecaySchedule, adamw_with_decay_groups

        self.start, self.cpu_start = time.perf_counter(), time.process_time()
        self.before_s = self.before_cpu_s = 0.0  # spent by earlier segments of a resumed run
        torch.manual_seed(seed)
        self.device = resolve_device(config.device)
        model.to(self.device)
        self.replicas = Replicas.join(self.device)
        self.replicas.broadcast(model)
        self.replicas.seed_dropout(seed)
        if config.freeze:  # its features are computed once, when the run starts (:meth:`run`)
            freeze_encoder(model, None)
        elif config.freeze_layers:
            freeze_encoder(model, config.freeze_layers)
        self.model, self.train, self.valid, self.config = model, train, valid, config
        self.score = score
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = adamw_with_decay_groups(model, config.lr, config.weight_decay,
                                                 config.adam_betas, config.adam_eps,
                                                 config.layer_decay)  # fmt: skip
        total = config.epochs * math.ceil(len(train) / config.batch_size)
        if config.max_steps is not None:
            total = min(total, config.max_steps)
        self.total = total
        self.schedule = PolynomialDecaySchedule(config.lr, int(config.warmup_ratio * total), total)
        self.rng = np.random.default_rng(seed)
        self.result = FitResult(0, float("nan"), 0, 0, False, 0.0)
        self.result.precision = resolved_precision(self.device, config.precision)
        self.average = _Average.start(model, config, len(train))
        self.best_state: dict[str, torch.Tensor] | None = None
        self.since_best = 0  # epochs since the best validation score
        self.seed = seed
        self.state_dir: Path | None = None
        self.identity: dict[str, Any] = {}

    def run(self, progress: bool, desc: str, on_epoch: Callable | None = None) -> FitResult:
        from tqdm.auto import tqdm

        if self.config.freeze:  # the frozen encoder runs once, in eval mode and in the run's
            # precision (a resumed one's, see keep_state); the head trains on its features
            self.train = _cached(self.model, self.train, self.config)
            if self.valid is not None:
                self.valid = _cached(self.model, self.valid, self.config)
        self.lengths = self.train.lengths()
        result = self.result
        show = progress and self.replicas.is_main
        bar = tqdm(total=self.total, initial=result.steps, desc=desc, leave=False, unit="step",
                   disable=not show)  # fmt: skip
        with bar:  # closed too when on_epoch ends the run
            if self.config.head_epochs and not result.history:  # not again on a resume
                self._head_first(bar)
            first_step, started = result.steps, time.perf_counter()
            while result.steps < self.total and not result.stopped_early:
                record = self._epoch(bar)
                if self.valid is not None and self.score is not None:
                    self._validate(record, bar)
                result.history.append(record)
                if self.replicas.is_main:
                    self._log_epoch(desc, record, first_step, started)
                result.stopped_early = self._patience_spent()
                self.replicas.check_same_weights(self.model)
                self._save()
                if on_epoch is not None and "valid" in record:
                    on_epoch(result.epochs_run, record["valid"])
        self._select()
        result.seconds = self.before_s + time.perf_counter() - self.start
        own_cpu = time.process_time() - self.cpu_start
        (own_cpu,) = self.replicas.sum_floats([own_cpu])  # every process's CPU time
        result.cpu_seconds = self.before_cpu_s + own_cpu
        return result

    # ------------------------------------------------------------------ state per epoch
    def keep_state(self, folder: Path, identity: dict[str, Any]) -> None:
        """Save the state in ``folder`` after every epoch; go on from the one there now."""
        from smiexlm.finetuning.state import load_state
        from smiexlm.training.run_state import optimizer_from_tensors

        self.state_dir = folder
        loop = recorded(self.config.to_dict(), LoopConfig)
        self.identity = {
            "loop": loop, "seed": self.seed, "n_train": len(self.train),
            "n_valid": 0 if self.valid is None else len(self.valid),
            "processes": self.replicas.world,
        } | identity  # fmt: skip
        saved = load_state(folder, self.identity)
        if saved is None:
            return
        self.model.load_state_dict(saved.model)
        if self.average is not None:
            self.average.restore(saved.average, self.device)
        optimizer_from_tensors(self.optimizer, saved.optimizer, saved.state.optimizer_groups)
        self.best_state = None
        if saved.best is not None:
            self.best_state = {k: v.to(self.device) for k, v in saved.best.items()}
        torch.set_rng_state(saved.rng[self.replicas.rank])
        self.rng.bit_generator.state = saved.state.batch_rng
        progress = saved.state.progress
        self.before_s, self.before_cpu_s = progress["seconds"], progress["cpu_seconds"]
        self.result = FitResult(**progress | {"resumed_seconds": self.before_s})
        self._go_on_in(self.config.precision)
        self.since_best = saved.state.since_best

    def _go_on_in(self, asked: str) -> None:
        """The precision a resumed run goes on in: the one it trained in so far unless another
        is asked for by name ("auto" may resolve otherwise on this machine, and is no reason
        to change); a change is kept in :attr:`FitResult.precision_before`, so the run says
        it trained in both (a bf16 run stopped on a machine with native bf16 can go on in
        fp32 on one that only emulates it, at fp32's pace, not emulated bf16's)."""
        result = self.result
        now = result.precision if asked == "auto" else resolved_precision(self.device, asked)
        if now != result.precision:
            result.precision_before.append([result.precision, result.epochs_run])
            result.precision = now
        self.config = dataclasses.replace(self.config, precision=now)

    def _save(self) -> None:
        """The state after this epoch (rank 0 writes every process's generator)."""
        from smiexlm.finetuning.state import EpochState, save_state

        if self.state_dir is None:
            return
        rng = self.replicas.gather_rng()
        if not self.replicas.is_main:
            return
        result = self.result
        cpu = time.process_time() - self.cpu_start
        progress = dataclasses.asdict(result) | {
            "seconds": self.before_s + time.perf_counter() - self.start,
            "cpu_seconds": self.before_cpu_s + cpu * self.replicas.world,  # rank 0's, times N
        }
        state = EpochState(self.identity, progress, self.since_best,
                           self.rng.bit_generator.state, [])  # fmt: skip
        average = None if self.average is None else self.average.weights
        save_state(self.state_dir, self.model, self.optimizer, self.best_state, rng, state,
                   average)  # fmt: skip

    def _head_first(self, bar) -> None:
        """``head_epochs``: the head alone on the frozen encoder's cached features, with its
        own optimiser, batches and dropout stream (the same on every process), then validated
        as epoch 0."""
        from smiexlm.training.optim import (
            PolynomialDecaySchedule,
            adamw_with_decay_groups,
            set_lr,
        )

        config, model = self.config, self.model
        encoder_grads = [p.requires_grad for p in model.model.parameters()]
        model.model.requires_grad_(False)
        head = [p for p in model.parameters() if p.requires_grad]
        train = _cached(model, self.train, config)
        optimizer = adamw_with_decay_groups(  # over the head: the encoder is frozen here
            model, config.head_lr, config.weight_decay, config.adam_betas, config.adam_eps
        )
        steps = math.ceil(len(train) / config.batch_size)
        schedule = PolynomialDecaySchedule(config.head_lr, 0, config.head_epochs * steps)
        rng = np.random.default_rng((self.seed, 1))
        model.train()
        model.model.eval()
        losses, step = [], 0
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + 1)
            for _ in range(config.head_epochs):
                for index in np.array_split(rng.permutation(len(train)), steps):
                    set_lr(optimizer, schedule.lr_at(step))
                    optimizer.zero_grad(set_to_none=True)
                    loss = model(**to_batch(train, index, self.device, config.pad_id)).loss
                    loss.backward()
                    if config.clip_norm > 0:
                        nn.utils.clip_grad_norm_(head, config.clip_norm)
                    optimizer.step()
                    losses.append(loss.detach())
                    step += 1
        for param, grad in zip(model.model.parameters(), encoder_grads, strict=True):
            param.requires_grad_(grad)
        self.replicas.broadcast(model)
        if self.average is not None:  # it averages from the fitted head, not the random one
            self.average = _Average(model, self.average.decay)
        last = losses[-steps:]
        record = {"epoch": 0, "step": 0, "train_loss": float(torch.stack(last).mean())}
        if self.valid is not None and self.score is not None:
            self._validate(record, bar)
        self.result.history.append(record)

    def _epoch(self, bar) -> dict[str, float]:
        """One pass over the training batches, cut at the step budget; the epoch's record."""
        config, result = self.config, self.result
        result.epochs_run += 1
        self.model.train()
        if config.freeze:
            self.model.model.eval()  # no dropout inside a frozen encoder
        losses = []
        train, lengths = self.train, self.lengths
        if train.variants:  # this epoch's spelling of each example (augmentation)
            train = train.view(self.rng.integers(0, train.n_views, size=len(train)))
            lengths = train.lengths()
        batches = bucketed_batches(lengths, config.batch_size, self.rng, config.bucket_window)
        for index in batches:
            losses.append(self._update(train, index))
            result.steps += 1
            bar.update(1)
            if result.steps >= self.total:
                break
        total = float(torch.stack(losses).float().sum()) if losses else math.nan
        (total,) = self.replicas.sum_floats([total])
        train_loss = total / len(losses) if losses else math.nan
        return {"epoch": result.epochs_run, "step": result.steps, "train_loss": train_loss}

    def _update(self, train: Examples, index: np.ndarray) -> torch.Tensor:
        """One optimiser step on the batch ``index`` (this process's share of it); the share's
        (detached) loss, weighted so that the shares' losses sum to the batch's."""
        from smiexlm.training.optim import set_lr

        set_lr(self.optimizer, self.schedule.lr_at(self.result.steps))
        self.optimizer.zero_grad(set_to_none=True)
        share, weight = self.replicas.share(index), 1.0
        if self.replicas.world > 1 and train.targets is not None:
            targets = train.targets
            present = present_labels(targets[torch.from_numpy(index)])
            weight = present_labels(targets[torch.from_numpy(share)]) / max(present, 1)
        loss = torch.zeros(())
        if len(share):
            batch = to_batch(train, share, self.device, self.config.pad_id)
            with autocast(self.device, self.config.precision):
                loss = self.model(**batch).loss
            if weight != 1.0:
                loss = loss * weight
            loss.backward()
        self.replicas.sum_gradients(self.trainable)
        if self.config.clip_norm > 0:
            nn.utils.clip_grad_norm_(self.trainable, self.config.clip_norm)
        self.optimizer.step()
        if self.average is not None:
            self.average.update(self.result.steps)
        return loss.detach()

    def _validate(self, record: dict[str, float], bar) -> None:
        """Score the validation split into ``record``; keep the weights of a better epoch."""
        config, result, replicas = self.config, self.result, self.replicas
        n = len(self.valid)
        mine = (
            self.valid if replicas.world == 1 else self.valid.subset(replicas.share(np.arange(n)))
        )
        with _Average.swapped_in(self.average):
            logits = predict(self.model, mine, config.eval_batch_size, config.precision,
                             config.pad_id)  # fmt: skip
        logits = replicas.gather_rows(logits, n)
        record["valid"] = value = float(self.score(logits))
        improved = not math.isnan(value) and (
            math.isnan(result.best_valid) or self._better(value, result.best_valid)
        )
        if improved or self.best_state is None:
            result.best_valid, result.best_epoch, self.since_best = value, result.epochs_run, 0
            if config.select == "best":
                self.best_state = (
                    {n: p.detach().clone() for n, p in _trainable(self.model)}
                    if self.average is None
                    else {n: w.clone() for n, w in self.average.weights.items()}
                )
        else:
            self.since_best += 1
        bar.set_postfix(valid=f"{value:.3f}", best=f"{result.best_valid:.3f}@{result.best_epoch}")

    def _log_epoch(self, desc: str, record: dict[str, float], first_step: int,
                   started: float) -> None:  # fmt: skip
        """One line per epoch at INFO: where the run is, its scores, and the time left at
        this segment's pace (a log file's progress, where a bar would be noise)."""
        result = self.result
        spent = time.perf_counter() - started
        done = result.steps - first_step
        left = spent / done * (self.total - result.steps) if done else float("nan")
        valid = ""
        if "valid" in record:
            valid = (f", valid {record['valid']:.4f} (best {result.best_valid:.4f} at epoch "
                     f"{result.best_epoch})")  # fmt: skip
        log.info("%s: epoch %d (step %d of %d), train loss %.4f%s; %.1f min, about %.1f min left",
                 desc, result.epochs_run, result.steps, self.total, record["train_loss"], valid,
                 spent / 60, left / 60)  # fmt: skip

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.config.higher_is_better else a < b

    def _patience_spent(self) -> bool:
        """Early stop: ``patience`` epochs without a better score, with steps still to go."""
        patience, steps_left = self.config.patience, self.result.steps < self.total
        return patience is not None and self.since_best >= patience and steps_left

    def _select(self) -> None:
        """``select="best"``: put the best epoch's weights back; else report the last epoch
        (its average's weights, with ``ema_half_life``)."""
        result = self.result
        if self.config.select == "last" or self.best_state is None:
            result.best_epoch = result.epochs_run
            result.best_valid = result.history[-1].get("valid", math.nan)
            if self.average is not None:
                self.average.copy_into_model()
        else:
            with torch.no_grad():
                for name, param in _trainable(self.model):
                    param.copy_(self.best_state[name])


def _trainable(model: nn.Module):
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


class _Average:
    """The exponential moving average of a model's trainable weights (``ema_half_life``)."""

    def __init__(self, model: nn.Module, decay: float):
        self.params = _trainable(model)
        self.weights = {n: p.detach().float().clone() for n, p in self.params}
        self.decay = decay

    @classmethod
    def start(cls, model: nn.Module, config: LoopConfig, n_train: int) -> _Average | None:
        if not config.ema_half_life:
            return None
        steps_per_epoch = math.ceil(n_train / config.batch_size)
        return cls(model, 0.5 ** (1.0 / (config.ema_half_life * steps_per_epoch)))

    @torch.no_grad()
    def update(self, step: int) -> None:
        """Fold in the weights after update ``step`` (0-based)."""
        keep = min(self.decay, (1 + step) / (10 + step))
        for name, param in self.params:
            self.weights[name].lerp_(param.detach().float(), 1.0 - keep)

    def restore(self, saved: dict[str, torch.Tensor] | None, device: torch.device) -> None:
        from smiexlm.finetuning.state import StateMismatchError

        if saved is None or saved.keys() != self.weights.keys():
            raise StateMismatchError("the saved state has no weight average for this run")
        self.weights = {n: w.to(device) for n, w in saved.items()}

    @torch.no_grad()
    def copy_into_model(self) -> None:
        for name, param in self.params:
            param.copy_(self.weights[name])

    @staticmethod
    @contextmanager
    def swapped_in(average: _Average | None):
        """The average's weights in the model for the block; the raw ones back after it."""
        if average is None:
            yield
            return
        raw = {n: p.detach().clone() for n, p in average.params}
        average.copy_into_model()
        try:
            yield
        finally:
            with torch.no_grad():
                for name, param in average.params:
                    param.copy_(raw[name])


def _cached(model: nn.Module, examples: Examples, config: LoopConfig) -> Examples:
    """``examples`` with the frozen encoder's pooled features in place of token ids."""
    if examples.rows is None:
        return examples
    pooled = predict(
        model, examples, config.eval_batch_size, config.precision, config.pad_id, "pooled"
    )
    return Examples(None, examples.targets, examples.features, torch.from_numpy(pooled))
