"""``torchrun --nproc_per_node 2`` on CPU (gloo): identical weights, same loss as one process."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.unit.training.test_training_support import FAST, MICRO_MODEL, build_dataset, cli_env

SCRIPT = """
import os, sys
from pathlib import Path
from safetensors.torch import save_file
from smiexlm.training import load_config, pretrain
data, out, *overrides = sys.argv[1:]
result = pretrain(load_config("mol_tiny_exlm", overrides), Path(data), Path(out))
rank = int(os.environ.get("RANK", "0"))
state = {k: v.contiguous() for k, v in result.model.state_dict().items()}
save_file(state, str(Path(out) / f"rank{rank}.safetensors"))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_ddp_matches_one_process_with_the_same_global_batch(shared_data, tmp_path):
    data = build_dataset(shared_data / "pretrain" / "moses_test.smi.gz", tmp_path / "ds", n=300)
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    overrides = [*MICRO_MODEL, *FAST, "max_steps=6", "valid_every=3"]
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
    ]
    run = subprocess.run(
        [*torchrun, str(script), str(data), str(ddp), *overrides, "update_freq=1"],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    one = subprocess.run(
        [sys.executable, str(script), str(data), str(single), *overrides, "update_freq=2"],
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert one.returncode == 0, one.stderr
    r0 = load_file(str(ddp / "rank0.safetensors"))
    r1 = load_file(str(ddp / "rank1.safetensors"))
    assert all(torch.equal(r0[k], r1[k]) for k in r0)  # DDP kept the replicas identical
    ref = load_file(str(single / "rank0.safetensors"))
    for k in r0:
        torch.testing.assert_close(r0[k], ref[k], rtol=1e-4, atol=1e-5)
    losses = [json.loads(x) for x in (ddp / "metrics.jsonl").read_text().splitlines()]
    ref_losses = [json.loads(x) for x in (single / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in losses] == [r["step"] for r in ref_losses] == list(range(1, 7))
    for a, b in zip(losses, ref_losses, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-5)
        assert a["tokens_seen"] == b["tokens_seen"]
    assert losses[-1]["valid_loss"] == pytest.approx(ref_losses[-1]["valid_loss"], rel=1e-4)
