"""The pre-training loop: :func:`pretrain` runs one :class:`TrainConfig` on a token dataset.

Batches. The pipeline's ``TokenBudgetSampler`` orders each epoch into micro-batches of at most
``max_tokens`` padded tokens (seeded by ``seed`` and the epoch). An optimiser step consumes
``world_size × update_freq`` consecutive micro-batches of that order; the global index of a
micro-batch fixes which process gets it and the seed of its masking, so a run split over N
processes sees the same batches, masks and (without dropout) gradients as one process with
N times the accumulation. The data position saved in a checkpoint is (epoch, index of the
next micro-batch), so ``--resume`` continues mid-epoch exactly.

Determinism. Masking uses a CPU generator seeded per micro-batch, and the global torch generator
(dropout) is reseeded per step and process: a resumed run repeats an uninterrupted one on CPU.

Precision. ``auto`` = bf16 autocast on GPU and CPUs with native bf16 (AVX512-BF16, AMX), fp32
elsewhere (``precision`` overrides); losses stay fp32."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from smiexlm.device import autocast
from smiexlm.errors import ConfigError
from smiexlm.model.model import ExLMModel
from smiexlm.pretraining.batches import check_vocabulary, forward_kwargs, mix_seed, open_dataset
from smiexlm.pretraining.config import TrainConfig
from smiexlm.pretraining.guards import StopRequest, is_oom, oom_error
from smiexlm.pretraining.reporting import METRICS_FILE, MetricsLog, Window, progress_bar, say
from smiexlm.pretraining.resume import (
    config_changes,
    cut_metrics,
    elapsed_before,
    record_config_changes,
    resolved_precision_change,
    start_state,
)
from smiexlm.pretraining.stream import TrainStream, validation_loader
from smiexlm.pretraining.warm_start import load_initial_weights
from smiexlm.training import distributed as dist_utils
from smiexlm.training import run_state as ckpt
from smiexlm.training.optim import build_optimizer, build_schedule, clip_gradients, set_lr
from smiexlm.training.ranks import detect
from smiexlm.training.runlock import RunLock
from smiexlm.training.workers import set_threads

logger = logging.getLogger(__name__)

RESOLVED_CONFIG = "config.resolved.toml"
__all__ = ["RESOLVED_CONFIG", "TrainResult", "pretrain"]


@dataclass
class TrainResult:
    """What a finished (or interrupted) run reports."""

    run_dir: Path
    step: int
    tokens_seen: int
    last_loss: float | None
    last_valid_loss: float | None
    best_valid_loss: float | None
    last_checkpoint: Path | None
    best_checkpoint: Path | None
    interrupted_by: str | None = None  # "SIGTERM" / "SIGINT" when stopped by a signal
    already_finished: bool = False  # --resume of a run at max_steps: nothing was trained
    elapsed_s: float = 0.0
    model: Any = field(default=None, repr=False)  # the trained ExLMModel (this process's copy)


# ----------------------------------------------------------------------- the run
def pretrain(
    config: TrainConfig,
    data_dir: Path,
    out_dir: Path,
    max_steps: int | None = None,
    resume: bool = False,
    skip_bad_checkpoints: bool = False,
) -> TrainResult:
    """Pre-train a model from ``config`` on the dataset in ``data_dir``; outputs go to ``out_dir``.

    ``max_steps`` overrides ``config.max_steps`` (the schedule's horizon stays ``total_steps``
    or, unset, the config's ``max_steps``; past it at ``end_lr = 0``, refused). With ``resume`` the
    newest checkpoint in ``out_dir/checkpoints`` is restored first; a truncated or corrupted
    one is an error naming it, unless ``skip_bad_checkpoints`` (then the newest good one is
    restored). A checkpoint already at ``max_steps`` is reported (``already_finished``), not
    trained further. The main process holds ``out_dir/.lock`` throughout (see
    :mod:`~smiexlm.training.runlock`): a second run in the same folder is refused."""
    config.check_horizon(max_steps or config.max_steps)
    if max_steps is not None:  # a copy: the caller's config stays as it was
        config = dataclasses.replace(config, max_steps=max_steps, total_steps=config.decay_steps)
    out_dir = Path(out_dir)
    info = detect()
    device = dist_utils.select_device(config.device, info)
    if config.num_threads:
        set_threads(config.num_threads, "num_threads")
    dist_utils.init(info, device)
    launched = os.environ.get(dist_utils.LAUNCHED_ENV) == "1"  # the launcher holds the lock
    lock = RunLock(out_dir) if info.is_main and not launched else None
    try:
        if lock is not None:
            lock.acquire()
        return _train(config, data_dir, out_dir, resume, skip_bad_checkpoints, info, device)
    finally:
        if lock is not None:
            lock.release()
        dist_utils.shutdown()


def _train(config, data_dir, out_dir, resume, skip_bad_checkpoints, info, device) -> TrainResult:
    """Open the dataset, build the model and optimiser, restore a checkpoint, run the loop."""
    data = open_dataset(data_dir, descriptors=config.model.config.uses_descriptors)
    check_vocabulary(config, data)
    model_config = config.model_config(
        vocab_size=data.tokenizer.vocab_size, vocab_hash=data.vocab_hash,
        n_descriptors=data.n_descriptors,
    )  # fmt: skip
    if not resume and ckpt.latest_checkpoint(out_dir) is not None:
        raise ConfigError(
            "out", str(out_dir), "a run folder without checkpoints, or --resume to continue it"
        )
    torch.manual_seed(config.seed)  # identical initial weights on every process
    model = ExLMModel(model_config).to(device)
    model.descriptor_stats = data.descriptor_stats  # saved with every checkpoint
    if config.init is not None:  # continued pre-training; a resumed checkpoint overrides it
        load_initial_weights(model, config.init, data.descriptor_stats)
    optimizer = build_optimizer(model, config)
    schedule = build_schedule(config)
    start, state = start_state(out_dir, data_dir, data.vocab_hash, model, optimizer, resume,
                               skip_bad_checkpoints, partial(dist_utils.gather_ints, device, info))  # fmt: skip
    changes = config_changes(start, state, config, info.world_size)  # refused ones raise
    changes |= resolved_precision_change(state, device, config.precision)
    if resume and start is None and info.is_main:
        logger.warning("--resume: no checkpoint in %s, starting from scratch", out_dir)
    if info.is_main:  # each step logged once: none after the one training goes on from
        cut_metrics(out_dir / METRICS_FILE, state.step)
    if start is not None and state.step >= config.max_steps:
        return _finished(out_dir, start, state, model)
    trainer = _Loop(config, data, model, optimizer, schedule, state, info, device, out_dir)
    if info.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        record_config_changes(out_dir, start, state.step, changes)  # old values kept there
        whole = config.update_freq * info.world_size  # a config's global count, split by launch
        dataclasses.replace(config, update_freq=whole).save(out_dir / RESOLVED_CONFIG)
        trainer.say(
            f"{model_config.objective} model, {model.num_parameters():,} parameters, "
            f"{len(data.train):,} training sequences, device {device}, "
            f"{info.world_size} process(es)"
            + (f"; resumed from {start.name}" if start is not None else "")
            + (f"; from the weights of {config.init}" if start is None and config.init else "")
            + ("; random SMILES" if config.spelling == "random" else "")
        )
    return trainer.run()


def _finished(out_dir: Path, start: Path, state: ckpt.TrainerState, model) -> TrainResult:
    """The result of resuming a run that has already reached its max_steps."""
    best = out_dir / "checkpoints" / "best"
    return TrainResult(
        run_dir=out_dir, step=state.step, tokens_seen=state.tokens_seen, last_loss=None,
        last_valid_loss=None, best_valid_loss=state.best_valid_loss, last_checkpoint=start,
        best_checkpoint=best if best.is_dir() else None, already_finished=True, model=model,
    )  # fmt: skip


# ----------------------------------------------------------------------- the loop
class _Loop:
    """The training loop of one process. :meth:`run` repeats named steps until ``max_steps``
    or a stop request: :meth:`_advance` (one optimiser update over its micro-batches),
    :meth:`_report` (a metrics record, with :meth:`validate` when due), :meth:`_track_best`,
    :meth:`save`, and :meth:`_finish`."""

    def __init__(self, config, data, model, optimizer, schedule, state, info, device, out_dir):
        self.config, self.data, self.optimizer, self.schedule = config, data, optimizer, schedule
        self.state, self.info, self.device, self.out_dir = state, info, device, out_dir
        self.raw_model = model
        self.model = dist_utils.wrap(model, info, device)
        self.train_stream = TrainStream(config, data, model.config, info)
        self.last_valid: float | None = None
        self.last_valid_desc: float | None = None  # descriptor loss, models with that head
        self.metrics = MetricsLog(out_dir, info.is_main, config.tensorboard)
        # set by run() and its steps
        self.last_loss: float | None = None
        self.last_saved: Path | None = None
        self.grad_norm = 0.0
        self.started = 0.0
        self.window = Window(0.0)
        # the wall time of the run before a resume: elapsed_s in the log goes on from it
        self.elapsed_before = (
            elapsed_before(out_dir / METRICS_FILE, state.step) if info.is_main else 0.0
        )

    def say(self, message: str) -> None:
        say(message, self.info.is_main)

    # -------------------------------------------------------------- validation
    @torch.no_grad()
    def validate(self) -> float | None:
        if self.data.valid is None:
            return None
        self.raw_model.eval()
        total, weight, desc, n_desc = 0.0, 0.0, 0.0, 0.0
        loader = validation_loader(self.config, self.data, self.raw_model.config, self.info)
        for batch in loader:
            with autocast(self.device, self.config.precision):
                out = self.raw_model(**forward_kwargs(batch, self.device))
            lm_loss = out.loss if out.lm_loss is None else out.lm_loss  # the LM part only
            total += float(lm_loss) * out.n_predictions
            weight += out.n_predictions
            if out.desc_loss is not None:
                desc += float(out.desc_loss) * out.n_descriptor_targets
                n_desc += out.n_descriptor_targets
        self.raw_model.train()
        sums = dist_utils.all_reduce_sum([total, weight, desc, n_desc], self.device, self.info)
        total, weight, desc, n_desc = sums
        self.last_valid_desc = desc / n_desc if n_desc > 0 else None
        return total / weight if weight > 0 else None

    # -------------------------------------------------------------- checkpoints
    def save(self, best: bool) -> Path:
        folder = ckpt.step_dir(self.out_dir, self.state.step)
        if self.info.is_main:
            ckpt.save_training_state(
                folder,
                self.raw_model,
                self.optimizer,
                self.state,
                self.schedule.state_dict(),
                self.config.to_dict(),
                self.data.tokenizer,
            )
            root = self.out_dir / "checkpoints"
            ckpt.copy_checkpoint(folder, root / "last")
            if best:
                ckpt.copy_checkpoint(folder, root / "best")
            ckpt.prune_checkpoints(self.out_dir, self.config.keep_last)
        dist_utils.barrier(self.info)
        return folder

    # -------------------------------------------------------------- one step
    def _backward(self, batch, last: bool):
        """Forward and backward of one micro-batch (gradients synchronised on the ``last``)."""
        sync = (
            self.model.no_sync() if (self.info.enabled and not last) else contextlib.nullcontext()
        )
        try:
            with sync:
                with autocast(self.device, self.config.precision):
                    out = self.model(**forward_kwargs(batch, self.device))
                (out.loss / self.config.update_freq).backward()
        except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
            if is_oom(error):
                raise oom_error(self.config, tuple(batch[0].shape), self.device) from error
            raise
        return out

    def _step(self, batches) -> tuple[float, int, int, float, float]:
        """Forward/backward over this process's micro-batches, then one update. Returns the
        summed LM losses, invalid sequences, tokens, summed descriptor losses, grad norm."""
        config, state = self.config, self.state
        torch.manual_seed(mix_seed(config.seed, state.step, self.info.rank, 11))  # dropout
        loss_sum, n_invalid, tokens, desc_sum = 0.0, 0, 0, 0.0
        for micro, batch in enumerate(batches):
            out = self._backward(batch, last=micro == len(batches) - 1)
            loss_sum += float((out.loss if out.lm_loss is None else out.lm_loss).detach())
            desc_sum += 0.0 if out.desc_loss is None else float(out.desc_loss.detach())
            n_invalid += out.n_invalid
            tokens += int(batch[1].sum())
        lr = self.schedule.lr_at(state.step)
        set_lr(self.optimizer, lr)
        where = f"pre-training diverged at step {state.step + 1} (epoch {state.epoch})"
        lower = f"lr (now {config.lr:g}) and go on from the last checkpoint with --resume"
        grad_norm = clip_gradients(self.raw_model.parameters(), config.clip_norm, where, lower)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum, n_invalid, tokens, desc_sum, grad_norm

    def _advance(self, stream, stop: StopRequest) -> float:
        """One optimiser step on the next ``update_freq`` micro-batches; its sums over all
        processes go into the window. Returns the number of processes asked to stop."""
        state = self.state
        batches = []
        for _ in range(self.config.update_freq):
            epoch, position, batch = next(stream)
            batches.append(batch)
        loss_sum, n_invalid, tokens, desc_sum, self.grad_norm = self._step(batches)
        state.step += 1
        state.epoch, state.batch_in_epoch = epoch, position
        stats = [loss_sum, len(batches), tokens, n_invalid, 1.0 if stop.signal_name else 0.0,
                 desc_sum]  # fmt: skip
        loss_sum, n_micro, tokens, n_invalid, stopping, desc_sum = dist_utils.all_reduce_sum(
            stats, self.device, self.info
        )
        state.tokens_seen += int(tokens)
        self.last_loss = loss_sum / n_micro
        if not math.isfinite(self.last_loss):
            self.say(f"step {state.step}: loss is {self.last_loss}")
        self.window.add(loss_sum, n_micro, tokens, n_invalid, desc_sum)
        return stopping

    # -------------------------------------------------------------- after a step
    def _due(self, every: int) -> bool:
        return self.state.step % every == 0 or self.state.step == self.config.max_steps

    def _report(self, validate: bool, bar) -> None:
        """Log the window's record (with a validation when ``validate``), start a new one."""
        now = time.perf_counter()
        w, state = self.window, self.state
        record = {
            "step": state.step,
            "loss": w.loss / max(w.micro, 1),
            "lr": self.schedule.lr_at(state.step - 1),
            "grad_norm": self.grad_norm,
            "tokens_per_s": w.tokens / max(now - w.t0, 1e-9),
            "tokens_seen": state.tokens_seen,
            "epoch": state.epoch,
            "elapsed_s": self.elapsed_before + now - self.started,
        }
        if self.raw_model.config.objective == "exlm":
            record["n_invalid"] = int(w.invalid)
        if self.raw_model.descriptor_head is not None:
            record["desc_loss"] = w.desc / max(w.micro, 1)
        if validate:
            self.last_valid = self.validate()
            if self.last_valid is not None:
                record["valid_loss"] = self.last_valid
            if self.last_valid_desc is not None:
                record["valid_desc_loss"] = self.last_valid_desc
        self.metrics.log(record)
        bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")
        self.window = Window(now)

    def _track_best(self, validated: bool) -> bool:
        """Whether the validation just run is the best so far (then recorded in the state)."""
        state = self.state
        new_best = (
            validated
            and self.last_valid is not None
            and (state.best_valid_loss is None or self.last_valid < state.best_valid_loss)
        )
        if new_best:
            state.best_valid_loss, state.best_step = self.last_valid, state.step
        return new_best

    # -------------------------------------------------------------- the run
    def run(self) -> TrainResult:
        config, state = self.config, self.state
        if self.train_stream.too_long:
            self.say(
                f"{self.train_stream.too_long} training sequences are longer than max_positions="
                f"{self.raw_model.config.max_positions} and are left out"
            )
        self.raw_model.train()
        stream = self.train_stream.batches(state.epoch, state.batch_in_epoch)
        bar = progress_bar(config.max_steps, state.step, self.info.is_main and config.progress)
        self.started = time.perf_counter()
        self.window = Window(self.started)
        interrupted = None
        with StopRequest() as stop:
            while state.step < config.max_steps:
                stopping = self._advance(stream, stop)
                validate_now = self._due(config.valid_every)
                if state.step % config.log_every == 0 or validate_now or stopping:
                    self._report(validate_now, bar)
                bar.update(1)
                new_best = self._track_best(validate_now)
                if self._due(config.save_every) or stopping or new_best:
                    self.last_saved = self.save(best=new_best)
                if stopping:
                    interrupted = stop.signal_name or "SIGTERM"
                    self.say(f"{interrupted}: checkpoint saved at step {state.step}; stopping")
                    break
        bar.close()
        return self._finish(interrupted)

    def _finish(self, interrupted: str | None) -> TrainResult:
        self.metrics.close()
        best = self.out_dir / "checkpoints" / "best"
        return TrainResult(
            run_dir=self.out_dir,
            step=self.state.step,
            tokens_seen=self.state.tokens_seen,
            last_loss=self.last_loss,
            last_valid_loss=self.last_valid,
            best_valid_loss=self.state.best_valid_loss,
            last_checkpoint=self.last_saved,
            best_checkpoint=best if best.is_dir() else None,
            interrupted_by=interrupted,
            elapsed_s=time.perf_counter() - self.started,
            model=self.raw_model,
        )
