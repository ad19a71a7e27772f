"""``head_epochs``: the head alone on the frozen encoder first, then the whole model (LP-FT).

The head-only stage must leave the encoder untouched and its trainability as it was, fit the
head (the training loss falls), leave the schedule after it the batches it would have had
without it, be validated as epoch 0 (which selection may keep), resume bit for bit, and be
absent from the state of a run without it, so older states still resume.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from smiexlm.errors import ConfigError
from smiexlm.finetuning import LoopConfig, engine
from smiexlm.finetuning.state import STATE_JSON, StateMismatchError
from tests.unit.finetuning.test_resume_parallel import _run, _weights, assert_resumes_exactly


def _encoder(model):
    return {k: v.detach().clone() for k, v in model.model.state_dict().items()}


def test_the_head_stage_fits_the_head_and_leaves_the_encoder(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    seen = {}
    head_first = engine._Fit._head_first

    def recording(self, bar):
        seen["encoder"], seen["head"] = _encoder(self.model), _weights(self.model.head)
        seen["grads"] = [p.requires_grad for p in self.model.parameters()]
        head_first(self, bar)
        seen["encoder after"], seen["head after"] = _encoder(self.model), _weights(self.model.head)
        seen["grads after"] = [p.requires_grad for p in self.model.parameters()]

    monkeypatch.setattr(engine._Fit, "_head_first", recording)
    _, result = _run(tmp_path, head_epochs=30, head_lr=1e-2, dropout=0.0)
    before, after = seen["encoder"], seen["encoder after"]
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert any(not torch.equal(seen["head"][k], seen["head after"][k]) for k in seen["head"])
    assert seen["grads after"] == seen["grads"] and all(seen["grads"])
    first = result.history[0]
    assert (first["epoch"], first["step"]) == (0, 0) and "valid" in first
    assert [r["epoch"] for r in result.history] == list(range(6))


def test_the_head_stage_lowers_the_training_loss(tmp_path):
    """Thirty epochs of the head alone fit the frozen features better than the random head:
    the stage's last epoch's loss is below the first epoch's loss of a run without it."""
    torch.set_num_threads(1)
    _, plain = _run(tmp_path / "plain", epochs=1, lr=1e-9, dropout=0.0)
    _, fitted = _run(tmp_path / "head", epochs=1, lr=1e-9, dropout=0.0, head_epochs=30,
                     head_lr=1e-2)  # fmt: skip
    assert fitted.history[0]["train_loss"] < 0.9 * plain.history[0]["train_loss"]


def test_the_schedule_after_it_draws_the_same_batches(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    drawn: list[list[np.ndarray]] = []
    batches = engine.bucketed_batches

    def recording(*args, **kwargs):
        out = batches(*args, **kwargs)
        drawn[-1].append([np.array(b) for b in out])
        return out

    monkeypatch.setattr(engine, "bucketed_batches", recording)
    runs = []
    for name, loop in (("plain", {}), ("head", {"head_epochs": 2})):
        drawn.append([])
        runs.append(_run(tmp_path / name, **loop)[1])
    plain, head = drawn
    assert len(plain) == len(head) == 5
    for a, b in zip(plain, head, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert runs[0].history[0]["train_loss"] != runs[1].history[1]["train_loss"]


def test_selection_may_keep_the_head_stage(tmp_path, monkeypatch):
    """With a score that never improves, the earliest validation (epoch 0) is kept: the
    pretrained encoder and the fitted head, as the stage left them."""
    torch.set_num_threads(1)
    seen = {}
    head_first = engine._Fit._head_first

    def recording(self, bar):
        head_first(self, bar)
        seen["weights"] = _weights(self.model)

    monkeypatch.setattr(engine._Fit, "_head_first", recording)
    model, result = _run(tmp_path, score=lambda logits: 0.5, head_epochs=3)
    assert result.best_epoch == 0 and result.epochs_run == 5
    kept = _weights(model)
    assert all(torch.equal(kept[k], seen["weights"][k]) for k in kept)


def test_a_stopped_run_resumes_to_the_uninterrupted_result(tmp_path):
    torch.set_num_threads(1)
    assert_resumes_exactly(tmp_path, head_epochs=3)


def test_the_state_names_it_only_when_used(tmp_path):
    torch.set_num_threads(1)
    _run(tmp_path, stop_after=1)
    loop = json.loads((tmp_path / STATE_JSON).read_text())["identity"]["loop"]
    assert "head_epochs" not in loop and "head_lr" not in loop  # older states still resume
    with pytest.raises(StateMismatchError, match=r"loop\.head_epochs: None then, 2 now"):
        _run(tmp_path, head_epochs=2)


@pytest.mark.parametrize(
    ("loop", "field"),
    [
        ({"head_epochs": -1}, "head_epochs"),
        ({"head_epochs": 1.5}, "head_epochs"),
        ({"head_epochs": True}, "head_epochs"),
        ({"head_epochs": 2, "freeze": True}, "head_epochs"),
        ({"head_lr": 0.0}, "head_lr"),
        ({"head_lr": "fast"}, "head_lr"),
    ],
)
def test_bad_settings_are_refused_by_name(loop, field):
    with pytest.raises(ConfigError, match=field):
        LoopConfig(epochs=1, batch_size=2, lr=1e-3, **loop)


def test_cli_finetune_with_the_head_first_records_it(tmp_path):
    from tests.unit.finetuning.test_moleculenet_finetune import _finetune

    torch.set_num_threads(1)
    rows = _finetune(tmp_path, "--seeds", "0", "--head-epochs", "2", "--head-lr", "3e-3")
    assert rows["model"][0] == "default_model, head first (2 epochs)"
    config = json.loads(rows["config"][0])
    assert config["head_epochs"] == 2 and config["head_lr"] == 3e-3
    plain = json.loads(_finetune(tmp_path, "--seeds", "0")["config"][0])
    assert "head_epochs" in plain and plain["head_epochs"] == 0
