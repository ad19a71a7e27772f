"""``torchrun --nproc_per_node 2`` on CPU (gloo): identical weights, same loss as one process."""

from __future__ import annotations

import json

import pytest
import torch

from tests.unit.pretraining.test_training_support import (
    FAST,
    MICRO_MODEL,
    build_dataset,
    ddp_and_one_process,
)


@pytest.mark.slow
def test_two_process_ddp_matches_one_process_with_the_same_global_batch(shared_data, tmp_path):
    data = build_dataset(shared_data / "pretrain" / "moses_test.smi.gz", tmp_path / "ds", n=300)
    overrides = [*MICRO_MODEL, *FAST, "max_steps=6", "valid_every=3"]
    ddp, single, r0, r1, ref = ddp_and_one_process(data, tmp_path, "mol_tiny_exlm", overrides)
    assert all(torch.equal(r0[k], r1[k]) for k in r0)  # DDP kept the replicas identical
    for k in r0:
        torch.testing.assert_close(r0[k], ref[k], rtol=1e-4, atol=1e-5)
    losses = [json.loads(x) for x in (ddp / "metrics.jsonl").read_text().splitlines()]
    ref_losses = [json.loads(x) for x in (single / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in losses] == [r["step"] for r in ref_losses] == list(range(1, 7))
    for a, b in zip(losses, ref_losses, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-5)
        assert a["tokens_seen"] == b["tokens_seen"]
    assert losses[-1]["valid_loss"] == pytest.approx(ref_losses[-1]["valid_loss"], rel=1e-4)
