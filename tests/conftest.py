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
