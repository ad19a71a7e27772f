"""``layer_decay``: each encoder block learns ``layer_decay`` times as fast as the one above.

Checked by what AdamW's first update does: from a fresh state each element moves by its
learning rate times ``|g| / (|g| + eps)``, so the largest move of a parameter is its rate to a
fraction of a percent, read without looking at the optimiser's groups. Without the setting the optimiser keeps its two groups
and the state format of older runs.
"""

from __future__ import annotations

import json

import pytest
import torch

from smiexlm.errors import ConfigError
from smiexlm.finetuning import LoopConfig
from smiexlm.finetuning.state import STATE_JSON, StateMismatchError
from smiexlm.training.optim import adamw_with_decay_groups
from tests.unit.finetuning.test_resume_parallel import _run, _weights, assert_resumes_exactly


def _expected_depth(name: str) -> int:
    """Embeddings 0, encoder block i at i + 1, the rest (the tiny preset's 4 blocks) at 5."""
    if name.startswith("model.embed."):
        return 0
    if name.startswith("model.encoder.layers."):
        return int(name.split(".")[3]) + 1
    return 5


def test_one_update_moves_each_parameter_by_its_depths_rate(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    from smiexlm.finetuning import engine

    first = {}
    update = engine._Fit._update

    def recording(self, train, index):
        if first:
            return update(self, train, index)
        first["before"], first["lr"] = _weights(self.model), self.schedule.lr_at(0)
        loss = update(self, train, index)
        first["after"] = _weights(self.model)
        return loss

    monkeypatch.setattr(engine._Fit, "_update", recording)
    decay = 0.5
    _run(tmp_path, dropout=0.0, epochs=1, warmup_ratio=0.0, clip_norm=0.0, layer_decay=decay)
    seen = set()
    for name, before in first["before"].items():
        moved = (first["after"][name] - before).abs()
        moved = moved[moved > 0]
        if not len(moved):  # no gradient reached it (the unused descriptor head, say)
            continue
        rate = first["lr"] * decay ** (5 - _expected_depth(name))
        torch.testing.assert_close(moved.max().item(), rate, rtol=0.01, atol=0.0)
        seen.add(_expected_depth(name))
    assert seen == {0, 1, 2, 3, 4, 5}


def test_without_it_the_optimiser_keeps_its_two_groups():
    from smiexlm.model.config import ExLMConfig
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel

    model = ExLMForSequencePrediction(ExLMModel(ExLMConfig.preset("tiny", vocab_size=40)), 2)
    groups = adamw_with_decay_groups(model, 1e-3, 0.01).param_groups
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    assert all("lr_scale" not in g for g in groups)
    matrices = sum(p.dim() >= 2 for p in model.parameters())
    assert (len(groups[0]["params"]), len(groups[1]["params"])) == (
        matrices,
        sum(1 for _ in model.parameters()) - matrices,
    )
    split = adamw_with_decay_groups(model, 1e-3, 0.01, layer_decay=0.8).param_groups
    assert len(split) == 11  # 6 depths with matrices and vectors, but the embeddings: a table
    assert sum(len(g["params"]) for g in split) == sum(1 for _ in model.parameters())
    assert {g["weight_decay"] for g in split if g["params"][0].dim() >= 2} == {0.01}


def test_a_stopped_run_resumes_to_the_uninterrupted_result(tmp_path):
    torch.set_num_threads(1)
    state = assert_resumes_exactly(tmp_path, layer_decay=0.7)
    assert state["identity"]["loop"]["layer_decay"] == 0.7


def test_the_state_names_it_only_when_used(tmp_path):
    torch.set_num_threads(1)
    _run(tmp_path, stop_after=1)
    assert "layer_decay" not in json.loads((tmp_path / STATE_JSON).read_text())["identity"]["loop"]
    with pytest.raises(StateMismatchError, match=r"loop\.layer_decay: None then, 0\.8 now"):
        _run(tmp_path, layer_decay=0.8)


@pytest.mark.parametrize("value", [0.0, -0.5, 1.5, "slow"])
def test_bad_values_are_refused_by_name(value):
    with pytest.raises(ConfigError, match="layer_decay"):
        LoopConfig(epochs=1, batch_size=2, lr=1e-3, layer_decay=value)
