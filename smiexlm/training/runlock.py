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
``--nproc`` workers); the lock goes at exit, with the run folder when the run left it empty.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import logging
import os
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

from smiexlm.errors import SmiexlmError

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


class RunLock:
    """``with RunLock(run_dir):`` (or ``acquire()`` … ``release()``) — hold ``run_dir/.lock``,
    or raise :class:`RunInUseError` naming the live process that holds it."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None
        self._made_folder = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> RunLock:
        self._made_folder = not self.run_dir.exists()
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
                f"run folder {str(self.run_dir)!r} is in use by {who} ({LOCK_FILE} there): wait "
                "for that run to end or stop it; two runs in one folder would overwrite each "
                "other's checkpoints"
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
        if self._made_folder:
            with contextlib.suppress(OSError):  # not empty: the run wrote something
                self.run_dir.rmdir()
