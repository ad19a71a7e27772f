"""``smiexlm pretrain`` on several CPU processes by itself: how many, and the same run."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from safetensors.torch import load_file

from smiexlm.errors import ConfigError
from smiexlm.training.distributed import MAX_LOCAL_PROCESSES, free_cores, local_processes
from tests.unit.pretraining.test_training_support import (
    FAST,
    MICRO_MODEL,
    build_dataset,
    cli,
    cli_env,
)


@pytest.mark.parametrize(
    ("update_freq", "cores", "expected"),
    [(2, 2, 2), (2, 1, 1), (2, 16, 2), (1, 8, 1), (6, 4, 3), (16, 32, MAX_LOCAL_PROCESSES)],
)
def test_default_is_the_largest_divisor_of_update_freq_that_fits(update_freq, cores, expected):
    assert local_processes(None, update_freq, cores) == expected


def test_a_request_must_divide_update_freq():
    assert local_processes(2, 4, 1) == 2  # asked for: honoured even on a busy machine
    with pytest.raises(ConfigError, match=r"'nproc' = 3: expected a divisor of update_freq = 2"):
        local_processes(3, 2, 8)


def test_free_cores_is_at_least_one():
    assert free_cores() >= 1


@pytest.mark.slow
def test_two_launched_processes_train_like_one(shared_data, tmp_path):
    """--nproc 2 splits each update's 2 micro-batches between 2 processes: same losses and
    weights as one process, one report line, one recorded command."""
    data = build_dataset(shared_data / "pretrain" / "moses_test.smi.gz", tmp_path / "ds", n=300)
    common = ["--config", "mol_tiny_exlm", "--data", str(data), *MICRO_MODEL, *FAST]
    common += ["update_freq=2", "max_steps=6", "valid_every=3"]
    runs = {}
    for n in (2, 1):
        out = tmp_path / f"n{n}"
        done = subprocess.run(
            cli("pretrain", *common, "--out", str(out), "--nproc", str(n)),
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.count("step 6: loss") == 1
        assert len((out / "command.txt").read_text().splitlines()) == 1
        # the whole update's micro-batches, as given: the file runs again on any --nproc
        assert "update_freq = 2\n" in (out / "config.resolved.toml").read_text()
        metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        weights = load_file(str(out / "checkpoints" / "last" / "model.safetensors"))
        runs[n] = (metrics, weights)
    (m2, w2), (m1, w1) = runs[2], runs[1]
    assert [r["step"] for r in m2] == [r["step"] for r in m1] == list(range(1, 7))
    for a, b in zip(m2, m1, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-5)
        assert a["tokens_seen"] == b["tokens_seen"]
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=1e-4, atol=1e-5)
