"""``ema_half_life``: a moving average of the weights, validated and kept in their place.

The average is checked against one computed by hand, in float64, from the raw weights of the
same run after every update; training itself must not change (the same losses), a stopped run
must resume to the same average bit for bit, and a run without it must keep the state format
of runs from before the setting existed.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from smiexlm.errors import ConfigError
from smiexlm.finetuning import LoopConfig, engine
from smiexlm.finetuning.state import AVERAGE_FILE, STATE_JSON, StateMismatchError
from tests.unit.finetuning.test_resume_parallel import _run, assert_resumes_exactly


def _trainable(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_the_average_is_the_hand_computed_one_and_training_is_unchanged(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    start, after = {}, []
    update = engine._Fit._update

    def recording(self, train, index):
        if not after:
            start.update(_trainable(self.model))
        loss = update(self, train, index)
        after.append(_trainable(self.model))
        return loss

    monkeypatch.setattr(engine._Fit, "_update", recording)
    raw_model, raw = _run(tmp_path / "raw", select="last")
    trajectory, first = list(after), dict(start)
    monkeypatch.setattr(engine._Fit, "_update", update)
    half_life = 1.5
    avg_model, avg = _run(tmp_path / "avg", select="last", ema_half_life=half_life)

    assert [r["train_loss"] for r in avg.history] == [r["train_loss"] for r in raw.history]
    assert [r["valid"] for r in avg.history] != [r["valid"] for r in raw.history]
    steps_per_epoch = math.ceil(18 / 4)  # the helper's 18 training rows, batches of 4
    decay = 0.5 ** (1 / (half_life * steps_per_epoch))
    expected = {n: w.double() for n, w in first.items()}
    for step, weights in enumerate(trajectory):
        keep = min(decay, (1 + step) / (10 + step))
        for name in expected:
            expected[name] = keep * expected[name] + (1 - keep) * weights[name].double()
    kept = _trainable(avg_model)
    assert kept.keys() == expected.keys()
    for name, value in kept.items():
        torch.testing.assert_close(value.double(), expected[name], rtol=1e-5, atol=1e-6)
    assert not torch.equal(kept[name], _trainable(raw_model)[name])


def test_a_resumed_average_ends_where_an_uninterrupted_one_does(tmp_path):
    torch.set_num_threads(1)
    assert_resumes_exactly(tmp_path, ema_half_life=1.0)
    assert (tmp_path / "cut" / AVERAGE_FILE).is_file()


def test_without_it_the_state_is_as_before_and_with_it_another_run(tmp_path):
    torch.set_num_threads(1)
    _run(tmp_path, stop_after=1)
    state = json.loads((tmp_path / STATE_JSON).read_text())
    assert "ema_half_life" not in state["identity"]["loop"]  # older states still resume
    assert not (tmp_path / AVERAGE_FILE).exists()
    with pytest.raises(StateMismatchError, match=r"loop\.ema_half_life: None then, 2\.0 now"):
        _run(tmp_path, ema_half_life=2.0)


@pytest.mark.parametrize("value", [-1.0, "2", float("nan")])
def test_a_bad_half_life_is_refused_by_name(value):
    with pytest.raises(ConfigError, match="ema_half_life"):
        LoopConfig(epochs=1, batch_size=2, lr=1e-3, ema_half_life=value)
