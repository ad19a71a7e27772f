"""Atomic outputs: every file or folder smiexlm writes appears whole under its final name or
not at all, however the writer dies (an exception, Ctrl-C, ``kill -9``), and what a killed
writer left behind is found and removed (:func:`remove_stale_temporaries`)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smiexlm.errors import DataError, as_os_error


# Every output is first written under a temporary name beside its final one. Those names live
# in folders made with ``mkdtemp`` (created exclusively, mode 0700, a name nobody can guess),
# so that no one else who may write to the output folder can plant a link where a temporary
# will be opened: the writer never opens a path that someone else made.
def _private_folder(final: Path, kind: str = "tmp") -> Path:
    """A new folder ``.<name>.<kind>-<PID>-<random>`` beside ``final``, made exclusively."""
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.{kind}-{os.getpid()}-", dir=final.parent))


def is_temporary_name(name: str) -> bool:
    """Whether ``name`` is one the atomic writers make (left behind by a killed run)."""
    return name.startswith(".") and (".tmp-" in name or ".old-" in name)


def remove_path(path: Path) -> None:
    """Remove a file, a link (never what it points to) or a whole folder."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:  # never one of ours; 0 would mean "my process group" to kill()
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def remove_stale_temporaries(path: str | Path) -> int:
    """Remove what killed writers of ``path`` left beside it; the number removed.

    A ``kill -9`` skips every cleanup, leaving the private folders of :func:`atomic_paths` and
    :func:`atomic_dir` (``.emb.npy.tmp-PID-xxxxxxxx``, ``.model.old-PID-xxxxxxxx``). Those
    whose process no longer runs on this machine are deleted (a planted link only unlinked);
    those of live processes (another run writing the same output right now) are left alone.
    """
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(?:tmp|old)-(\d+)-[A-Za-z0-9_]+")
    if not path.parent.is_dir():
        return 0
    removed = 0
    for entry in path.parent.iterdir():
        match = pattern.fullmatch(entry.name)
        if not match or _pid_alive(int(match.group(1))):
            continue
        remove_path(entry)
        removed += 1
    return removed


def _umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def _follow_umask(path: Path) -> None:
    """Give ``path`` (a file, or a folder and all it holds) the mode that ``open`` and
    ``mkdir`` give: 0666 / 0777 less the umask. Some writers (safetensors' ``save_file``)
    create files 0600, and an output should be as readable as every other."""
    mask = _umask()
    for entry in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if not entry.is_symlink():
            entry.chmod((0o777 if entry.is_dir() else 0o666) & ~mask)


def _fsync(path: Path) -> None:
    if path.is_file():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())


# A SIGINT/SIGTERM handler that raises (Ctrl-C's KeyboardInterrupt, the CLI's SystemExit)
# fires between any two bytecodes of the main thread, so no ``finally`` alone can promise that
# a temporary goes: the signal may come before the cleanup is armed, or during it. While an
# atomic write is in progress the handler is therefore :func:`_on_signal`. In the steps that
# must finish as one (making and recording a private folder, the renames, the cleanup) it holds
# the signal and delivers it when they are done; at any other moment it delivers it at once
# and, when the handler it stands in for raises, first removes the temporaries of every write
# in progress, whatever code the exception then unwinds through. Signals reach only the main
# thread's Python code, so writes in other threads need none of this; a ``kill -9`` leaves its
# temporaries to :func:`remove_stale_temporaries`.
@dataclass(eq=False)
class _Write:
    """One atomic write: its private folders, whether it holds signals, whether a signal
    removed its temporaries, and whether the signal machinery knows it (main thread only)."""

    folders: list[Path] = field(default_factory=list)
    held: bool = True
    aborted: bool = False
    tracked: bool = False


