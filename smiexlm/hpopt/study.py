"""The study of :mod:`smiexlm.hpopt.run` in its SQLite file: opened or resumed, one
trial asked, run and told, the budget spent so far.

Only the process holding the run folder's lock (:class:`~smiexlm.training.runlock.RunLock`)
opens the study, so a trial found RUNNING when it opens was left by a process that stopped
(Ctrl-C, kill -9, a reboot): it is marked failed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.errors import DataError
from smiexlm.finetuning.state import as_kept
from smiexlm.hpopt.config import HpoptConfig
from smiexlm.hpopt.search import STUDY_FILE, STUDY_NAME, Search

COUNTED_STATES = ("COMPLETE", "PRUNED")  # the trials that spend the --trials budget


def open_study(out: Path, search: Search, hp: HpoptConfig, pruner=None):
    """The study in ``out/study.sqlite``: made, or resumed after its settings are checked
    against the folder's (DataError naming the first that differs); trials left running are
    marked failed. ``pruner``: the median pruner unless given."""
    import optuna
    from optuna.trial import TrialState

    storage = optuna.storages.RDBStorage(f"sqlite:///{Path(out).resolve() / STUDY_FILE}")
    if pruner is None:
        pruner = optuna.pruners.MedianPruner(hp.prune_after, hp.warmup_epochs)
    study = optuna.create_study(storage=storage, study_name=STUDY_NAME, pruner=pruner,
                                direction=search.direction, load_if_exists=True)  # fmt: skip
    identity = search.identity(hp)
    saved = study.user_attrs.get("identity")
    if saved is None:
        study.set_user_attr("identity", identity)
    elif (saved := as_recorded(saved)) != (identity := as_kept(identity, saved)):
        key, then, now = first_difference(saved, identity)
        raise DataError(
            f"--out {str(out)!r} holds a search with {key} = {then!r}, not {now!r}: run the "
            "command that started it to resume it, or give another --out"
        )
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


def sampler_for(seed: int, counted: int, startup_trials: int):
    """TPE seeded from (``seed``, trials counted so far): the same point for the same history,
    whether the study ran straight or was resumed (one sampler for the whole process would
    restart its random stream at each resume and draw the first points again)."""
    import optuna

    state = int(np.random.SeedSequence([seed, counted]).generate_state(1)[0])
    return optuna.samplers.TPESampler(seed=state, n_startup_trials=startup_trials,
                                      constant_liar=False)  # fmt: skip


def one_trial(study, search: Search, hp: HpoptConfig, progress: bool = False) -> int:
    """Ask a trial (the base config first), run it and tell its end; its number. An error (or
    an interrupt) marks it failed and goes on up."""
    from optuna import TrialPruned
    from optuna.trial import TrialState

    counted, _ = spending(study)
    study.sampler = sampler_for(hp.seed, counted, hp.startup_trials)
    if counted == 0 and not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        study.enqueue_trial(search.space.params_of(search.base))  # trial 0: the Table 8 row
    trial = study.ask()
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
