"""``smiexlm hpopt`` for real: killed with SIGKILL mid-trial and run again, it goes on to the
budget; its ``best.toml`` goes through ``finetune --config``; bad input is one clear error."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from tests.conftest import smiexlm_command
from tests.unit.hpopt.test_hpopt import toy_frame


@pytest.fixture()
def toy_csv(tmp_path) -> Path:
    path = tmp_path / "toy.csv"
    toy_frame().to_csv(path, index=False)
    return path


def _args(csv: Path, out: Path, *extra: str) -> list[str]:
    return ["hpopt", "toy", "--data", str(csv), "--smiles-col", "smi", "--label-cols", "y",
            "--split", "random", "--max-train-steps", "8", "--device", "cpu", "--precision",
            "fp32", "--out", str(out), *extra]  # fmt: skip


def _states(out: Path) -> list[tuple[int, str, dict]]:
    import optuna

    storage = f"sqlite:///{out / 'study.sqlite'}"
    study = optuna.load_study(study_name="hpopt", storage=storage)
    return [(t.number, t.state.name, t.params) for t in study.get_trials(deepcopy=False)]


def _kill_mid_trial(proc: subprocess.Popen, out: Path, number: int, timeout: float = 240):
    """SIGKILL ``proc`` while trial ``number`` (or a later one) runs with its point drawn."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if (out / "trials.csv").is_file():  # the study exists and is written
            os.kill(proc.pid, signal.SIGSTOP)  # frozen while its state is read: no race
            try:
                states = _states(out)
            except Exception:  # frozen in the middle of a write: look again later
                states = []
            running = [n for n, state, params in states if state == "RUNNING" and params]
            if running and running[0] >= number:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                return running[0]
            os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"the search ended (code {proc.poll()}) before trial {number} ran")


