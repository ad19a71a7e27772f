"""The pre-training loop: :func:`pretrain` runs one :class:`TrainConfig` on a token dataset.

Batches. The pipeline's ``TokenBudgetSampler`` orders each epoch into micro-batches of at most
``max_tokens`` padded tokens (seeded by ``seed`` and the epoch). An optimiser step consumes
``world_size × update_freq`` consecutive micro-batches of that order; the global index of a
micro-batch fixes which process gets it and the seed of its masking, so a run split over N
processes sees the same batches, masks and (without dropout) gradients as one process with
N times the accumulation. The data position saved in a checkpoint is (epoch, index of the
next micro-batch), so ``--resume`` continues mid-epoch exactly.

Determinism. Masking uses a CPU generator seeded per micro-batch, and the global torch
generator (dropout) is reseeded per step and process, so a resumed run repeats an
uninterrupted one bit for bit on CPU.

Precision. ``auto`` = bf16 autocast on GPU and on CPUs with native bf16 (AVX512-BF16, AMX),
fp32 elsewhere (``precision`` overrides); losses stay fp32.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smiexlm.device import autocast
from smiexlm.errors import ConfigError, DataError
from smiexlm.model.model import ExLMModel
from smiexlm.training import checkpoint as ckpt
from smiexlm.training import distributed as dist_utils
from smiexlm.training.batches import (
    MaskingCollator,
    check_vocabulary,
    epoch_batches,
    make_loader,
    mix_seed,
    model_inputs,
    open_dataset,
)
from smiexlm.training.config import TrainConfig
from smiexlm.training.optim import build_optimizer, build_schedule, clip_gradients, set_lr
from smiexlm.training.resume import cut_metrics, start_state
from smiexlm.training.runlock import RunLock

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
RESOLVED_CONFIG = "config.resolved.toml"


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


# ----------------------------------------------------------------------- helpers
class _StopRequest:
    """SIGTERM / SIGINT set a flag; the loop saves a checkpoint and leaves at the step's end."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # signals only reach the main thread
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C leaves at once
        self.signal_name = signal.Signals(signum).name

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _is_oom(error: BaseException) -> bool:
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def _oom_error(config: TrainConfig, shape: tuple[int, ...], device: torch.device) -> ConfigError:
    return ConfigError(
        "max_tokens",
        config.max_tokens,
        f"a smaller token budget: a micro-batch of shape {shape} ran out of memory on {device}; "
        f"try max_tokens={max(64, config.max_tokens // 2)} (raise update_freq to keep the "
        "global batch)",
    )


# ----------------------------------------------------------------------- the loop
def pretrain(
    config: TrainConfig,
    data_dir: Path,
    out_dir: Path,
    max_steps: int | None = None,
    resume: bool = False,
    skip_bad_checkpoints: bool = False,
) -> TrainResult:
    """Pre-train a model from ``config`` on the dataset in ``data_dir``; outputs go to ``out_dir``.

    ``max_steps`` overrides ``config.max_steps`` (the schedule's horizon stays
    ``config.total_steps`` or, when unset, the config's ``max_steps``). With ``resume`` the
    newest checkpoint in ``out_dir/checkpoints`` is restored first; a truncated or corrupted
    one is an error naming it, unless ``skip_bad_checkpoints`` (then the newest good one is
    restored). A checkpoint already at ``max_steps`` is reported (``already_finished``), not
    trained further. The main process holds ``out_dir/.lock`` throughout (see
    :mod:`~smiexlm.training.runlock`): a second run in the same folder is refused.
    """
    if max_steps is not None:  # a copy: the caller's config stays as it was
        config = dataclasses.replace(config, max_steps=max_steps, total_steps=config.decay_steps)
    out_dir = Path(out_dir)
    info = dist_utils.detect()
    device = dist_utils.select_device(config.device, info)
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    dist_utils.init(info, device)
    launched = os.environ.get(dist_utils.LAUNCHED_ENV) == "1"  # the launcher holds the lock
    lock = RunLock(out_dir) if info.is_main and not launched else None
    try:
        if lock is not None:
            lock.acquire()
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
        optimizer = build_optimizer(model, config)
        schedule = build_schedule(config)
        start, state = start_state(
            out_dir, data_dir, data.vocab_hash, model, optimizer, resume, skip_bad_checkpoints
        )
        if resume and start is None and info.is_main:
            logger.warning("--resume: no checkpoint in %s, starting from scratch", out_dir)
        if info.is_main:  # each step logged once: none after the one training goes on from
            cut_metrics(out_dir / METRICS_FILE, state.step)
        if start is not None and state.step >= config.max_steps:
            return _finished(out_dir, start, state, model)
        trainer = _Loop(config, data, model, optimizer, schedule, state, info, device, out_dir)
        if info.is_main:
            out_dir.mkdir(parents=True, exist_ok=True)
            config.save(out_dir / RESOLVED_CONFIG)
            trainer.say(
                f"{model_config.objective} model, {model.num_parameters():,} parameters, "
                f"{len(data.train):,} training sequences, device {device}, "
                f"{info.world_size} process(es)"
                + (f"; resumed from {start.name}" if start is not None else "")
            )
        return trainer.run()
    finally:
        if lock is not None:
            lock.release()
        dist_utils.shutdown()


