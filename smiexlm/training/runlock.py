"""One run per folder: ``RUN/.lock`` names the process that trains in it.

Two ``smiexlm pretrain`` (or a run and a ``--resume``) in one folder would overwrite each
other's checkpoints and interleave their ``metrics.jsonl``. The first takes the lock; the
second stops with :class:`RunInUseError`, naming the owner. The lock is an exclusive
``flock`` on ``RUN/.lock`` (the kernel drops it when its process dies, even on ``kill -9``)
and the file's JSON says who holds it::

    {"pid": 4711, "host": "node3", "started": "2025-01-31T12:00:00+00:00", "proc_start": 81234}

``proc_start`` (the process's start time in clock ticks after boot, Linux) tells a live owner
from a new process that got the dead owner's PID. A lock left by a dead process is taken over
with a warning. Only the main process of a run locks (rank 0, or the launcher of
``--nproc`` workers); the lock goes at exit, with the run folder (and the parents it made)
when the run left it empty. :func:`hold_outputs` holds the outputs of ``finetune``,
``benchmark`` and ``predict`` the same way, a file by a lock beside it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import logging
import os
import socket
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from smiexlm.errors import SmiexlmError
from smiexlm.paths import check_output
from smiexlm.training.ranks import takes_locks

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"


class RunInUseError(SmiexlmError, RuntimeError):
    """Another live process trains in the run folder."""


@dataclass(frozen=True)
class LockOwner:
    pid: int
    host: str
    started: str  # ISO time the lock was taken
    proc_start: int | None = None  # /proc/PID/stat start time (Linux): PID reuse check

    @classmethod
    def me(cls) -> LockOwner:
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        return cls(os.getpid(), socket.gethostname(), now, _process_start(os.getpid()))

    def lives_here(self) -> bool:
        """True when the owner is a running process of this host (False when unknowable)."""
        if self.host != socket.gethostname():
            return False
        if Path("/proc/self/stat").is_file():
            start = _process_start(self.pid)
            return start is not None and self.proc_start in (None, start)
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # alive, owned by another user
            return True
        return True

    def describe(self) -> str:
        return f"process {self.pid} on host {self.host!r} (since {self.started})"


def _process_start(pid: int) -> int | None:
    """Start time of a running process (clock ticks after boot); None if gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # after the command name: state is field 3
    if len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22, starttime


def _read_owner(fd: int) -> LockOwner | None:
    try:
        doc = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return LockOwner(**doc)
    except (ValueError, TypeError, UnicodeDecodeError):  # empty, or written half-way
        return None


def _try_flock(fd: int) -> bool | None:
    """Take the exclusive flock: True, False when another process holds it, None when the
    file system has no locks (the owner's PID then decides alone)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as err:
        if err.errno in (errno.EAGAIN, errno.EACCES):
            return False
        return None
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist yet, the deepest first."""
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


class RunLock:
    """``with RunLock(run_dir):`` (or ``acquire()`` … ``release()``) — hold ``run_dir/.lock``
    (``run_dir/name``), or raise :class:`RunInUseError` naming the live process that holds
    it; ``what`` names the locked output in that message (the run folder by default)."""

    def __init__(self, run_dir: Path, name: str = LOCK_FILE, what: str | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / name
        self.what = what or f"run folder {str(self.run_dir)!r}"
        self._fd: int | None = None
        self._made: list[Path] = []  # the folders acquire made, the deepest first

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> RunLock:
        self._made = _missing_folders(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        while self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                owner = self._check(fd)
            except BaseException:
                os.close(fd)
                self._remove_folder_if_made()
                raise
            if _same_file(fd, self.path):  # else its owner deleted it meanwhile: open anew
                self._fd = fd
            else:
                os.close(fd)
        if owner is not None:
            logger.warning(
                "%s: taking over the lock of %s, which has ended", self.path, owner.describe()
            )
        payload = json.dumps(asdict(LockOwner.me())).encode("utf-8")
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, payload, 0)
        return self

    def _check(self, fd: int) -> LockOwner | None:
        """The previous (dead) owner, or None; raises when a live one holds the lock."""
        locked = _try_flock(fd)
        owner = _read_owner(fd)
        if locked is False or (owner is not None and owner.lives_here()):
            who = owner.describe() if owner is not None else "another process"
            raise RunInUseError(
                f"{self.what} is in use by {who} ({self.path.name} in {str(self.run_dir)!r}): "
                "wait for that run to end or stop it; two runs writing one output at once "
                "would overwrite each other's results"
            )
        return owner

    def release(self) -> None:
        """Give the lock up (nothing when not held); an empty folder it made goes too."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            if _same_file(self._fd, self.path):
                self.path.unlink()
        os.close(self._fd)  # releases the flock
        self._fd = None
        self._remove_folder_if_made()

    def _remove_folder_if_made(self) -> None:
        for folder in self._made:
            try:
                folder.rmdir()
            except OSError:  # not empty: the run wrote something
                break
        self._made = []


@contextlib.contextmanager
def hold_outputs(outputs: Sequence[tuple[str, Path, Literal["file", "folder"]]]) -> Iterator[None]:
    """Hold each ``(option, path, kind)`` output of a command while the block runs, so that
    a second run into it is refused naming the first (:class:`RunInUseError`) instead of
    mixing its results with the first's; in the job's main process only
    (:func:`~smiexlm.training.ranks.takes_locks`).

    A folder is held by its own ``.lock``. A file is held by ``.NAME.lock`` beside it, not
    by a lock of its folder: other runs writing other files there are no conflict, and the
    file's folder may be shared by anything. (A file is written at its run's end in one
    rename, yet two runs into it would both compute and the later would silently replace
    the result the earlier has just reported written.) Each path is checked first
    (:func:`smiexlm.paths.check_output`), so that a file where a folder is expected is named
    as such, not met by the lock."""
    if not outputs or not takes_locks():
        yield
        return
    with contextlib.ExitStack() as stack:
        for option, path, kind in outputs:
            path = check_output(path, option, kind)
            what = f"{option} {str(path)!r}"
            lock = (RunLock(path, what=what) if kind == "folder"
                    else RunLock(path.parent, f".{path.name}.lock", what))  # fmt: skip
            stack.enter_context(lock)
        yield
