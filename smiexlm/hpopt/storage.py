"""Where a search's study lives, and how several workers share one.

``--storage`` names it: none (the embedded default, ``OUT/study.sqlite``, one worker, no
server), ``postgresql://USER:PASSWORD@HOST:PORT/DB`` (a PostgreSQL server, through
``psycopg``: ``pip install 'smiexlm[postgres]'``), or ``journal:PATH`` (Optuna's journal
file: append-only, for workers on one machine or on a file system with working locks).
SQLite under several writers fails, so ``--workers N`` above 1 needs one of the other two.

Workers that share a study see each other only through it:

- **the budget, once**: a worker asks a trial only while the counted, running and queued
  trials are below ``--trials``, and after asking checks that fewer than ``--trials``
  trials numbered below its own still count or run; a trial drawn in the same instant as
  another's last one is given up (failed, noted ``surplus``), so two workers never spend
  the budget twice. ``--cpu-minutes`` counts finished trials, so each worker may start one
  trial past it;
- **heartbeats**: each running trial records the time every ``--heartbeat`` seconds; a
  trial silent for three of them belongs to a worker that died (SIGKILL, a lost node): any
  worker marks it failed and queues its point again, so it is retried;
- **one finisher**: when the budget is spent and no trial runs, the worker that told the
  last trial to end writes ``best.toml``; the others leave it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from smiexlm.errors import ConfigError, DataError, first_line

STUDY_NAME, STUDY_FILE = "hpopt", "study.sqlite"
JOURNAL = "journal:"
HEARTBEAT_KEY, WORKER_KEY, INTERVAL_KEY = "heartbeat", "worker", "heartbeat_s"
BASE_KEY = "base_point"  # on trial 0, Table 8's row, queued once by whichever worker came first
STALE_BEATS = 3  # a trial silent for this many heartbeats is taken for dead


def worker_name() -> str:
    """``host:pid`` of this process, recorded on each trial it runs."""
    return f"{socket.gethostname()}:{os.getpid()}"


def shown(url: str) -> str:
    """``url`` without credentials or query, for messages: ``SCHEME://HOST:PORT/DB``; the
    host is what follows the last ``@``, so a password holding one is not shown either."""
    if url.startswith(JOURNAL):
        return url
    scheme, sep, rest = url.partition("://")
    if not sep:  # not a URL at all: what comes before a colon (a password may follow it)
        head = url.split(":", 1)[0]
        return head + (":..." if head != url else "")
    netloc, _, path = rest.partition("/")
    return f"{scheme}://{netloc.rpartition('@')[2]}/{path.split('?', 1)[0]}"


def _without_secrets(reason: str, url: str) -> str:
    """A driver's ``reason`` for failing on ``url``, or a hint in its place where it quotes a
    piece of the URL's password (an unescaped ``@`` makes the driver read the rest as the
    host)."""
    userinfo = url.partition("://")[2].partition("/")[0].rpartition("@")[0]
    password = userinfo.partition(":")[2]
    pieces = [p for p in password.replace(":", "@").split("@") if p]
    if any(piece in reason for piece in pieces):
        return ("the driver's reason quotes the password; a password holding @, : or / must "
                "be percent-encoded in the URL")  # fmt: skip
    return reason


def check_storage(storage: str | None, workers: int) -> None:
    """ConfigError unless ``storage`` is none, a PostgreSQL URL or ``journal:PATH``, and
    ``workers`` is 1 on the embedded SQLite study."""
    if storage is not None and not storage.startswith(("postgresql://", "postgresql+", JOURNAL)):
        raise ConfigError("--storage", shown(storage), "postgresql://USER:PASSWORD@HOST:PORT/DB "
                          "or journal:PATH (none: the embedded OUT/study.sqlite)")  # fmt: skip
    if storage is not None and storage.startswith(JOURNAL) and not storage[len(JOURNAL) :]:
        raise ConfigError("--storage", storage, "journal:PATH, naming the journal file")
    if workers > 1 and storage is None:
        raise ConfigError("--workers", workers, "1 with the embedded SQLite study (it takes one "
                          "writer): give --storage postgresql://... or --storage journal:PATH "
                          "for several workers")  # fmt: skip


def open_storage(storage: str | None, out: Path) -> Any:
    """The Optuna storage ``storage`` names (see the module docstring), reached once: a
    server that does not answer is a DataError naming it, without its credentials."""
    import optuna

    if storage is None:
        return optuna.storages.RDBStorage(f"sqlite:///{Path(out).resolve() / STUDY_FILE}")
    if storage.startswith(JOURNAL):
        from optuna.storages.journal import JournalFileBackend

        path = Path(storage[len(JOURNAL) :]).expanduser()
        if not path.parent.is_dir():
            why = "is not a folder" if path.parent.exists() else "does not exist"
            raise DataError(f"--storage {storage!r}: {str(path.parent)!r} {why}; expected "
                            "the journal file's folder")  # fmt: skip
        _check_journal(path, storage)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    try:
        import psycopg  # noqa: F401  (SQLAlchemy's PostgreSQL driver)
    except ModuleNotFoundError:
        raise DataError(f"--storage {shown(storage)!r} needs psycopg: pip install "
                        "'smiexlm[postgres]'") from None  # fmt: skip
    try:
        return optuna.storages.RDBStorage(
            storage, engine_kwargs={"pool_pre_ping": True, "connect_args": {"connect_timeout": 10}}
        )
    except Exception as err:  # sqlalchemy's OperationalError, a bad database name...
        reason = _without_secrets(first_line(getattr(err, "orig", err)), storage)
        raise DataError(f"--storage {shown(storage)!r}: cannot open the study database "
                        f"({reason}); expected a PostgreSQL server that answers") from None  # fmt: skip


def _check_journal(path: Path, storage: str) -> None:
    """DataError unless ``path`` is new, empty or an Optuna journal (each line a JSON record
    of one operation): any other file (a table, the --data itself) is never appended to."""
    import json

    if path.is_dir():
        raise DataError(f"--storage {storage!r}: {str(path)!r} is a folder; expected a file")
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, "rb") as handle:
        first = handle.readline(1 << 20)
    try:
        record = json.loads(first)
    except ValueError:
        record = None
    if not isinstance(record, dict) or "op_code" not in record:
        raise DataError(f"--storage {storage!r}: {str(path)!r} is not an Optuna journal (its "
                        "first line is no journal record); expected a journal hpopt wrote, or "
                        "a new file")  # fmt: skip


class Heartbeat:
    """Records ``time.time()`` on a running trial every ``interval`` seconds, from a daemon
    thread, until :meth:`stop`."""

    def __init__(self, trial, interval: float):
        self.trial, self.interval = trial, interval
        self._stop = threading.Event()
        trial.set_user_attr(WORKER_KEY, worker_name())
        trial.set_user_attr(INTERVAL_KEY, interval)  # judged by its own, not the checker's
        self._beat()
        self._thread = threading.Thread(target=self._run, daemon=True, name="hpopt-heartbeat")
        self._thread.start()

    def _beat(self) -> None:
        self.trial.set_user_attr(HEARTBEAT_KEY, time.time())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._beat()
            except Exception:  # the trial ended meanwhile, or the server blinked: next beat
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def fail_stale_trials(study, interval: float) -> list[int]:
    """Mark failed each running trial silent for :data:`STALE_BEATS` of its heartbeats
    (its worker died) and queue its point again; their numbers. A trial that has not beaten
    yet (its worker died between drawing it and the first beat) is judged from its start,
    and a trial's heartbeat is its own worker's ``--heartbeat`` (``interval`` until it says)."""
    from optuna.trial import TrialState

    now, failed = time.time(), []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        beat = trial.user_attrs.get(HEARTBEAT_KEY)
        if beat is None and trial.datetime_start is not None:
            beat = trial.datetime_start.timestamp()
        own = float(trial.user_attrs.get(INTERVAL_KEY, interval))
        if beat is None or now - float(beat) < STALE_BEATS * max(own, interval):
            continue
        try:
            study._storage.set_trial_user_attr(
                trial._trial_id,
                "error",
                f"its worker stopped beating ({trial.user_attrs.get(WORKER_KEY)})",
            )
            if not study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL):
                continue
        except Exception:  # another worker marked it first
            continue
        study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number},
                            skip_if_exists=False)  # fmt: skip
        failed.append(trial.number)
    return failed


def surplus(study, trial, budget: int | None) -> str | None:
    """Why ``trial``, just asked, must be given up (None: it runs): it is beyond the
    ``--trials`` budget (that many trials numbered below it already count or run, drawn by
    other workers in the same instant), or it is Table 8's row queued a second time by a
    worker that started in the same instant as the first."""
    trials = study.get_trials(deepcopy=False)
    if trial.user_attrs.get(BASE_KEY):
        first = min(t.number for t in trials if t.user_attrs.get(BASE_KEY))
        if first < trial.number:
            return f"surplus: trial {first} runs the same base point"
    if budget is None:
        return None
    alive = ("COMPLETE", "PRUNED", "RUNNING")
    below = [t for t in trials if t.number < trial.number and t.state.name in alive]
    return "surplus: the budget was taken by other workers" if len(below) >= budget else None


def finished_last(study, names: set[str]) -> bool:
    """Whether the trial that ended last (among those that count) ran in one of the workers
    ``names``: the one that writes ``best.toml``."""
    ended = [t for t in study.get_trials(deepcopy=False)
             if t.state.name in ("COMPLETE", "PRUNED") and t.datetime_complete is not None]  # fmt: skip
    if not ended:
        return False
    last = max(ended, key=lambda t: (t.datetime_complete, t.number))
    return last.user_attrs.get(WORKER_KEY) in names
