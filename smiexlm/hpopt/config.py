"""``HpoptConfig``: a search's budget and its sampler's and pruner's settings, each declared
once (:func:`smiexlm.settings.setting`); ``smiexlm hpopt`` derives its options from them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from smiexlm.errors import ConfigError, check_positive_int
from smiexlm.hpopt.storage import check_storage
from smiexlm.settings import check_settings, recorded, setting, settings_of

BUDGET = ("trials", "cpu_minutes")  # a resumed search may be given more of either
HOW_RUN = ("storage", "workers", "heartbeat")  # where and by how many: not the search itself


def _is_int(value: object, low: int, high: float = math.inf) -> bool:
    """Whether ``value`` is an integer (not a bool) in [low, high)."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < high


@dataclass
class HpoptConfig:
    """The budget, and the sampler's and pruner's settings. ``trials``: trials that complete
    or are pruned; ``cpu_minutes``: the process CPU time of the finished trials, across
    resumes. No trial starts once either is spent; at least one is needed."""

    trials: int | None = setting(
        None, "Trials to count in all (completed or pruned; a failed one does not count), "
        "this run's and the earlier runs' of --out together.",
    )  # fmt: skip
    cpu_minutes: float | None = setting(
        None, "Process CPU minutes of the finished trials, earlier runs' included; no trial "
        "starts once spent. Give it, --trials, or both.", within="(0, inf)",
    )  # fmt: skip
    seed: int = setting(0, "Seed of the sampler, of every trial's training and of a seeded split.")
    startup_trials: int = setting(8, "TPE draws at random until this many trials count.")
    prune_after: int = setting(4, "Completed trials before the pruner prunes.")
    warmup_epochs: int = setting(3, "Epochs of a trial that are never pruned.")
    storage: str | None = setting(
        None, "Where the study lives: none (OUT/study.sqlite, one worker), "
        "postgresql://USER:PASSWORD@HOST:PORT/DB or journal:PATH; the same command with the "
        "same --storage on another machine joins the study.",
    )  # fmt: skip
    workers: int = setting(1, "Processes that run trials on this machine, sharing --storage.")
    heartbeat: float = setting(
        10.0, "Seconds between a running trial's heartbeats with --storage; a trial silent "
        "for three is taken for dead, marked failed and run again.", within="(0, inf)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.storage == "none":  # as the help spells the embedded default
            self.storage = None
        check_settings(self, as_flags=True)  # types, finite floats, each setting's ``within``
        if self.trials is None and self.cpu_minutes is None:
            raise ConfigError("--trials", None, "a budget: --trials N, --cpu-minutes M or both")
        if self.trials is not None and not _is_int(self.trials, 1):
            raise ConfigError("--trials", self.trials, "a positive number of trials")
        if not _is_int(self.seed, 0, 2**32):
            raise ConfigError("--seed", self.seed, "an integer in [0, 2**32)")
        check_positive_int("startup_trials", self.startup_trials)
        check_positive_int("prune_after", self.prune_after)
        if not _is_int(self.warmup_epochs, 0):
            raise ConfigError("warmup_epochs", self.warmup_epochs, "0 or a positive integer")
        if not _is_int(self.workers, 1):
            raise ConfigError("--workers", self.workers, "a positive number of processes")
        check_storage(self.storage, self.workers)

    def identity(self) -> dict[str, Any]:
        """The settings a resumed search must share with the one that started it: all but
        the budget, which a resume may raise; one added later left out where it is at the
        value that does what searches before it did (:func:`smiexlm.settings.recorded`)."""
        values = {s.key: getattr(self, s.name) for s in settings_of(type(self))}
        kept = {k: v for k, v in values.items() if k not in BUDGET + HOW_RUN}
        return recorded(kept, type(self))

    def spent(self, counted: int, cpu_seconds: float) -> str | None:
        """What stops the search now: ``"trials"``, ``"cpu-minutes"``, or None (go on)."""
        if self.trials is not None and counted >= self.trials:
            return "trials"
        if self.cpu_minutes is not None and cpu_seconds >= 60 * self.cpu_minutes:
            return "cpu-minutes"
        return None
