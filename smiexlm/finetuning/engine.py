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

``ema_half_life``: validation, selection and the weights kept are those of a moving average
of the weights (:mod:`~smiexlm.finetuning.averaging`). ``freeze``, ``freeze_layers`` and
``head_epochs`` train with the encoder frozen, for the run or first
(:mod:`~smiexlm.finetuning.frozen`).

Each epoch logs one line at INFO (``smiexlm.finetuning.engine``): the step, the training loss,
the validation score and the best so far, and the time left at the run's pace; a log file's
progress, beside the optional progress bar.

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
from smiexlm.finetuning.averaging import WeightAverage, trainable
from smiexlm.finetuning.batches import (
    Examples,
    bucketed_batches,
    to_batch,
)
from smiexlm.finetuning.frozen import cached_features, freeze_encoder, train_head_first
from smiexlm.finetuning.inference import predict
from smiexlm.finetuning.loop_config import FitRun, LoopConfig
from smiexlm.finetuning.parallel import Replicas, present_labels
from smiexlm.settings import recorded
from smiexlm.training.optim import check_finite_weights

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


def fit(model: nn.Module, train: Examples, valid: Examples | None, config: LoopConfig,
        score: Callable[[np.ndarray], float] | None, run: FitRun | None = None) -> FitResult:  # fmt: skip
    """Train ``model`` in place on ``train``; select on ``score(valid logits)`` per epoch,
    driven as ``run`` says (:class:`~smiexlm.finetuning.loop_config.FitRun`: seed, progress,
    the state kept and resumed, a callback after each validation)."""
    run = run or FitRun()
    loop = _Fit(model, train, valid, config, score, run.seed)
    if run.state_dir is not None:
        loop.keep_state(Path(run.state_dir), dict(run.identity or {}))
    return loop.run(run.progress, run.desc, run.on_epoch)


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
        self.average = WeightAverage.start(model, config, len(train))
        self.best_state: dict[str, torch.Tensor] | None = None
        self.since_best = 0  # epochs since the best validation score
        self.seed = seed
        self.state_dir: Path | None = None
        self.identity: dict[str, Any] = {}

    def run(self, progress: bool, desc: str, on_epoch: Callable | None = None) -> FitResult:
        from tqdm.auto import tqdm

        if self.config.freeze:  # the frozen encoder runs once, in eval mode and in the run's
            # precision (a resumed one's, see keep_state); the head trains on its features
            self.train = cached_features(self.model, self.train, self.config)
            if self.valid is not None:
                self.valid = cached_features(self.model, self.valid, self.config)
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
        check_finite_weights(
            trainable(self.model),
            f"fine-tuning diverged by epoch {result.epochs_run}, step {result.steps}",
            self.config.to_lower(),
        )
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
        """``head_epochs`` (:func:`~smiexlm.finetuning.frozen.train_head_first`), then the
        model validated as epoch 0; the weight average starts from the fitted head."""
        loss = train_head_first(self.model, self.train, self.config, self.seed, self.device)
        self.replicas.broadcast(self.model)
        if self.average is not None:  # it averages from the fitted head, not the random one
            self.average = WeightAverage(self.model, self.average.decay)
        record = {"epoch": 0, "step": 0, "train_loss": loss}
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
        from smiexlm.training.optim import clip_gradients, set_lr

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
        at = f"fine-tuning diverged at epoch {self.result.epochs_run}, step {self.result.steps + 1}"
        clip_gradients(self.trainable, self.config.clip_norm, at, self.config.to_lower())
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
        with WeightAverage.swapped_in(self.average):
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
                    {n: p.detach().clone() for n, p in trainable(self.model)}
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
                for name, param in trainable(self.model):
                    param.copy_(self.best_state[name])
