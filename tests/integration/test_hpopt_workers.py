"""``smiexlm hpopt`` with several workers on one shared study, for real: a journal file, and a
PostgreSQL server this module starts on loopback (as the ``postgres`` user when run as root,
in a temporary data folder) and stops. A worker killed with SIGKILL mid-trial has its trial
marked failed by the others' heartbeat check and run again; the budget is spent once over
all workers; ``best.toml`` is written once, by the worker that ended the study."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.cli.test_hpopt_cli import _args, toy_csv  # noqa: F401  (the fixture)
from tests.conftest import free_port, smiexlm_command

ENV = os.environ | {"OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}


def _postgres_bin() -> Path:
    """The folder of PostgreSQL's server programs (Debian keeps them off PATH)."""
    found = shutil.which("initdb") or next(
        iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None
    )
    assert found, "PostgreSQL's server is not installed: apt-get install postgresql (.ci/run does)"
    return Path(found).resolve().parent


@pytest.fixture(scope="module")
def postgres_url():
    """``postgresql://postgres@127.0.0.1:PORT/hpopt`` on a server of its own, stopped after."""
    bindir, port = _postgres_bin(), free_port()
    data = Path(tempfile.mkdtemp(prefix="smiexlm-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # the server refuses to run as root
        shutil.chown(data, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]

    def run(*cmd: str) -> None:
        subprocess.run([*as_user, *cmd], check=True, capture_output=True, timeout=120)

    run(str(bindir / "initdb"), "-D", str(data / "db"), "-A", "trust", "-U", "postgres")
    options = f"-p {port} -c listen_addresses=127.0.0.1 -k {data}"
    run(str(bindir / "pg_ctl"), "-D", str(data / "db"), "-o", options, "-l", str(data / "log"),
        "-w", "start")  # fmt: skip
    try:
        run(str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "hpopt")
        yield f"postgresql://postgres:secret@127.0.0.1:{port}/hpopt"
    finally:
        run(str(bindir / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "stop")
        shutil.rmtree(data, ignore_errors=True)


def _study(storage: str):
    import optuna

    if storage.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        storage = optuna.storages.JournalStorage(JournalFileBackend(storage[len("journal:") :]))
    return optuna.load_study(study_name="hpopt", storage=storage)


def _search(csv: Path, out: Path, storage: str, *extra: str) -> list[str]:
    return [smiexlm_command(), *_args(csv, out, "--trials", "4", "--storage", storage,
                                      "--heartbeat", "1", *extra)]  # fmt: skip


def _ended_as_budgeted(study) -> list:
    trials = study.get_trials(deepcopy=False)
    states = [t.state.name for t in trials]
    assert sum(s in ("COMPLETE", "PRUNED") for s in states) == 4, states
    assert "RUNNING" not in states and "WAITING" not in states, states
    return trials


@pytest.mark.slow
def test_two_workers_on_a_journal_share_the_budget(toy_csv, tmp_path):  # noqa: F811
    storage = f"journal:{tmp_path / 'study.journal'}"
    done = subprocess.run(_search(toy_csv, tmp_path / "out", storage, "--workers", "2"),
                          env=ENV, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    trials = _ended_as_budgeted(_study(storage))
    workers = {t.user_attrs["worker"] for t in trials}
    assert len(workers) == 2, workers  # both processes ran trials
    points = [tuple(sorted(t.params.items())) for t in trials]
    assert len(set(points)) == len(points)  # no point drawn twice
    assert (tmp_path / "out" / "best.toml").is_file()
    assert "4 trials counted" in done.stdout


@pytest.mark.slow
def test_a_worker_killed_mid_trial_on_postgresql(postgres_url, toy_csv, tmp_path):  # noqa: F811
    """Two machines' commands (two --out folders) on one PostgreSQL study; one is killed
    with SIGKILL while its trial runs: the other marks the trial failed, runs its point
    again and ends the study with its budget, and only its folder gets best.toml."""
    a, b = tmp_path / "a", tmp_path / "b"
    first = subprocess.Popen(_search(toy_csv, a, postgres_url), env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline, killed = time.time() + 300, None
    while killed is None and time.time() < deadline and first.poll() is None:
        try:
            running = [t for t in _study(postgres_url).get_trials(deepcopy=False)
                       if t.state.name == "RUNNING" and t.params
                       and t.user_attrs.get("worker", "").endswith(f":{first.pid}")]  # fmt: skip
        except Exception:  # the study is being made
            running = []
        if running:
            os.kill(first.pid, signal.SIGKILL)
            first.wait()
            killed = running[0].number
        time.sleep(0.2)
    assert killed is not None, "the first worker ended before it ran a trial"
    second = subprocess.run(_search(toy_csv, b, postgres_url), env=ENV, capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    assert second.returncode == 0, second.stderr[-2000:]
    trials = _ended_as_budgeted(_study(postgres_url))
    dead = trials[killed]
    assert dead.state.name == "FAIL" and "stopped beating" in dead.user_attrs["error"]
    retried = [t for t in trials if t.user_attrs.get("retry_of") == killed]
    # its point, drawn again (it may have been cut before all of it was drawn)
    assert retried and dead.params.items() <= retried[0].params.items()
    assert retried[0].state.name != "FAIL"
    assert (b / "best.toml").is_file() and not (a / "best.toml").exists()


def test_several_workers_on_sqlite_and_bad_urls_are_one_line(toy_csv, tmp_path):  # noqa: F811
    cases = [
        (["--trials", "2", "--workers", "2"], "--workers"),
        (["--trials", "2", "--storage", f"postgresql://me:secret@127.0.0.1:{free_port()}/x"],
         "postgresql://127.0.0.1"),
        (["--trials", "2", "--storage", "mysql://me:secret@host/x"], "--storage"),
        (["--trials", "2", "--storage",  # an unescaped @ in the password, a query
          f"postgresql://me:my@secret@127.0.0.1:{free_port()}/x?sslmode=secret"],
         "postgresql://127.0.0.1"),
    ]  # fmt: skip
    for extra, named in cases:
        done = subprocess.run([smiexlm_command(), *_args(toy_csv, tmp_path / "o", *extra)],
                              env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode != 0 and len(lines) == 1, done.stderr
        assert named in lines[0] and "secret" not in lines[0], lines[0]


def test_a_shared_study_made_with_other_settings_is_refused(toy_csv, tmp_path):  # noqa: F811
    storage = f"journal:{tmp_path / 'study.journal'}"
    first = subprocess.run(_search(toy_csv, tmp_path / "a", storage), env=ENV,
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    other = subprocess.run([*_search(toy_csv, tmp_path / "b", storage), "--seed", "7"], env=ENV,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert other.returncode != 0
    assert f"--storage {storage!r} holds a search with" in other.stderr, other.stderr
