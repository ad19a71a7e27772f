"""A hyper-parameter search from start to end (:func:`run_hpopt`): pruned, resumable,
budgeted, and blind to the test split.

What is searched, and how a trial runs blind to the test split:
:mod:`~smiexlm.hpopt.search`. A trial is one fine-tuning run on the train rows,
its validation score reported to the trial after every epoch; the median pruner stops a trial
whose score at an epoch is worse than the median of the completed trials' at that epoch (once
``prune_after`` trials have completed, and never in a trial's first ``warmup_epochs``
epochs). ``finetune --config best.toml`` scores the chosen config on the rows the search
never read.

The study lives in ``OUT/study.sqlite`` (Optuna's RDB storage) and the same command resumes
it: the trial numbers go on, the sampler sees every earlier trial, and a trial left running by
a stopped process (Ctrl-C, kill -9) is marked failed; a failed trial does not count towards
``--trials`` and its CPU time, lost, not towards ``--cpu-minutes``. The TPE sampler is seeded
anew before each trial from (``seed``, trials counted so far), so a resumed study draws the
trial a straight run would have drawn, and the two end with the same trials. A study is
refused when the command's settings (data, split, seed, backbone and its weights' sha256, base
config) differ from those it was started with.

With ``--storage`` (PostgreSQL or a journal file) the study is shared: ``--workers N`` runs
trials in N processes of this machine, and the same command on another machine joins; the
budget is counted once over all of them, a worker that dies has its trial retried, and the
worker that ends the last trial writes ``best.toml`` (:mod:`~smiexlm.hpopt.storage`); the
same command run once the study is over writes it into its own folder where it is missing.

The modules run one way: :mod:`~smiexlm.hpopt.search` (budget, space, the trial
itself) under :mod:`~smiexlm.hpopt.study` (the Optuna study) and
:mod:`~smiexlm.hpopt.report` (the outputs), all three under this one.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

from smiexlm.finetuning.backbone import Backbone
from smiexlm.finetuning.config import FinetuneConfig
from smiexlm.hpopt.config import HpoptConfig
from smiexlm.hpopt.report import Outputs
from smiexlm.hpopt.search import HpoptResult, Search
from smiexlm.hpopt.storage import WORKER_KEY, fail_stale_trials, finished_last, worker_name
from smiexlm.hpopt.study import one_trial, open_study, spending
from smiexlm.moleculenet.task import MoleculeTask
from smiexlm.paths import check_output
from smiexlm.training.runlock import RunLock

logger = logging.getLogger(__name__)


def run_hpopt(
    task: MoleculeTask,
    base: FinetuneConfig,
    out: Path,
    hp: HpoptConfig,
    backbone: Backbone | None = None,
    progress: bool = False,
    on_trial: Callable[[str], None] | None = None,
    command: str | None = None,
    pruner=None,
) -> HpoptResult:
    """Search around ``base`` on ``task`` until ``hp``'s budget is spent;
    the study and its outputs in ``out`` (see the module docstring). ``on_trial`` gets one
    line per finished trial; ``pruner`` replaces the median pruner (Optuna's interface)."""
    out = check_output(out, "--out", "folder")
    # trials score the network alone: a forest (or a wide ensemble) beside it would cost each
    # trial its fit and hide what the search moves; best.toml keeps both for the final fit
    # (and the kernel members, which Search.run leaves out of every trial)
    served = {"forest": base.forest or "none", "ensemble": base.ensemble}
    base = dataclasses.replace(base, forest=None, ensemble="none")
    search = Search.build(task, base, backbone or Backbone(), hp.seed)
    with RunLock(out):
        study = open_study(out, search, hp, pruner)
        outputs = Outputs(out, search, hp, command, served)
        outputs.write(study)  # a resumed study's files brought up to date
        if hp.storage is not None:
            return _shared(study, search, hp, outputs, task, base, backbone, progress, on_trial)
        while (stop := hp.spent(*spending(study))) is None:
            number = one_trial(study, search, hp, progress)
            improved = outputs.write(study, number)
            if on_trial is not None:
                on_trial(outputs.line(study, number, improved))
        return outputs.result(study, stop)


def _shared(study, search: Search, hp: HpoptConfig, outputs: Outputs, task: MoleculeTask,
            base: FinetuneConfig, backbone: Backbone | None, progress: bool,
            on_trial) -> HpoptResult:  # fmt: skip
    """This process and ``hp.workers - 1`` more run trials of the shared study until its
    budget is spent and none runs; ``best.toml`` if one of them ended the last trial."""
    import multiprocessing

    spawn = multiprocessing.get_context("spawn")
    alone = dataclasses.replace(hp, workers=1)
    children = [spawn.Process(target=_worker, args=(task, base, alone, backbone),
                              daemon=False, name=f"hpopt-worker-{i}")
                for i in range(1, hp.workers)]  # fmt: skip
    for child in children:
        child.start()
    try:
        stop = work(study, search, hp, progress, lambda n: _told(study, outputs, n, on_trial))
    except BaseException:  # the workers of a search stopped by an error or an interrupt stop
        for child in children:
            child.terminate()
        raise
    finally:
        for child in children:
            child.join()
    for child in children:
        if child.exitcode != 0:
            logger.warning("hpopt: worker %s (pid %s) stopped with exit code %s; its trial was "
                           "marked failed and the study went on without it", child.name,
                           child.pid, child.exitcode)  # fmt: skip
    names = {worker_name(), *(f"{worker_name().rsplit(':', 1)[0]}:{c.pid}" for c in children)}
    outputs.write(study)
    # the worker that ended the last trial writes best.toml; a command whose workers ran none
    # (the study was over: its finisher stopped before writing it) writes it into its folder
    ran = any(t.user_attrs.get(WORKER_KEY) in names for t in study.get_trials(deepcopy=False))
    if finished_last(study, names) or (not ran and not outputs.has_best()):
        outputs.write_best(study)
    return outputs.result(study, stop)


def _told(study, outputs: Outputs, number: int, on_trial) -> None:
    improved = outputs.write(study, number)
    if on_trial is not None:
        on_trial(outputs.line(study, number, improved))


def work(study, search: Search, hp: HpoptConfig, progress: bool = False,
         after: Callable[[int], None] | None = None) -> str:  # fmt: skip
    """Run trials of a shared study until its budget is spent and no trial runs (one that
    runs may yet fail and be queued again); what stopped it. ``after`` gets each trial's
    number."""
    from optuna.trial import TrialState

    while True:
        fail_stale_trials(study, hp.heartbeat)
        states = [t.state for t in study.get_trials(deepcopy=False)]
        running, waiting = states.count(TrialState.RUNNING), states.count(TrialState.WAITING)
        counted, cpu = spending(study)
        stop = hp.spent(counted, cpu)
        if not waiting and (stop is not None or counted + running >= (hp.trials or math.inf)):
            if stop is not None and not running:
                return stop
            time.sleep(min(hp.heartbeat, 1.0))  # the running trials end, or are retried
            continue
        number = one_trial(study, search, hp, progress)
        if number is not None and after is not None:
            after(number)


def _worker(task: MoleculeTask, base: FinetuneConfig, hp: HpoptConfig,
            backbone: Backbone | None) -> None:  # fmt: skip
    """One more worker process of :func:`_shared`: trials only, no files."""
    import optuna
    import torch

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    search = Search.build(task, base, backbone or Backbone(), hp.seed)
    work(open_study(Path("."), search, hp), search, hp)
