"""Hostile use of finetune, probe, baseline, benchmark and predict: nothing silent.

Each case is a command a user ran that used to end with exit code 0 and a wrong or lost
result (a model overwritten by another task's, a std of 0 from a seed given twice, a regression
type ignored, two runs into one output at once, an ensemble short of a deleted seed) or with a
traceback. The real ``smiexlm`` entry point runs in a subprocess and
must either do the right thing or end with exit code 2 and one ``error:`` line, before any
training when the problem is knowable before it. Training runs are one step on CPU.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.integration.test_faults import assert_one_line_error, run_cli

SMILES = [f"C1{'C' * n}1{tail}" for n in range(2, 16) for tail in ("", "O", "N", "Cl")]
TINY = ["--max-train-steps", "1", "--batch-size", "8", "--device", "cpu", "--split", "random"]


def _table(path: Path, labels: list, smiles: list[str] = SMILES) -> Path:
    pd.DataFrame({"smiles": smiles[: len(labels)], "y": labels}).to_csv(path, index=False)
    return path


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """``finetune mine --data`` (classification) with ``--save-dir root/models``: seed 0."""
    root = tmp_path_factory.mktemp("saved")
    rng = random.Random(0)
    _table(root / "cls.csv", [rng.randint(0, 1) for _ in SMILES])
    _table(root / "reg.csv", [round(rng.uniform(-2, 2), 3) for _ in SMILES])
    res = run_cli("finetune", "mine", "--data", root / "cls.csv", "--label-cols", "y",
                  "--seeds", "0", *TINY, "--out", root / "report",
                  "--save-dir", root / "models")  # fmt: skip
    assert res.returncode == 0, res.stderr
    return root


def _predict(tmp_path: Path, *folders: Path, out: str = "p.csv"):
    table = tmp_path / "in.csv"
    table.write_text("smiles\nCCO\nc1ccccc1\n")
    args = [x for folder in folders for x in ("--checkpoint", folder)]
    return run_cli("predict", *args, "--input", table, "--out", tmp_path / out, timeout=120)


# ---------------------------------------------------------------------- --save-dir
def test_save_dir_refuses_another_tasks_model_unless_overwrite(saved, tmp_path):
    models = tmp_path / "models"
    shutil.copytree(saved / "models", models)
    reg = ["--data", saved / "reg.csv", "--label-cols", "y", "--task-type", "regression", *TINY]
    res = run_cli("finetune", "other", *reg, "--seeds", "0", "--out", tmp_path / "r0",
                  "--save-dir", models)  # fmt: skip
    assert_one_line_error(res, "--save-dir", "seed0", "task 'mine'", "seed 0", "--overwrite")
    assert "step" not in res.stderr and not (tmp_path / "r0").exists()  # refused before training
    assert json.loads((models / "seed0" / "finetune.json").read_text())["dataset"] == "mine"

    res = run_cli(
        "finetune", "other", *reg, "--seeds", "1", "--out", tmp_path / "r1", "--save-dir", models
    )  # another seed: saved beside seed0
    assert res.returncode == 0, res.stderr
    assert json.loads((models / "seed1" / "finetune.json").read_text())["dataset"] == "other"

    res = run_cli("finetune", "other", *reg, "--seeds", "0", "--out", tmp_path / "r2",
                  "--save-dir", models, "--overwrite")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads((models / "seed0" / "finetune.json").read_text())["dataset"] == "other"


def test_saved_weights_follow_the_umask_like_every_other_output(saved):
    expected = 0o666 & ~_umask()
    folder = saved / "models" / "seed0"
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert modes["head.safetensors"] == modes["model.safetensors"] == expected, modes
    assert set(modes.values()) == {expected}, modes


def test_atomic_outputs_follow_the_umask_whatever_mode_the_writer_gave(tmp_path):
    from smiexlm.atomic import atomic_dir, atomic_path

    expected = 0o666 & ~_umask()
    with atomic_path(tmp_path / "a.bin") as tmp:
        tmp.write_bytes(b"x")
        tmp.chmod(0o600)  # as safetensors' save_file leaves its files
    with atomic_dir(tmp_path / "folder") as tmp:
        (tmp / "w.bin").write_bytes(b"x")
        (tmp / "w.bin").chmod(0o600)
    assert (tmp_path / "a.bin").stat().st_mode & 0o777 == expected
    assert (tmp_path / "folder" / "w.bin").stat().st_mode & 0o777 == expected
    assert (tmp_path / "folder").stat().st_mode & 0o777 == 0o777 & ~_umask()


# ---------------------------------------------------------------------- finetune.json
def test_finetune_json_is_recorded_in_checksums_and_verified(saved, tmp_path):
    folder = tmp_path / "seed0"
    shutil.copytree(saved / "models" / "seed0", folder)
    sums = json.loads((folder / "checksums.json").read_text())["sha256"]
    assert set(sums) == {"model.safetensors", "head.safetensors", "finetune.json",
                         "normalization.json", "reference.safetensors",
                         "forest.skops"}  # the default's forest beside the model  # fmt: skip
    meta = json.loads((folder / "finetune.json").read_text())
    (folder / "finetune.json").write_text(json.dumps(meta | {"target_mean": [0.5]}, indent=1))
    assert_one_line_error(_predict(tmp_path, folder), "finetune.json", "sha256")
    del sums["finetune.json"]  # a folder saved before finetune.json was recorded
    doc = {"format": "smiexlm-checksums/1", "sha256": sums}
    (folder / "checksums.json").write_text(json.dumps(doc))
    assert _predict(tmp_path, folder).returncode == 0


@pytest.mark.parametrize("std", [0.0, -1.0, float("inf")])
def test_a_target_std_that_is_not_positive_and_finite_is_refused(saved, tmp_path, std):
    folder = tmp_path / "seed0"
    shutil.copytree(saved / "models" / "seed0", folder)
    meta = json.loads((folder / "finetune.json").read_text())
    (folder / "finetune.json").write_text(json.dumps(meta | {"target_std": [std]}))
    expected = "finite numbers" if std == float("inf") else "1 positive numbers"
    assert_one_line_error(_predict(tmp_path, folder), "finetune.json", "'target_std'", expected)
    assert not (tmp_path / "p.csv").exists()


# ---------------------------------------------------------------------- --seeds, --checkpoint
SEEDED = {
    "finetune": ["finetune", "bbbp"],
    "probe": ["probe", "bbbp"],
    "benchmark": ["benchmark", "--tasks", "bbbp"],
    "baseline": ["baseline", "--tasks", "bbbp"],
}


@pytest.mark.parametrize("command", list(SEEDED))
def test_a_seed_given_twice_is_refused(tmp_path, command):
    res = run_cli(*SEEDED[command], "--seeds", "0", "0", "--out", tmp_path / "r", timeout=60)
    assert_one_line_error(res, "--seeds", "[0, 0]", "seed 0 is given more than once")
    assert not (tmp_path / "r" / "results.csv").exists()


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_a_negative_or_huge_seed_is_refused(tmp_path, seed):
    res = run_cli("finetune", "bbbp", "--seeds", seed, "--out", tmp_path / "r", timeout=60)
    assert_one_line_error(res, "--seeds", seed, "non-negative integers below 2**32")


@pytest.mark.parametrize("out", ["p.csv", "parts"])
def test_predict_refuses_the_same_folder_twice(saved, tmp_path, out):
    folder = saved / "models" / "seed0"
    res = _predict(tmp_path, folder, folder.parent / "." / "seed0", out=out)
    assert_one_line_error(res, "--checkpoint", "a second time", "each fine-tuned folder once")
    assert not (tmp_path / out).exists()


# ---------------------------------------------------------------------- tiny tables
@pytest.mark.parametrize("command", ["finetune", "probe", "baseline"])
def test_a_five_row_regression_table_is_refused_before_training(tmp_path, command):
    data = _table(tmp_path / "y.csv", [1.0, 2.0, 0.5, 3.0, 1.5])
    name = ["mine"] if command in ("finetune", "probe") else []
    res = run_cli(command, *name, "--data", data, "--label-cols", "y", "--task-type",
                  "regression", "--seeds", "0", "--split", "random", "--out", tmp_path / "r",
                  *(["--device", "cpu"] if command != "baseline" else []), timeout=120)  # fmt: skip
    assert_one_line_error(res, "random(seed=0) split of 5 molecules", "4/0/1", "train/valid/test")
    assert not (tmp_path / "r" / "results.csv").exists()


def test_a_classification_table_with_empty_parts_is_refused(tmp_path):
    acyclic = ["CCO", "CCN", "CCC", "CCCC", "CCCl", "CCCO", "CCCN", "CCOC", "CCCCC", "CCCCO"]
    data = _table(tmp_path / "c.csv", [1, 0] * 5, acyclic)  # one (empty) scaffold: all in test
    res = run_cli("finetune", "mine", "--data", data, "--label-cols", "y", "--seeds", "0",
                  "--device", "cpu", "--out", tmp_path / "r", timeout=120)  # fmt: skip
    assert_one_line_error(res, "scaffold split of 10 molecules", "0/0/10", "train/valid/test")


# ---------------------------------------------------------------------- --task-type, reports
@pytest.mark.parametrize("command", [["finetune", "bbbp"], ["baseline", "--tasks", "bbbp"]])
def test_task_type_is_refused_for_a_moleculenet_set(tmp_path, command):
    res = run_cli(*command, "--task-type", "regression", "--out", tmp_path / "r", timeout=60)
    assert_one_line_error(res, "--task-type", "'regression'", "--data", "bbbp: classification")


def test_a_regression_report_shows_rmse_to_3_decimals_without_paper_rows(saved, tmp_path):
    res = run_cli("finetune", "bbbp", "--data", saved / "reg.csv", "--label-cols", "y",
                  "--task-type", "regression", "--seeds", "0", *TINY,
                  "--out", tmp_path / "r")  # fmt: skip
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if line.startswith("| default"))
    mean = pd.read_csv(tmp_path / "r" / "results.csv")["test"].iloc[0]
    assert f"| {mean:.3f} ± 0.000 (n=1) | {mean:.3f} |" in row, row
    assert "(paper)" not in res.stdout
    report = (tmp_path / "r" / "report.md").read_text()
    assert "(paper)" not in report and "Paper rows" not in report and "test RMSE" in report


# ---------------------------------------------------------------------- one run per output
LOCKED = ["finetune --out", "finetune --save-dir", "benchmark --out", "predict --out DIR",
          "predict --out FILE"]  # fmt: skip


@pytest.mark.parametrize("case", LOCKED)
def test_a_second_run_into_a_held_output_is_refused_naming_the_first(saved, tmp_path, case):
    from smiexlm.training.runlock import RunLock

    table = tmp_path / "in.csv"
    table.write_text("smiles\nCCO\n")
    held = tmp_path / ("p.csv" if case.endswith("FILE") else "held")
    finetune = ["finetune", "mine", "--data", saved / "cls.csv", "--label-cols", "y",
                "--seeds", "0", *TINY]  # fmt: skip
    predict = ["predict", "--checkpoint", saved / "models", "--input", table, "--out", held]
    args = {"finetune --out": [*finetune, "--out", held],
            "finetune --save-dir": [*finetune, "--out", tmp_path / "r", "--save-dir", held],
            "benchmark --out": ["benchmark", "--tasks", "bbbp", "--seeds", "0", *TINY,
                                "--out", held],
            "predict --out DIR": predict, "predict --out FILE": predict}[case]  # fmt: skip
    # the first run: a folder holds its .lock, a file .NAME.lock beside it
    first = RunLock(held) if held.name == "held" else RunLock(tmp_path, ".p.csv.lock")
    with first:
        res = run_cli(*args, timeout=120)
    assert_one_line_error(res, f"{case.split()[1]} '{held}' is in use by process {os.getpid()}",
                          "wait for that run to end")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.csv"]  # nothing ran


@pytest.mark.parametrize("out", ["parts", "p.csv"])
def test_a_lock_left_by_a_dead_run_is_taken_over(saved, tmp_path, out):
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    lock = tmp_path / out / ".lock" if out == "parts" else tmp_path / f".{out}.lock"
    lock.parent.mkdir(exist_ok=True)
    owner = {"pid": dead.pid, "host": socket.gethostname(), "started": "2020-01-01T00:00:00"}
    lock.write_text(json.dumps(owner | {"proc_start": 1}))  # as a kill -9 leaves it
    res = _predict(tmp_path, saved / "models", out=out)
    assert res.returncode == 0, res.stderr
    assert f"taking over the lock of process {dead.pid}" in res.stderr
    assert not lock.exists()
    if out == "parts":
        assert json.loads((tmp_path / out / "manifest.json").read_text())["n_rows"] == 2
    else:
        assert len(pd.read_csv(tmp_path / out)) == 2


# ---------------------------------------------------------------------- a save-dir's seeds
def test_a_save_dir_whose_seed_folder_is_gone_is_refused_naming_it(saved, tmp_path):
    models = tmp_path / "models"
    shutil.copytree(saved / "models", models)
    assert json.loads((models / "seeds.json").read_text())["seeds"] == [0]
    res = run_cli("finetune", "mine", "--data", saved / "cls.csv", "--label-cols", "y",
                  "--seeds", "1", *TINY, "--out", tmp_path / "r", "--save-dir", models)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads((models / "seeds.json").read_text())["seeds"] == [0, 1]  # added to
    shutil.rmtree(models / "seed1")
    for out in ("p.csv", "parts"):
        assert_one_line_error(_predict(tmp_path, models, out=out), f"--checkpoint '{models}'",
                              f"'{models / 'seed1'}' is missing", "lists seeds 0, 1",
                              f"name them (--checkpoint '{models / 'seed0'}')")  # fmt: skip
        assert not (tmp_path / out).exists()
    (models / "seeds.json").unlink()  # a save-dir written before the record: loads as it did
    assert _predict(tmp_path, models).returncode == 0


@pytest.mark.parametrize(("tasks", "words"), [
    (["bbbp", "nosuch"], "'dataset' = 'nosuch'"),
    (["lipo", "lipophilicity"], "names ['lipophilicity'] more than once; expected each set once"),
])  # fmt: skip
def test_benchmark_checks_every_set_name_before_the_first_set_runs(tmp_path, tasks, words):
    out = tmp_path / "bench"
    res = run_cli("benchmark", "--tasks", *tasks, "--seeds", "0", "--max-train-steps", "1",
                  "--out", out)  # fmt: skip
    assert_one_line_error(res, words)
    assert not (out / "runs").exists()  # bbbp was fine-tuned first, before
