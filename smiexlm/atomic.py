"""Atomic outputs: every file or folder smiexlm writes appears whole under its final name or
not at all, however the writer dies (an exception, Ctrl-C, ``kill -9``), and what a killed
writer left behind is found and removed (:func:`remove_stale_temporaries`)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from smiexlm.errors import as_os_error


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


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM (delivered on exit), so that several renames happen as one."""
    mask = getattr(signal, "pthread_sigmask", None)
    if mask is None:  # pragma: no cover - not POSIX
        yield
        return
    held = {signal.SIGINT, signal.SIGTERM}
    previous = mask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        mask(signal.SIG_SETMASK, previous)


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


@contextmanager
def atomic_paths(*paths: str | Path) -> Iterator[list[Path]]:
    """Temporary names to write ``paths`` under; renamed into place together on success.

    Every output goes to a temporary name beside its final one (in a private folder of its
    own, under the final file name, so that writers which pick a format from the suffix, such
    as ``savefig``, still work), is flushed to disk, and is renamed only when the block
    finishes without error, so a reader never sees a partial file and an interrupt never
    destroys the previous result. A temporary the block did not write leaves its final name
    alone. The renames of several files run with Ctrl-C and SIGTERM held, so they land as one
    unit. On error the temporaries are removed and the final names are left untouched; what a
    killed run left is removed first (:func:`remove_stale_temporaries`). Each output gets the
    mode the umask gives.
    """
    finals = [Path(p) for p in paths]
    folders: list[Path] = []
    try:
        for final in finals:
            final.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(final)
            folders.append(_private_folder(final))
        tmps = [folder / final.name for folder, final in zip(folders, finals, strict=True)]
        with _naming_faults(finals[0]):
            yield tmps
        for tmp in tmps:
            _fsync(tmp)
            if tmp.exists():
                _follow_umask(tmp)
        with _signals_deferred():
            for tmp, final in zip(tmps, finals, strict=True):
                if tmp.exists():
                    os.replace(tmp, final)
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def atomic_dir(final: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``final``; on success it replaces ``final`` in one
    rename, so the folder appears complete or not at all (each file with the mode the umask
    gives). On error it is removed."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(final)
    tmp = _private_folder(final)
    try:
        with _naming_faults(final):
            yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _follow_umask(tmp)
    if os.path.lexists(final):
        holder = _private_folder(final, "old")  # the previous result, until the new one is in
        os.replace(final, holder / final.name)
        os.replace(tmp, final)
        shutil.rmtree(holder, ignore_errors=True)
    else:
        os.replace(tmp, final)


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
