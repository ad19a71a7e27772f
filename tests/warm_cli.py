"""``run_smiexlm`` and ``run_python``: a command in a child process, without paying for imports.

A fresh interpreter spends 3-5 s of a 2-core CI machine importing torch, pandas and RDKit before
a command does anything, and the suite starts a few hundred of them. Here each test process
keeps warm launchers (this file run as a script) that have imported those libraries once and
fork a child per command. The child is a real process: it resets its signals, takes the
command's environment, working directory and standard streams, imports smiexlm afresh (a
launcher never imports it, so nothing of it is shared between commands) and runs the script
(the installed console script, or a benchmark) as ``__main__``, exit code, atexit handlers and
all, as ``subprocess.run`` would.

A launcher stands in only for interpreters started as it was: the variables read when an
interpreter or a preloaded library starts (``PYTHON*``, locale, thread counts, ``TQDM_*``...)
key the launchers, so a command whose values differ gets a launcher of its own. A command goes
to a fresh interpreter (the same call, the same result) when both launchers of its environment
are busy with other threads' commands, off Linux, or with
``SMIEXLM_TESTS_COLD_CLI=1``. Signals, kills and live output are tested with ``Popen`` on the
console script itself, never here.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# what the commands import anyway; smiexlm itself is imported by each child
PRELOAD = ("numpy", "pandas", "torch", "rdkit.Chem", "rdkit.Chem.Descriptors", "safetensors",
           "typer", "tqdm")  # fmt: skip
# variables read when an interpreter or a preloaded library starts: a command whose value
# differs from the launcher's gets a fresh interpreter
_STARTUP_PREFIXES = ("PYTHON", "LANG", "LC_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_",
                     "TORCH", "CUDA", "LD_", "MALLOC_", "TQDM_")  # fmt: skip


def console_script() -> str:
    """The installed ``smiexlm`` console script of the running interpreter's environment."""
    beside = Path(sys.executable).with_name("smiexlm")
    return str(beside) if beside.is_file() else (shutil.which("smiexlm") or "smiexlm")


