"""``pretrain`` on two nodes, for real: two torchrun launchers (``--nnodes 2``, node ranks 0
and 1, one process each, c10d rendezvous on 127.0.0.1) as a cluster's two machines would run
them. After N updates the weights are those of one node with the same global batch; one node
killed with SIGKILL mid-run, both resumed from the last checkpoint, the weights are an
uninterrupted run's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import free_port, kill_tree
from tests.unit.pretraining.test_training_support import FAST, MICRO_MODEL, build_dataset, cli_env

# the schedule's horizon fixed, so every run shares one learning-rate curve
ARGS = ["--config", "mol_tiny_exlm", *MICRO_MODEL, *FAST, "total_steps=400"]


def _nodes(data: Path, out: Path, steps: int, *extra: str) -> list[subprocess.Popen]:
    """The two launchers, each in a session of its own."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--nproc_per_node", "1", "--node_rank", str(rank), "--rdzv_backend", "c10d",
                   "--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "two-nodes",
                   "--max_restarts", "0", "-m", "smiexlm.cli.main", "pretrain", *ARGS,
                   "--data", str(data), "--out", str(out), "--max-steps", str(steps),
                   "update_freq=1", *extra]  # fmt: skip
        procs.append(subprocess.Popen(command, env=cli_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))  # fmt: skip
    return procs


def _wait(procs: list[subprocess.Popen], timeout: float = 300) -> None:
    for proc in procs:
        output = proc.communicate(timeout=timeout)[0]
        assert proc.returncode == 0, output[-3000:]


def _one_node(data: Path, out: Path, steps: int) -> None:
    """One process with the two nodes' global batch (update_freq 2)."""
    command = [sys.executable, "-m", "smiexlm.cli.main", "pretrain", *ARGS, "--data", str(data),
               "--out", str(out), "--max-steps", str(steps), "update_freq=2"]  # fmt: skip
    done = subprocess.run(command, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _weights(run: Path, checkpoint: str = "last") -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / checkpoint / "model.safetensors"))


@pytest.mark.slow
def test_two_nodes_train_as_one_and_resume_after_a_node_dies(shared_data, tmp_path):
    data = build_dataset(shared_data / "pretrain" / "moses_test.smi.gz", tmp_path / "ds", n=300)
    steps, early = 400, 12  # 400 updates: seconds to kill a node in, even on a busy machine
    straight, one = tmp_path / "straight", tmp_path / "one"
    _wait(_nodes(data, straight, steps, f"save_every={early}", "keep_last=100"))
    _one_node(data, one, early)
    a, b = _weights(straight, f"step_{early:06d}"), _weights(one)
    assert a.keys() == b.keys()
    for key in a:  # DDP's all-reduced mean against one process's summed micro-batches
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)

    # node 1 dies with SIGKILL after the checkpoint of step 10; node 0 then fails on its own
    cut = tmp_path / "cut"
    procs = _nodes(data, cut, steps, "save_every=10")
    deadline = time.time() + 240
    while not (cut / "checkpoints" / "step_000010").is_dir():
        assert time.time() < deadline and procs[0].poll() is None, procs[0].communicate()[0][-3000:]
        time.sleep(0.01)
    assert procs[1].poll() is None, "node 1 ended before it could be killed"
    kill_tree(procs[1].pid)  # the launcher and its worker: the whole node
    procs[1].wait()
    try:
        procs[0].communicate(timeout=120)
    except subprocess.TimeoutExpired:  # still waiting on its lost peer: a cluster would kill it
        kill_tree(procs[0].pid)
        procs[0].communicate()
    assert procs[0].returncode != 0
    state = json.loads((cut / "checkpoints" / "last" / "trainer_state.json").read_text())
    assert 10 <= state["state"]["step"] < steps
    _wait(_nodes(data, cut, steps, "save_every=10", "--resume"))
    resumed, uninterrupted = _weights(cut), _weights(straight)
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)  # bitwise
