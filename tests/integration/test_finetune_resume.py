"""``smiexlm finetune`` killed with SIGKILL mid-run and resumed gives the uninterrupted result.

The real command in a subprocess, on 160 BBBP molecules: one run straight through; one run
killed (kill -9, no cleanup) once an epoch is saved and started again with ``--resume``.
Both must report the same best epoch, validation and test score, and the same test
predictions. A folder that holds a run is refused without ``--resume``, and a finished run
is read back, not trained again. Two data-parallel processes run the same command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import require_file, smiexlm_command
from tests.integration.test_faults import assert_one_line_error, run_cli


@pytest.fixture(scope="module")
def small(tmp_path_factory, shared_data) -> Path:
    frame = pd.read_csv(require_file(shared_data, "moleculenet/bbbp.csv")).head(160)
    path = tmp_path_factory.mktemp("resume") / "small.csv"
    frame[["smiles", "p_np"]].to_csv(path, index=False)
    return path


def _args(small: Path, out: Path, *extra: str) -> list[str]:
    return ["finetune", "mine", "--data", str(small), "--label-cols", "p_np", "--split", "random",
            "--epochs", "4", "--batch-size", "16", "--seeds", "0", "--device", "cpu",
            "--out", str(out), *extra]  # fmt: skip


def _result(out: Path) -> dict:
    return json.loads((out / "runs" / "mine" / "seed0" / "result.json").read_text())["result"]


def _kill_after_epochs(proc: subprocess.Popen, state: Path, epochs: int, timeout: float = 300):
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            done = json.loads(state.read_text())["progress"]["epochs_run"]
        except (OSError, ValueError, KeyError):
            done = 0
        if done >= epochs:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return
        time.sleep(0.05)
    raise AssertionError(f"the run ended (code {proc.poll()}) before {epochs} epochs were saved")


def test_kill_9_then_resume_gives_the_uninterrupted_result(small, tmp_path):
    whole = run_cli(*_args(small, tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    cut = tmp_path / "cut"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([smiexlm_command(), *_args(small, cut)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _kill_after_epochs(proc, cut / "runs" / "mine" / "seed0" / "state" / "state.json", 1)
    assert not (cut / "runs" / "mine" / "seed0" / "result.json").exists()

    refused = run_cli(*_args(small, cut))
    assert_one_line_error(refused, "holds a stopped run of mine seed 0", "--resume")
    resumed = run_cli(*_args(small, cut, "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    a, b = _result(tmp_path / "whole"), _result(cut)
    assert (a["best_epoch"], a["valid"], a["test"]) == (b["best_epoch"], b["valid"], b["test"])
    assert b["config"]["resumed_seconds"] > 0
    pa, pb = (np.load(p / "runs" / "mine" / "seed0" / "predictions.npz") for p in (tmp_path / "whole", cut))  # fmt: skip
    assert np.array_equal(pa["test"], pb["test"]) and np.array_equal(
        pa["test_rows"], pb["test_rows"]
    )
    assert not (cut / "runs" / "mine" / "seed0" / "state").exists()

    started = time.perf_counter()
    again = run_cli(*_args(small, cut, "--resume"))  # finished: read back, not trained
    assert again.returncode == 0, again.stderr
    assert _result(cut) == b and time.perf_counter() - started < 60
    # other settings never get the finished run's result back; how it runs may change
    changed = run_cli(*_args(small, cut, "--resume", "--lr", "3e-4"))
    assert_one_line_error(changed, "finished run made with lr = ", "lr = 0.0003", "another --out")
    sized = run_cli(*_args(small, cut, "--resume", "--device", "auto"))
    assert sized.returncode == 0, sized.stderr
    assert _result(cut) == b


def test_two_processes_run_one_finetune(small, tmp_path):
    res = run_cli(*_args(small, tmp_path / "two", "--processes", "2", "--epochs", "1"))
    assert res.returncode == 0, res.stderr
    result = _result(tmp_path / "two")
    assert result["config"]["processes"] == 2 and 0.0 <= result["test"] <= 100.0
    assert (tmp_path / "two" / "report.md").is_file()


def test_baseline_keeps_its_runs_refuses_them_without_resume_and_reads_them_back(small, tmp_path):
    out = tmp_path / "rf"
    args = ["baseline", "--data", small, "--label-cols", "p_np", "--split", "random", "--seeds",
            "0", "1", "--n-trees", "5", "--out", out]  # fmt: skip
    assert run_cli(*args).returncode == 0
    cells = [out / "runs" / "small" / f"seed{seed}" for seed in (0, 1)]
    first = [json.loads((c / "result.json").read_text())["result"] for c in cells]
    report = (out / "results.json").read_text()
    assert_one_line_error(run_cli(*args), "holds a finished run of small seed 0", "--resume")
    (cells[1] / "result.json").unlink()  # seed 1 stopped after its predictions
    assert run_cli(*args, "--resume").returncode == 0
    again = [json.loads((c / "result.json").read_text())["result"] for c in cells]
    assert again[0] == first[0]  # read back as it was, its time too
    assert (again[1]["valid"], again[1]["test"]) == (first[1]["valid"], first[1]["test"])
    assert json.loads((out / "results.json").read_text())[0] == json.loads(report)[0]
    changed = run_cli(*args[:-3], "6", "--out", out, "--resume")
    assert_one_line_error(changed, "made with n_trees = 5", "n_trees = 6", "another --out")