class _Writes:
    """The main thread's writes in progress, the signals they hold, the handlers they stand in
    for."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}  # kept: a handler restored later may be ours again
        self.reset()

    def reset(self) -> None:  # also in a forked child: its parent's writes are not its own
        self.pid = os.getpid()
        self.active: list[_Write] = []
        self.pending: list[tuple[int, Any]] = []
        self.aborting = False

    def holding(self) -> bool:
        return self.aborting or any(write.held for write in self.active)


_writes = _Writes()
_HELD = (signal.SIGINT, signal.SIGTERM)


def _on_signal(signum: int, frame: Any) -> None:
    if _writes.pid != os.getpid():
        _writes.reset()
    elif _writes.holding():
        _writes.pending.append((signum, frame))
        return
    _deliver(signum, frame)


def _deliver(signum: int, frame: Any) -> None:
    """Do what the handler ``_on_signal`` stands in for does; if that ends the run, remove the
    temporaries of the writes in progress first."""
    handler = _writes.previous.get(signum, signal.SIG_DFL)
    if not callable(handler):  # the default action: the process ends without unwinding
        _abort()
        _restore_handlers()
        signal.raise_signal(signum)
        return
    try:
        handler(signum, frame)
    except BaseException:
        _abort()
        raise


def _abort() -> None:
    """Remove the temporaries of every write in progress (a signal ends them all)."""
    _writes.aborting = True  # a second signal meanwhile waits
    try:
        for write in _writes.active:
            write.aborted = True
            for folder in write.folders:
                shutil.rmtree(folder, ignore_errors=True)
        _writes.active.clear()
        _writes.pending.clear()
    finally:
        _writes.aborting = False


def _restore_handlers() -> None:
    for sig, handler in _writes.previous.items():
        if signal.getsignal(sig) is _on_signal:  # not one installed since
            signal.signal(sig, handler)


def _begin() -> _Write:
    """A new write, holding signals until :func:`_release`."""
    write = _Write()
    if threading.current_thread() is not threading.main_thread():
        return write
    if _writes.pid != os.getpid():
        _writes.reset()
    for sig in _HELD:
        current = signal.getsignal(sig)
        if current is not _on_signal and current not in (signal.SIG_IGN, None):
            _writes.previous[sig] = current
            signal.signal(sig, _on_signal)
    write.tracked = True
    _writes.active.append(write)
    return write


def _deliver_pending() -> None:
    while _writes.pending and not _writes.holding():
        _deliver(*_writes.pending.pop(0))


def _release(write: _Write) -> None:
    """From here a signal interrupts ``write`` (and removes its temporaries)."""
    write.held = False
    if write.tracked:
        _deliver_pending()


def _hold(write: _Write, final: Path) -> None:
    """From here a signal waits until ``write`` ends; an error if one already ended it."""
    write.held = True
    if write.aborted:  # the block went on after the interrupt that removed its temporaries
        raise InterruptedError(errno.EINTR, "interrupted while written, nothing kept", str(final))


def _end(write: _Write) -> None:
    """Remove what is left of ``write``'s temporaries, then deliver the signals it held."""
    write.held = True
    try:
        for folder in write.folders:
            shutil.rmtree(folder, ignore_errors=True)
    finally:
        if write.tracked:
            if write in _writes.active:
                _writes.active.remove(write)
            if not _writes.active:
                _restore_handlers()
            _deliver_pending()


@contextmanager
def _naming_faults(path: Path) -> Iterator[None]:
    """An OS fault raised while ``path`` is written that names no file of its own (a write
    through an open handle, or a writer that reports it as text) becomes an ``OSError``
    naming ``path``."""
    try:
        yield
    except Exception as err:
        fault = as_os_error(err, path)
        if fault is None or fault.filename == getattr(err, "filename", None):
            raise
        raise fault from err


_INPUTS: list[Path] = []  # the input files of the running command: never written over


def protect_inputs(paths: list[Path]) -> None:
    """Make the atomic writers refuse to replace any of ``paths`` (a command's input files),
    whatever name the command writes under: the last guard where a check of the output
    options cannot know every file a job writes into its folder."""
    _INPUTS[:] = [Path(p) for p in paths if Path(p).is_file()]


