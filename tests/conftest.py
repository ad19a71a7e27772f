"""Shared fixtures.

Tests that read the shared datasets take the ``shared_data`` fixture, which marks them
``data``. Without the datasets (``SMIEXLM_DATA`` unset, or a folder or file missing) such a
test *fails*, never skips: a run that silently skipped the data tests would prove nothing.

The suite runs on pytest-xdist (``-n auto`` in pyproject.toml): one worker per usable core, at
most :data:`MAX_WORKERS`, a test module's tests on one worker (its module fixtures are built
once). Each worker, and every process a test starts, runs torch on one thread, so that the
workers share the cores instead of fighting over them; ``-n 0`` runs in one process as before.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

from tests.warm_cli import console_script as smiexlm_command  # noqa: F401 (used by tests)

#: workers of ``-n auto`` at most (each holds torch, RDKit and the tests' models in memory)
MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    from smiexlm.training.workers import usable_cores

    return min(MAX_WORKERS, usable_cores())


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one thread per worker and per child process
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "shared_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.data)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    value = os.environ.get("SMIEXLM_DATA")
    if not value:
        pytest.fail("SMIEXLM_DATA is not set: this test reads the shared datasets; set it to "
                    "the folder holding moleculenet/, pretrain/, glue/ and text/")  # fmt: skip
    path = Path(value)
    if not path.is_dir():
        pytest.fail(f"SMIEXLM_DATA={value!r} is set but is not a directory")
    return path


def require_file(root: Path, relative: str) -> Path:
    """The file ``root/relative``, failing the test (not skipping) when it is missing."""
    path = root / relative
    if not path.is_file():
        pytest.fail(f"shared data file missing: {relative} (under SMIEXLM_DATA)")
    return path


def some_data(shared: Path, folder: Path, files: tuple[str, ...]) -> Path:
    """``folder`` laid out as the shared data folder ``shared``, holding only ``files``
    (relative paths, linked), for a run that reads every file of a kind (such as the
    MoleculeNet exclusion keys) and needs only a few."""
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if not (folder / name).exists():
            (folder / name).symlink_to(require_file(shared, name))
    return folder


@pytest.fixture()
def data_file(shared_data: Path):
    """``data_file("moleculenet/bbbp.csv")`` -> Path, failing when the file is missing."""
    return lambda relative: require_file(shared_data, relative)


def free_port() -> int:
    """A TCP port of this machine that no one listens on now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_command(n: int) -> list[str]:
    """``torchrun`` of ``n`` local processes (a free port each time) running the installed
    ``smiexlm`` console script: append the command's words."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--no-python",
            smiexlm_command()]  # fmt: skip


def kill_after_two_train_shards(proc, out: Path, timeout: float = 60) -> None:
    """SIGKILL a running ``preprocess`` into ``out`` once two train shards are committed and
    the run is not complete; fails when it finished first."""
    import json
    import os
    import signal
    import time

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            state = json.loads((out / "progress.json").read_text())
        except (OSError, ValueError):
            state = None
        if state and len(state["state"]["shards"]["train"]) >= 2 and not state["complete"]:
            os.kill(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -9, "the run finished before it could be killed"


def _process_table() -> dict[int, tuple[int, bytes]]:
    """Every process of the machine: pid -> (parent pid, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                found[int(entry.name)] = (ppid, (entry / "cmdline").read_bytes())
            except (OSError, IndexError, ValueError):
                continue
    return found


def _with_descendants(chosen: set[int]) -> set[int]:
    procs = _process_table()
    chosen = set(chosen)
    grown = True
    while grown:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in chosen} - chosen
        chosen |= more
        grown = bool(more)
    chosen.discard(os.getpid())
    return chosen


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant at once, as a machine that dies would: also
    the children that left its session (torchrun starts each worker in a session of its
    own, so killing the launcher's group leaves its worker running)."""
    import signal

    for each in _with_descendants({pid}):
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def stop_processes_of(marker: str, timeout: float = 30) -> None:
    """End every process whose command line holds ``marker`` (a Ray cluster's temporary
    folder: its GCS, raylets and agents), with their children (the workers Ray renamed
    ``ray::...``): SIGTERM, then SIGKILL what is left. Unlike ``ray stop``, it leaves any
    other Ray cluster of the machine alone."""
    import signal
    import time

    marked = {pid for pid, (_, cmd) in _process_table().items() if marker.encode() in cmd}
    chosen = _with_descendants(marked)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in chosen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.time() + timeout / 2
        while time.time() < deadline and any(Path(f"/proc/{pid}").exists() for pid in chosen):
            time.sleep(0.2)


class LoopbackRayCluster:
    """A Ray cluster of ``nodes`` nodes (``cpus`` each) on one machine, for tests and
    benchmarks: ``ray start --head`` and ``ray start --address``, all inside a network
    namespace of its own that holds only the loopback device, so that Ray, which takes a
    node's outward address where it can, talks over 127.0.0.1 alone. ``command(args)``
    runs a command inside it; ``env`` holds the cluster's token (Ray's own default asks for
    one). Needs root (``ip netns``); stopped (its processes only) and removed on exit."""

    def __init__(self, nodes: int = 2, cpus: int = 1, object_store_mib: int = 256):
        import secrets
        import shutil
        import tempfile

        if os.geteuid() != 0 or not shutil.which("ip"):
            raise RuntimeError("a loopback Ray cluster needs root and iproute2 (ip netns)")
        self.nodes, self.cpus, self.store = nodes, cpus, object_store_mib
        self.port, self.netns = free_port(), f"sxr{os.getpid()}-{secrets.token_hex(3)}"
        self.temp = Path(tempfile.mkdtemp(prefix="sxr-"))  # short: Ray's socket paths
        self.env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1",
                                 "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}  # fmt: skip
        self.address = f"127.0.0.1:{self.port}"

    def command(self, args: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *args]

    def __enter__(self) -> LoopbackRayCluster:
        import subprocess
        import time

        subprocess.run(["ip", "netns", "add", self.netns], check=True)
        subprocess.run(self.command(["ip", "link", "set", "lo", "up"]), check=True)
        ray = str(Path(sys.executable).with_name("ray"))
        node = ["--num-cpus", str(self.cpus), "--object-store-memory", str(self.store << 20),
                "--disable-usage-stats"]  # fmt: skip
        start = time.perf_counter()
        try:
            subprocess.run(self.command([ray, "start", "--head", "--port", str(self.port),
                                         "--temp-dir", str(self.temp), "--include-dashboard",
                                         "false", *node]), env=self.env, check=True,
                           capture_output=True, timeout=180)  # fmt: skip
            for _ in range(self.nodes - 1):
                subprocess.run(self.command([ray, "start", "--address", self.address, *node]),
                               env=self.env, check=True, capture_output=True, timeout=180)  # fmt: skip
        except BaseException:
            self.__exit__()
            raise
        self.startup_s = time.perf_counter() - start
        return self

    def __exit__(self, *exc: object) -> None:
        import shutil
        import subprocess

        stop_processes_of(str(self.temp))
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        shutil.rmtree(self.temp, ignore_errors=True)
