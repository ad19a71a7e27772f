"""Pinned fine-tuning: two epochs of the shipped pure ExLM (``twins/exlm``, the default model
when the values were recorded) on 200 BBBP molecules repeat recorded scores and predictions.

A change to the input path (normalisation, tokenization, truncation, padding), the head, the
loop or the splits that moves fine-tuning's numbers fails here. Pinned to what is
deterministic on a CPU: fp32 (``precision="fp32"``), one thread. When a change of numerics is
intended, rerun with ``PINNED_LOSSES_PRINT=1`` and record the new values in its commit.
"""

from __future__ import annotations

import os

import pytest
import torch

from smiexlm.finetuning.adapter import run_finetune
from smiexlm.finetuning.backbone import Backbone
from smiexlm.finetuning.config import finetune_config
from smiexlm.moleculenet.loaders import load_task
from smiexlm.paths import ASSETS_DIR
from smiexlm.serving.prediction import predict

# seed 0: best epoch, valid and test ROC-AUC x 100, and the saved model's probabilities for
# the first five molecules of the table
PINNED_BEST = (1, 42.1053, 31.5789)
PINNED_PROBABILITIES = [0.467854, 0.684184, 0.674242, 0.671946, 0.481149]


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_bbbp_subset_repeats_the_pinned_fine_tuning(shared_data, one_thread, tmp_path):
    task = load_task("bbbp", allow_download=False).subset(range(200))
    cfg = finetune_config("bbbp", epochs=2, batch_size=32, precision="fp32", device="cpu",
                          forest="none")  # fmt: skip
    (result,) = run_finetune(task, cfg, Backbone(ASSETS_DIR / "twins" / "exlm"), seeds=[0], save_dir=tmp_path / "ft", progress=False)  # fmt: skip
    probabilities = predict(tmp_path / "ft" / "seed0", task.smiles[:5])["p_np"]
    best = (result.best_epoch, round(result.valid, 4), round(result.test, 4))
    if os.environ.get("PINNED_LOSSES_PRINT"):
        print("PINNED_BEST =", best, "PINNED_PROBABILITIES =", [round(p, 6) for p in probabilities])
    assert best[0] == PINNED_BEST[0]
    assert best[1:] == pytest.approx(PINNED_BEST[1:], abs=1e-3)
    assert probabilities.tolist() == pytest.approx(PINNED_PROBABILITIES, abs=1e-4)