def run_smiexlm(*args: object, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run([smiexlm, *args], capture_output=True, text=True, ...)``, from a warm
    launcher where one can stand in for a fresh interpreter (keywords: :func:`run_python`)."""
    return run_python(console_script(), *args, **kwargs)


def run_python(
    script: str | Path,
    *args: object,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float | None = 300,
    input: str | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """``subprocess.run([python, script, *args], capture_output=True, text=True, ...)`` (the
    console script is run as itself), from a warm launcher where one can stand in."""
    script, argv = str(script), [str(a) for a in args]
    env = dict(os.environ if env is None else env)
    cwd = str(cwd if cwd is not None else os.getcwd())
    command = [script] if script == console_script() else [sys.executable, script]
    launcher = _Launcher.acquire(env)
    if launcher is None:
        res = subprocess.run([*command, *argv], capture_output=True, text=True, timeout=timeout,
                             env=env, cwd=cwd, input=input)  # fmt: skip
    else:
        try:
            res = launcher.run(script, argv, [*command, *argv], env, cwd, timeout, input)
        finally:
            launcher.lock.release()
    if check:
        res.check_returncode()
    return res


def _startup(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in env.items() if k.startswith(_STARTUP_PREFIXES)))


class _Launcher:
    """The client side: launchers of this test process, by start-up environment, started on
    first use; two at most for each (two commands at once from two threads)."""

    PER_ENVIRONMENT = 2
    _pool: dict[tuple, list[_Launcher]] = {}
    _pool_lock = threading.Lock()
    _broken = False

    @classmethod
    def acquire(cls, env: dict[str, str]) -> _Launcher | None:
        """A launcher for ``env``, locked for the caller; None for a fresh interpreter."""
        if cls._broken or os.environ.get("SMIEXLM_TESTS_COLD_CLI") == "1":
            return None
        if sys.platform != "linux":  # fork and process groups as used here
            return None
        with cls._pool_lock:
            launchers = cls._pool.setdefault(_startup(env), [])
            launchers[:] = [x for x in launchers if x.proc.poll() is None]
            for launcher in launchers:
                if launcher.lock.acquire(blocking=False):
                    return launcher
            if len(launchers) >= cls.PER_ENVIRONMENT:
                return None
            try:
                launcher = cls(env)
            except (OSError, RuntimeError) as err:  # the suite goes on with fresh interpreters
                print(f"warm launcher unavailable ({err}); commands start fresh", file=sys.stderr)
                cls._broken = True
                return None
            launcher.lock.acquire()
            launchers.append(launcher)
            return launcher

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        self.lock = threading.Lock()
        self.scratch = Path(tempfile.mkdtemp(prefix="smiexlm-warm-"))
        self.log = open(self.scratch / "launcher.log", "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=self.env,
                                     bufsize=0)  # fmt: skip
        self.pending = b""
        ready = self._reply(timeout=120)
        if ready.get("ready") is not True:
            raise RuntimeError(f"launcher said {ready}")
        atexit.register(self.close)

    def run(self, script, argv, command, env, cwd, timeout, input) -> subprocess.CompletedProcess:
        """``script`` with ``argv`` in a child; ``command`` is what the result shows as its
        ``args`` (the console script, or ``python script``, and the arguments)."""
        folder = Path(tempfile.mkdtemp(dir=self.scratch))
        streams = {name: folder / name for name in ("stdin", "stdout", "stderr")}
        for name, path in streams.items():
            path.write_text(input or "" if name == "stdin" else "", encoding="locale")
        request = {"argv": argv, "env": env, "cwd": cwd, "script": script,
                   **{name: str(path) for name, path in streams.items()}}  # fmt: skip
        returncode = None
        try:
            self._send(json.dumps(request).encode() + b"\n")
            pid = self._reply(timeout=60)["pid"]
            try:
                returncode = self._reply(timeout)["returncode"]
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self._reply(timeout=60)
            out, err = (_read(streams[name]) for name in ("stdout", "stderr"))
        except BaseException:
            self.close()  # out of step with its replies (interrupted?): the next call starts anew
            raise
        shutil.rmtree(folder, ignore_errors=True)
        if returncode is None:
            raise subprocess.TimeoutExpired(command, timeout, out, err)
        return subprocess.CompletedProcess(command, returncode, out, err)

    def _send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self.proc.stdin.write(view) :]

    def _reply(self, timeout: float | None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                raise subprocess.TimeoutExpired("warm launcher", timeout or 0)
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                log = (self.scratch / "launcher.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the warm launcher exited: {log}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


def _read(path: Path) -> str:
    # as subprocess's text mode reads a child's output: the caller's locale, universal newlines
    return io.TextIOWrapper(io.BytesIO(path.read_bytes()), encoding="locale").read()


# --- the launcher process -------------------------------------------------------------------


def _serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    requests = os.fdopen(os.dup(0), "rb", buffering=0)
    replies = os.fdopen(os.dup(1), "wb", buffering=0)
    null = os.open(os.devnull, os.O_RDWR)  # the children take over 0-2; keep the pipes off them
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    replies.write(b'{"ready": true}\n')
    pending = b""
    while True:
        while b"\n" not in pending:
            chunk = requests.read(65536)
            if not chunk:
                return
            pending += chunk
        line, pending = pending.split(b"\n", 1)
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os._exit(_child(request, (requests.fileno(), replies.fileno())))
        replies.write(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        replies.write(
            json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n"
        )


def _child(request: dict, launcher_fds: tuple[int, ...]) -> int:
    """The command, run as a fresh interpreter would run the console script; its exit code."""
    import runpy
    import traceback

    try:
        os.setpgid(0, 0)  # a timeout kills the command and whatever it started
        for fd in launcher_fds:
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        streams = (
            (0, "stdin", os.O_RDONLY),
            (1, "stdout", os.O_WRONLY),
            (2, "stderr", os.O_WRONLY),
        )
        for fd, name, flags in streams:  # files the caller made
            opened = os.open(request[name], flags)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = sys.__stdin__ = _stream(sys.stdin, 0, "r")
        sys.stdout = sys.__stdout__ = _stream(sys.stdout, 1, "w")
        sys.stderr = sys.__stderr__ = _stream(sys.stderr, 2, "w")
        script = request["script"]
        sys.argv = [script, *request["argv"]]
        sys.path[0] = os.path.dirname(script)  # as for the console script: its folder first
    except BaseException:  # noqa: BLE001 (the launcher cannot set the command up: say why)
        traceback.print_exc()
        return 120
    try:
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # died of SIGINT, as the interpreter does
        code = 130
    except BaseException:  # noqa: BLE001 (an uncaught exception: traceback and exit 1)
        traceback.print_exc()
        code = 1
    _finish()
    return code


def _stream(old: io.TextIOWrapper, fd: int, mode: str) -> io.TextIOWrapper:
    raw = open(fd, mode + "b", closefd=False)  # noqa: SIM115 (the process's own stream)
    return io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors,
                            line_buffering=old.line_buffering)  # fmt: skip


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _finish() -> None:
    """What interpreter shutdown does before exit: join threads, run atexit, flush."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


if __name__ == "__main__":
    _serve()
