"""A pretraining job, in one process or spread over the free cores: what ``smiexlm pretrain``
runs, as a library call.

>>> job = PretrainJob("mol_tiny_exlm", Path("datasets/moses"), Path("runs/tiny"), ["lr=3e-4"])
>>> outcome = job.run()          # outcome.code: 0, or 130/143 when stopped by a signal

On a CPU a job takes the cores it finds free (:func:`~smiexlm.training.distributed.
local_processes`): it starts N worker processes of this module (``python -m
smiexlm.pretraining.launch JOB_JSON``), each with ``update_freq / N`` micro-batches per update,
so the global batch stays the config's. Under ``torchrun`` (several GPUs or machines) every
process runs the job itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from smiexlm.training import distributed
from smiexlm.training.ranks import detect


@dataclass
class JobOutcome:
    """How a job ended: the process exit code, and the report line (rank 0 only)."""

    code: int
    message: str | None = None
    record: bool = False  # this process started the run: it records the command


@dataclass
class PretrainJob:
    """A pretraining run: config (a shipped name or a TOML/YAML file) with ``key=value``
    overrides, dataset, run folder, and how to start (``resume``) and spread (``nproc``)."""

    config: str
    data: Path
    out: Path
    overrides: list[str] = field(default_factory=list)
    max_steps: int | None = None
    resume: bool = False
    skip_bad_checkpoints: bool = False
    nproc: int | None = None

    def to_json(self) -> str:
        doc = dataclasses.asdict(self) | {"data": str(self.data), "out": str(self.out)}
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> PretrainJob:
        doc = json.loads(text)
        return cls(**doc | {"data": Path(doc["data"]), "out": Path(doc["out"])})

    def run(self) -> JobOutcome:
        """Train (or start the workers that train) and report."""
        from smiexlm.pretraining.config import load_config
        from smiexlm.pretraining.trainer import pretrain

        cfg = load_config(self.config, self.overrides)
        info = detect()
        launched = os.environ.get(distributed.LAUNCHED_ENV) == "1"
        if launched:
            distributed.follow_launcher()  # no orphan trains on after a kill -9 of its launcher
        elif not info.enabled:
            code = distributed.run_on_free_cores(cfg, self.nproc, self._worker, self.out)
            if code is not None:  # the workers did the run
                return JobOutcome(code, record=True)
        result = pretrain(cfg, self.data, self.out, self.max_steps, self.resume,
                          self.skip_bad_checkpoints)  # fmt: skip
        message = report(result, self.max_steps or cfg.max_steps) if info.is_main else None
        code = {None: 0, "SIGTERM": 143}.get(result.interrupted_by, 130)
        record = info.is_main and not launched and not result.already_finished
        return JobOutcome(code, message, record)

    def _worker(self, update_freq: int) -> list[str]:
        """The command of one worker process, with its share of the micro-batches."""
        job = dataclasses.replace(self, overrides=[*self.overrides, f"update_freq={update_freq}"])
        return [sys.executable, "-m", "smiexlm.pretraining.launch", job.to_json()]


def report(result, max_steps: int) -> str:
    """The line a finished (or stopped) run prints."""
    if result.already_finished:
        return (
            f"run {str(result.run_dir)!r} already reached max_steps = {max_steps} "
            f"(step {result.step}, checkpoint {result.last_checkpoint}); nothing to train: "
            "raise --max-steps and total_steps, the schedule's horizon, to continue it"
        )
    return (
        f"step {result.step}: loss {result.last_loss}, valid loss {result.last_valid_loss}, "
        f"{result.tokens_seen:,} tokens; checkpoint {result.last_checkpoint}"
    )


def record_command(out: Path, argv: list[str]) -> None:
    """Append a command line to RUN/command.txt; the export's model card quotes it."""
    if out.is_dir():
        with open(out / "command.txt", "a") as handle:
            handle.write(shlex.join(argv) + "\n")


def main(argv: list[str] | None = None) -> int:
    """A worker process: ``python -m smiexlm.pretraining.launch JOB_JSON``.

    A refusal (a bad config, dataset or ``--resume``) ends it with exit code 2 and the one
    ``error:`` line the single-process command prints, written by rank 0 only: every rank
    checks the same config and files, so the others would print the same line again."""
    from smiexlm.errors import SmiexlmError

    args = sys.argv[1:] if argv is None else argv
    try:
        outcome = PretrainJob.from_json(args[0]).run()
    except SmiexlmError as err:
        if detect().is_main:
            print(f"error: {err}", file=sys.stderr, flush=True)
        return 2
    if outcome.message:
        print(outcome.message, flush=True)
    return outcome.code


if __name__ == "__main__":
    raise SystemExit(main())