def same_place(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file or folder: the same path once links are resolved, or
    a hard link of it. False when either does not exist."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_not_an_input(final: Path) -> None:
    """Refuse a final name that is a job's input, or a device, FIFO or socket (a rename onto
    ``/dev/null`` as root would replace the system's node with a file)."""
    if os.path.exists(final) and not (final.is_file() or final.is_dir()):
        raise DataError(f"{str(final)!r} is not a regular file (a device, a FIFO or a socket): "
                        "nothing was written over it; expected a file name")  # fmt: skip
    for source in _INPUTS:
        if same_place(final, source):
            raise DataError(f"{str(final)!r} is the input {str(source)!r}: writing the result "
                            "there would replace it, so nothing was written over it; expected "
                            "an input outside the output folder")  # fmt: skip


@contextmanager
def atomic_paths(*paths: str | Path) -> Iterator[list[Path]]:
    """Temporary names to write ``paths`` under; renamed into place together on success.

    Every output goes to a temporary name beside its final one (in a private folder of its
    own, under the final file name, so that writers which pick a format from the suffix, such
    as ``savefig``, still work), is flushed to disk, and is renamed only when the block
    finishes without error, so a reader never sees a partial file and an interrupt never
    destroys the previous result. A temporary the block did not write leaves its final name
    alone. The renames of several files run with Ctrl-C and SIGTERM held, so they land as one
    unit. On error or a signal, at any moment, the temporaries are removed and the final names
    are left untouched; what a killed run left is removed first
    (:func:`remove_stale_temporaries`). Each output gets the mode the umask gives.
    """
    finals = [Path(p) for p in paths]
    for final in finals:
        _check_not_an_input(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(final)
    write = _begin()
    try:
        for final in finals:
            write.folders.append(_private_folder(final))
        tmps = [folder / final.name for folder, final in zip(write.folders, finals, strict=True)]
        _release(write)
        with _naming_faults(finals[0]):
            yield tmps
        for tmp in tmps:
            _fsync(tmp)
            if tmp.exists():
                _follow_umask(tmp)
        _hold(write, finals[0])
        for tmp, final in zip(tmps, finals, strict=True):
            if tmp.exists():
                os.replace(tmp, final)
    finally:
        _end(write)


@contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``final``; on success it replaces ``final`` in one
    rename, so the folder appears complete or not at all (each file with the mode the umask
    gives). On error or a signal, at any moment, it is removed."""
    final = Path(final)
    if os.path.lexists(final) and not final.is_dir():  # a folder replaces a folder, not a file
        raise DataError(f"{str(final)!r} is a file, not a folder: nothing was written over it; "
                        "expected a folder name")  # fmt: skip
    for source in _INPUTS:  # a folder replaced whole takes what it held with it
        if final.is_dir() and source.resolve().is_relative_to(final.resolve()):
            raise DataError(f"{str(final)!r} holds the input {str(source)!r}: replacing the "
                            "folder would remove it, so nothing was written; expected an input "
                            "outside the output folder")  # fmt: skip
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final)
    write = _begin()
    try:
        write.folders.append(tmp := _private_folder(final))
        _release(write)
        with _naming_faults(final):
            yield tmp
        _follow_umask(tmp)
        _hold(write, final)
        _swap_in(tmp, final, write)
    finally:
        _end(write)


def _swap_in(tmp: Path, final: Path, write: _Write) -> None:
    """Rename ``tmp`` to ``final``; a previous ``final`` goes to a private folder of ``write``
    (removed with it) and comes back if the new one cannot take its place."""
    if not os.path.lexists(final):
        os.replace(tmp, final)
        return
    write.folders.append(holder := _private_folder(final, "old"))
    os.replace(final, holder / final.name)
    try:
        os.replace(tmp, final)
    except BaseException:
        os.replace(holder / final.name, final)
        raise


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """One temporary name for ``path``; see :func:`atomic_paths`."""
    with atomic_paths(path) as (tmp,):
        yield tmp


def write_bytes_atomic(path: str | Path, payload: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(payload)
    return Path(path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))
