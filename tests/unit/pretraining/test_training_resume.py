"""SIGTERM mid-run, then ``--resume``: the same losses and weights as an uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
import torch
from safetensors.torch import load_file

from tests.unit.pretraining.test_training_support import (
    FAST,
    MICRO_MODEL,
    build_dataset,
    cli,
    cli_env,
)

# total_steps fixes the schedule's horizon, so the three runs share one learning-rate curve.
ARGS = ["--config", "mol_tiny_exlm", *MICRO_MODEL, *FAST, "save_every=1000", "total_steps=400"]


def _losses(run_dir) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


@pytest.mark.slow
def test_sigterm_then_resume_is_bitwise_identical(shared_data, tmp_path):
    data = build_dataset(shared_data / "pretrain" / "moses_test.smi.gz", tmp_path / "ds", n=300)
    common = [*ARGS, "--data", str(data)]
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        cli("pretrain", *common, "--out", str(killed), "--max-steps", "400"),
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.time() + 90
    metrics = killed / "metrics.jsonl"
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[0]
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 143, output
    assert "SIGTERM: checkpoint saved" in output
    state = json.loads((killed / "checkpoints" / "last" / "trainer_state.json").read_text())
    n = state["state"]["step"]
    assert 5 <= n < 400 and (killed / "checkpoints" / f"step_{n:06d}").is_dir()

    target = n + 6
    reference = tmp_path / "reference"
    subprocess.run(
        cli("pretrain", *common, "--out", str(reference), "--max-steps", str(target)),
        env=cli_env(),
        check=True,
        capture_output=True,
    )
    resumed = subprocess.run(
        cli("pretrain", *common, "--out", str(killed), "--max-steps", str(target), "--resume"),
        env=cli_env(),
        capture_output=True,
        text=True,
    )
    assert resumed.returncode == 0, resumed.stderr
    ref, res = _losses(reference), _losses(killed)
    assert max(res) == target
    for step in range(1, target + 1):
        assert res[step] == ref[step], (step, res[step], ref[step])  # bitwise
    a = load_file(str(reference / "checkpoints" / "last" / "model.safetensors"))
    b = load_file(str(killed / "checkpoints" / "last" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    oa = load_file(str(reference / "checkpoints" / "last" / "optimizer.safetensors"))
    ob = load_file(str(killed / "checkpoints" / "last" / "optimizer.safetensors"))
    assert all(torch.equal(oa[k], ob[k]) for k in oa)