def _finished(out_dir: Path, start: Path, state: ckpt.TrainerState, model) -> TrainResult:
    """The result of resuming a run that has already reached its max_steps."""
    best = out_dir / "checkpoints" / "best"
    return TrainResult(
        run_dir=out_dir, step=state.step, tokens_seen=state.tokens_seen, last_loss=None,
        last_valid_loss=None, best_valid_loss=state.best_valid_loss, last_checkpoint=start,
        best_checkpoint=best if best.is_dir() else None, already_finished=True, model=model,
    )  # fmt: skip


class _Loop:
    def __init__(self, config, data, model, optimizer, schedule, state, info, device, out_dir):
        self.config, self.data, self.optimizer, self.schedule = config, data, optimizer, schedule
        self.state, self.info, self.device, self.out_dir = state, info, device, out_dir
        self.raw_model = model
        self.model = dist_utils.wrap(model, info, device)
        self.per_step = info.world_size * config.update_freq
        limit = model.config.max_positions
        self.too_long = int((data.train_lengths > limit).sum())
        self.train_lengths = np.where(data.train_lengths > limit, 0, data.train_lengths)
        self.last_valid: float | None = None
        self.last_valid_desc: float | None = None  # descriptor loss, models with that head
        self.writer = self._tensorboard() if info.is_main else None

    # -------------------------------------------------------------- reporting
    def say(self, message: str) -> None:
        if self.info.is_main:
            from tqdm.auto import tqdm

            tqdm.write(message, file=sys.stderr)

    def _tensorboard(self):
        if not self.config.tensorboard:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise ConfigError(
                "tensorboard",
                True,
                "false, or install the extra: pip install 'smiexlm[tensorboard]'",
            ) from error
        return SummaryWriter(str(self.out_dir / "tensorboard"))

    def _log(self, record: dict[str, Any]) -> None:
        if not self.info.is_main:
            return
        with open(self.out_dir / METRICS_FILE, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["step"])

    # -------------------------------------------------------------- batches
    def _epoch_plan(self, epoch: int) -> list[list[int]]:
        batches = epoch_batches(
            self.train_lengths, self.config.max_tokens, self.config.seed, epoch, shuffle=True
        )
        if self.too_long:  # sequences over max_positions have length 0 here: leave them out
            batches = [[i for i in b if self.train_lengths[i] > 0] for b in batches]
            batches = [b for b in batches if b]
        usable = dist_utils.shard_batches(
            len(batches), self.info.world_size, self.config.update_freq
        )
        if usable == 0:
            raise DataError(
                f"the training split yields {len(batches)} micro-batches per epoch at "
                f"max_tokens={self.config.max_tokens}, fewer than one optimiser step needs "
                f"({self.per_step}); lower max_tokens or update_freq"
            )
        return batches[:usable]

    def _micro_batches(self):
        """Yield (epoch, next position, tensors) for this process, forever, from the state."""
        epoch, position = self.state.epoch, self.state.batch_in_epoch
        collator_model = self.raw_model.config
        while True:
            plan = self._epoch_plan(epoch)
            if position >= len(plan):
                epoch, position = epoch + 1, 0
                continue
            mine = [
                (g, plan[g])
                for g in range(position, len(plan))
                if (g % self.per_step) % self.info.world_size == self.info.rank
            ]
            collator = MaskingCollator(collator_model, self.config.seed, epoch)
            loader = make_loader(self.data.train, mine, collator, self.config.num_workers)
            for n, batch in enumerate(loader, start=1):
                done = position + (n // self.config.update_freq) * self.per_step
                yield epoch, done, batch
            epoch, position = epoch + 1, 0

    # -------------------------------------------------------------- validation
    @torch.no_grad()
    def validate(self) -> float | None:
        if self.data.valid is None:
            return None
        limit = self.raw_model.config.max_positions
        lengths = np.where(self.data.valid_lengths > limit, 0, self.data.valid_lengths)
        # A fixed random sample of batches (shuffled once with the run's seed): every
        # evaluation scores the same molecules, of all lengths.
        plan = [
            [i for i in b if lengths[i] > 0]
            for b in epoch_batches(lengths, self.config.max_tokens, self.config.seed, 0, True)
        ]
        plan = [b for b in plan if b]
        if self.config.valid_batches:
            plan = plan[: self.config.valid_batches]
        mine = [(g, b) for g, b in enumerate(plan) if g % self.info.world_size == self.info.rank]
        collator = MaskingCollator(self.raw_model.config, self.config.seed, -1)
        self.raw_model.eval()
        total, weight, desc, n_desc = 0.0, 0.0, 0.0, 0.0
        for batch in make_loader(self.data.valid, mine, collator, 0):
            with autocast(self.device, self.config.precision):
                out = self.raw_model(**model_inputs(batch, self.device))
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
    def _step(self, batches) -> tuple[float, int, int, float, float]:
        """Forward/backward over this process's micro-batches, then one update. Returns the
        summed LM losses, invalid sequences, tokens, summed descriptor losses, grad norm."""
        config, state = self.config, self.state
        torch.manual_seed(mix_seed(config.seed, state.step, self.info.rank, 11))  # dropout
        loss_sum, n_invalid, tokens, desc_sum = 0.0, 0, 0, 0.0
        for micro, batch in enumerate(batches):
            masked, mask = batch[0], batch[1]
            last = micro == len(batches) - 1
            sync = (
                self.model.no_sync()
                if (self.info.enabled and not last)
                else contextlib.nullcontext()
            )
            try:
                with sync:
                    with autocast(self.device, config.precision):
                        out = self.model(**model_inputs(batch, self.device))
                    (out.loss / config.update_freq).backward()
            except (RuntimeError, torch.cuda.OutOfMemoryError) as error:
                if _is_oom(error):
                    raise _oom_error(config, tuple(masked.shape), self.device) from error
                raise
            loss_sum += float((out.loss if out.lm_loss is None else out.lm_loss).detach())
            desc_sum += 0.0 if out.desc_loss is None else float(out.desc_loss.detach())
            n_invalid += out.n_invalid
            tokens += int(mask.sum())
        lr = self.schedule.lr_at(state.step)
        set_lr(self.optimizer, lr)
        grad_norm = clip_gradients(self.raw_model.parameters(), config.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss_sum, n_invalid, tokens, desc_sum, grad_norm

    def run(self) -> TrainResult:
        from tqdm.auto import tqdm

        config, state, info = self.config, self.state, self.info
        if self.too_long:
            self.say(
                f"{self.too_long} training sequences are longer than max_positions="
                f"{self.raw_model.config.max_positions} and are left out"
            )
        self.raw_model.train()
        stream = self._micro_batches()
        bar = tqdm(
            total=config.max_steps,
            initial=state.step,
            disable=not (info.is_main and config.progress),
            dynamic_ncols=True,
            unit="step",
            file=sys.stderr,
        )
        started = time.perf_counter()
        window = {"loss": 0.0, "micro": 0, "tokens": 0, "invalid": 0, "t0": started}
        last_loss = None
        last_saved: Path | None = None
        interrupted = None
        with _StopRequest() as stop:
            while state.step < config.max_steps:
                batches = []
                for _ in range(config.update_freq):
                    epoch, position, batch = next(stream)
                    batches.append(batch)
                loss_sum, n_invalid, tokens, desc_sum, grad_norm = self._step(batches)
                state.step += 1
                state.epoch, state.batch_in_epoch = epoch, position
                stats = [
                    loss_sum,
                    len(batches),
                    tokens,
                    n_invalid,
                    1.0 if stop.signal_name else 0.0,
                    desc_sum,
                ]
                loss_sum, n_micro, tokens, n_invalid, stopping, desc_sum = (
                    dist_utils.all_reduce_sum(stats, self.device, info)
                )
                state.tokens_seen += int(tokens)
                last_loss = loss_sum / n_micro
                if not math.isfinite(last_loss):
                    self.say(f"step {state.step}: loss is {last_loss}")
                window["loss"] += loss_sum
                window["micro"] += n_micro
                window["tokens"] += tokens
                window["invalid"] += n_invalid
                window["desc"] = window.get("desc", 0.0) + desc_sum
                validate_now = (
                    state.step % config.valid_every == 0 or state.step == config.max_steps
                )
                if state.step % config.log_every == 0 or validate_now or stopping:
                    now = time.perf_counter()
                    record = {
                        "step": state.step,
                        "loss": window["loss"] / max(window["micro"], 1),
                        "lr": self.schedule.lr_at(state.step - 1),
                        "grad_norm": grad_norm,
                        "tokens_per_s": window["tokens"] / max(now - window["t0"], 1e-9),
                        "tokens_seen": state.tokens_seen,
                        "epoch": state.epoch,
                        "elapsed_s": now - started,
                    }
                    if self.raw_model.config.objective == "exlm":
                        record["n_invalid"] = int(window["invalid"])
                    if self.raw_model.descriptor_head is not None:
                        record["desc_loss"] = window["desc"] / max(window["micro"], 1)
                    if validate_now:
                        self.last_valid = self.validate()
                        if self.last_valid is not None:
                            record["valid_loss"] = self.last_valid
                        if self.last_valid_desc is not None:
                            record["valid_desc_loss"] = self.last_valid_desc
                    self._log(record)
                    bar.set_postfix(
                        loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}"
                    )
                    window = {"loss": 0.0, "micro": 0, "tokens": 0, "invalid": 0, "t0": now}
                bar.update(1)
                new_best = (
                    validate_now
                    and self.last_valid is not None
                    and (state.best_valid_loss is None or self.last_valid < state.best_valid_loss)
                )
                if new_best:
                    state.best_valid_loss, state.best_step = self.last_valid, state.step
                save_now = state.step % config.save_every == 0 or state.step == config.max_steps
                if save_now or stopping or new_best:
                    last_saved = self.save(best=new_best)
                if stopping:
                    interrupted = stop.signal_name or "SIGTERM"
                    self.say(f"{interrupted}: checkpoint saved at step {state.step}; stopping")
                    break
        bar.close()
        if self.writer is not None:
            self.writer.close()
        root = self.out_dir / "checkpoints"
        return TrainResult(
            run_dir=self.out_dir,
            step=state.step,
            tokens_seen=state.tokens_seen,
            last_loss=last_loss,
            last_valid_loss=self.last_valid,
            best_valid_loss=state.best_valid_loss,
            last_checkpoint=last_saved,
            best_checkpoint=(root / "best") if (root / "best").is_dir() else None,
            interrupted_by=interrupted,
            elapsed_s=time.perf_counter() - started,
            model=self.raw_model,
        )
