"""The study of :mod:`smiexlm.hpopt.run` in its storage (:mod:`smiexlm.hpopt.storage`):
opened or resumed, one trial asked, run and told, the budget spent so far.

In the embedded SQLite study only the process holding the run folder's lock
(:class:`~smiexlm.training.runlock.RunLock`) opens the study, so a trial found RUNNING when it
opens was left by a process that stopped (Ctrl-C, kill -9, a reboot): it is marked failed. A
shared study's running trials may be other workers' own: only those whose heartbeat stopped
are.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.errors import DataError
from smiexlm.finetuning.state import as_kept
from smiexlm.hpopt.config import HpoptConfig
from smiexlm.hpopt.search import Search
from smiexlm.hpopt.storage import (
    BASE_KEY,
    STUDY_NAME,
    Heartbeat,
    fail_stale_trials,
    open_storage,
    shown,
    surplus,
)

logger = logging.getLogger(__name__)
COUNTED_STATES = ("COMPLETE", "PRUNED")  # the trials that spend the --trials budget


def open_study(out: Path, search: Search, hp: HpoptConfig, pruner=None):
    """The study in ``hp.storage`` (``out/study.sqlite`` by default): made, or resumed after
    its settings are checked against the folder's (DataError naming the first that differs);
    trials left running are marked failed (in a shared study, those whose heartbeat stopped).
    ``pruner``: the median pruner unless given."""
    import optuna
    from optuna.trial import TrialState

    storage = open_storage(hp.storage, out)
    if pruner is None:
        pruner = optuna.pruners.MedianPruner(hp.prune_after, hp.warmup_epochs)
    study = optuna.create_study(storage=storage, study_name=STUDY_NAME, pruner=pruner,
                                direction=search.direction, load_if_exists=True)  # fmt: skip
    identity = search.identity(hp)
    saved = study.user_attrs.get("identity")
    where = f"--out {str(out)!r}" if hp.storage is None else f"--storage {shown(hp.storage)!r}"
    if saved is None:
        study.set_user_attr("identity", identity)
        if hp.storage is not None and not study.get_trials(deepcopy=False):
            # trial 0; workers started in the same instant may each queue it: the copies
            # after the first are given up when drawn (storage.surplus)
            study.enqueue_trial(search.space.params_of(search.base), user_attrs={BASE_KEY: True})
    elif (saved := as_recorded(saved)) != (identity := as_kept(identity, saved)):
        key, then, now = first_difference(saved, identity)
        raise DataError(
            f"{where} holds a search with {key} = {then!r}, not {now!r}: run the command that "
            f"started it to resume it, or give another {where.split()[0]}"
        )
    if hp.storage is not None:
        fail_stale_trials(study, hp.heartbeat)
        return study
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)  # its process stopped mid-trial
    return study


def as_recorded(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved study's identity as this version records it: its base config's settings at
    the value that does what runs before them did left out (older studies resume as they
    did, :meth:`FinetuneConfig.recorded_of`)."""
    from smiexlm.finetuning.config import FinetuneConfig

    return saved | {"base": FinetuneConfig.recorded_of(saved.get("base", {}))}


def first_difference(a: Any, b: Any, key: str = "") -> tuple[str, Any, Any]:
    """(dotted key, value in ``a``, value in ``b``) of the first place two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for name in [*a, *(k for k in b if k not in a)]:
            if a.get(name) != b.get(name):
                return first_difference(a.get(name), b.get(name), f"{key}.{name}" if key else name)
    return key or "settings", a, b


def spending(study) -> tuple[int, float]:
    """(trials counted, CPU seconds of the finished trials) of the study so far."""
    counted, cpu = 0, 0.0
    for trial in study.get_trials(deepcopy=False):
        counted += trial.state.name in COUNTED_STATES
        if trial.state.is_finished():
            cpu += float(trial.user_attrs.get("cpu_seconds", 0.0))
    return counted, cpu


def sampler_for(seed: int, counted: int, startup_trials: int, number: int | None = None):
    """TPE seeded from (``seed``, trials counted so far): the same point for the same history,
    whether the study ran straight or was resumed (one sampler for the whole process would
    restart its random stream at each resume and draw the first points again). Workers that
    share a study seed it with the trial's ``number`` too, so two never draw one point, and
    take the running trials' points as given (TPE's constant liar)."""
    import optuna

    keys = [seed, counted] if number is None else [seed, counted, number]
    state = int(np.random.SeedSequence(keys).generate_state(1)[0])
    return optuna.samplers.TPESampler(seed=state, n_startup_trials=startup_trials,
                                      constant_liar=number is not None)  # fmt: skip


def one_trial(study, search: Search, hp: HpoptConfig, progress: bool = False) -> int | None:
    """Ask a trial (the base config first), run it and tell its end; its number (None: a
    shared study's trial given up as beyond the budget). An error (or an interrupt) marks it
    failed and goes on up."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    counted, _ = spending(study)
    study.sampler = sampler_for(hp.seed, counted, hp.startup_trials)
    if hp.storage is None:
        if counted == 0 and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            study.enqueue_trial(search.space.params_of(search.base))  # trial 0: Table 8's row
        return _run_and_tell(study, study.ask(), search, progress)
    trial = study.ask()
    if (why := surplus(study, trial, hp.trials)) is not None:
        trial.set_user_attr("error", why)
        study.tell(trial, state=TrialState.FAIL)
        return None
    study.sampler = sampler_for(hp.seed, counted, hp.startup_trials, trial.number)
    beat = Heartbeat(trial, hp.heartbeat)
    try:
        return _run_and_tell(study, trial, search, progress)
    except UpdateFinishedTrialError:  # taken for dead (silent too long) and queued again
        logger.warning("trial %d was marked failed by another worker; it runs again", trial.number)
        return trial.number
    finally:
        beat.stop()


def _run_and_tell(study, trial, search: Search, progress: bool) -> int:
    from optuna import TrialPruned
    from optuna.trial import TrialState

    try:
        value = search.run(trial, progress)
    except TrialPruned:
        study.tell(trial, state=TrialState.PRUNED)
        return trial.number
    except BaseException as err:
        trial.set_user_attr("error", f"{type(err).__name__}: {err}"[:300])
        study.tell(trial, state=TrialState.FAIL)
        raise
    if not math.isfinite(value):
        trial.set_user_attr("error", "no validation score")
        study.tell(trial, state=TrialState.FAIL)
        raise DataError(
            f"{search.task.name}: trial {trial.number} has no validation score (every epoch "
            "scored NaN); expected the validation labels to be scorable"
        )
    study.tell(trial, value)
    return trial.number