@pytest.mark.slow
def test_kill_9_mid_trial_then_the_same_command_goes_on_to_the_budget(toy_csv, tmp_path):
    out = tmp_path / "search"
    env = os.environ | {"OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    command = [smiexlm_command(), *_args(toy_csv, out, "--trials", "3")]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    cut = _kill_mid_trial(proc, out, 1)
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    states = _states(out)
    assert [n for n, _, _ in states] == list(range(4))  # the numbers go on: 3 counted + 1
    assert [s for n, s, _ in states if n == cut] == ["FAIL"]
    assert sum(s in ("COMPLETE", "PRUNED") for _, s, _ in states) == 3
    # the cut trial's point, drawn again (it may have been cut before all of it was drawn)
    assert states[cut][2].items() <= states[cut + 1][2].items()
    assert "3 trials counted, 1 failed" in again.stdout
    assert f"trial {cut + 1} " in again.stdout and "trial 0 " not in again.stdout
    rows = pd.read_csv(out / "trials.csv")
    assert rows.loc[cut, "state"] == "fail" and "stopped mid-trial" in rows.loc[cut, "note"]
    assert not (out / ".lock").exists()


def _invoke(*args: str):
    from smiexlm.cli.main import app

    torch.set_num_threads(1)
    return CliRunner().invoke(app, list(args))


def test_best_toml_round_trips_through_finetune_config(toy_csv, tmp_path):
    import tomllib

    out = tmp_path / "search"
    done = _invoke(*_args(toy_csv, out, "--trials", "2"))
    assert done.exit_code == 0, done.output
    assert "next: smiexlm finetune toy --config" in done.output
    best = tomllib.loads((out / "best.toml").read_text())
    assert best["max_train_steps"] == 8 and best["split"] == "random" and "device" not in best
    run = tmp_path / "finetuned"
    args = ["finetune", "toy", "--data", str(toy_csv), "--smiles-col", "smi", "--label-cols",
            "y", "--seeds", "0", "--device", "cpu", "--config", str(out / "best.toml")]  # fmt: skip
    done = _invoke(*args, "--out", str(run))
    assert done.exit_code == 0, done.output
    config = json.loads(pd.read_csv(run / "results.csv")["config"][0])
    for key in ("lr", "epochs", "dropout", "pooler_dropout", "pooling", "freeze_layers",
                "max_train_steps", "split", "batch_size"):  # fmt: skip
        assert config[key] == best[key], key
    assert config["features"] == best.get("features")  # no key: no hybrid features
    done = _invoke(*args, "--lr", "0.003", "--out", str(tmp_path / "mine"))  # a given option wins
    config = json.loads(pd.read_csv(tmp_path / "mine" / "results.csv")["config"][0])
    assert config["lr"] == 0.003 and config["epochs"] == best["epochs"]


def test_a_config_file_beats_the_options_left_at_their_defaults(toy_csv, tmp_path):
    config = tmp_path / "mine.toml"
    config.write_text('split = "random"\nfreeze_layers = 2\nmax_train_steps = 1\n'
                      'precision = "fp32"\npooling = "mean"\n')  # fmt: skip
    done = _invoke("finetune", "toy", "--data", str(toy_csv), "--smiles-col", "smi",
                   "--label-cols", "y", "--seeds", "0", "--config", str(config), "--out",
                   str(tmp_path / "run"))  # fmt: skip
    assert done.exit_code == 0, done.output
    recorded = json.loads(pd.read_csv(tmp_path / "run" / "results.csv")["config"][0])
    assert (recorded["split"], recorded["freeze_layers"], recorded["steps"]) == ("random", 2, 1)
    assert recorded["pooling"] == "mean" and recorded["precision"] == "fp32"


@pytest.mark.data
def test_benchmark_takes_a_config_file_and_a_forest(shared_data, tmp_path):
    config = tmp_path / "quick.toml"
    config.write_text("max_train_steps = 1\nfreeze_layers = 1\neval_batch_size = 512\n")
    done = _invoke("benchmark", "--tasks", "bace", "--seeds", "0", "--device", "cpu",
                   "--config", str(config), "--out", str(tmp_path / "bench"), "--forest", "ecfp4",
                   "--forest-trees", "3")  # fmt: skip
    assert done.exit_code == 0, done.output
    row = pd.read_csv(tmp_path / "bench" / "results.csv").iloc[0]
    recorded = json.loads(row["config"])
    assert (recorded["freeze_layers"], recorded["steps"], recorded["lr"]) == (1, 1, 1e-4)
    assert (recorded["forest"], recorded["forest_trees"]) == ("ecfp4", 3)
    assert row["model"].endswith("+ RF-ecfp4") and 0 < recorded["test_forest"] <= 100


def test_bad_budgets_and_config_keys_are_clear_errors(toy_csv, tmp_path):
    out = tmp_path / "search"
    for extra, needle in ((("--trials", "0"), "'--trials' = 0: expected a positive number"),
                          ((), "expected a budget: --trials N, --cpu-minutes M or both"),
                          (("--cpu-minutes", "-2"), "'--cpu-minutes' = -2.0: expected a finite number in (0, inf)")):  # fmt: skip
        done = _invoke(*_args(toy_csv, out, *extra))
        assert done.exit_code != 0 and needle in str(done.exception), (extra, done.exception)
    assert not out.exists()  # refused before anything was written
    bad = tmp_path / "bad.toml"
    bad.write_text("lr = 1e-4\nlearning_rate = 0.1\n")
    done = _invoke("finetune", "toy", "--data", str(toy_csv), "--smiles-col", "smi",
                   "--label-cols", "y", "--config", str(bad), "--out", str(tmp_path / "f"))  # fmt: skip
    message = str(done.exception)
    assert done.exit_code != 0 and "'learning_rate'" in message and str(bad) in message
    (tmp_path / "table.toml").write_text("[bbbp]\nlr = 1e-4\n")
    done = _invoke("finetune", "bbbp", "--config", str(tmp_path / "table.toml"))
    assert "'bbbp'" in str(done.exception) and "a flat FinetuneConfig key" in str(done.exception)


def test_hpopt_takes_what_settings_hpopt_prints_and_best_toml_keeps_the_forest(toy_csv, tmp_path):
    import tomllib

    printed = _invoke("settings", "hpopt")
    assert printed.exit_code == 0 and "# trials = (none)" in printed.output
    config = tmp_path / "hpopt.toml"
    config.write_text(printed.output.replace("# trials = (none)", "trials = 1"))
    out = tmp_path / "search"
    done = _invoke(*_args(toy_csv, out, "--config", str(config), "--set", "forest=none"))
    assert done.exit_code == 0, done.output
    best = tomllib.loads((out / "best.toml").read_text())
    assert (best["forest"], best["ensemble"]) == ("none", "none")  # TOML has no None to drop
    run = tmp_path / "final"
    done = _invoke("finetune", "toy", "--data", str(toy_csv), "--smiles-col", "smi", "--label-cols",
                   "y", "--seeds", "0", "--device", "cpu", "--config", str(out / "best.toml"),
                   "--out", str(run))  # fmt: skip
    assert done.exit_code == 0, done.output
    row = pd.read_csv(run / "results.csv").iloc[0]
    assert json.loads(row["config"])["forest"] is None and "RF" not in row["model"]
    unknown = tmp_path / "typo.toml"
    unknown.write_text("trails = 3\n")
    done = _invoke(*_args(toy_csv, tmp_path / "s2", "--config", str(unknown)))
    assert done.exit_code != 0 and "'trails'" in str(done.exception)
    assert "FinetuneConfig key or hpopt setting" in str(done.exception)
