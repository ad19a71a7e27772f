"""A fine-tuning run's state per epoch (exact resume) and data parallel fine-tuning.

A run stopped after an epoch and resumed from its state must end where an uninterrupted run
ends: the same history, best epoch and weights, bit for bit. N processes must optimise the
one-process objective: without dropout, their weights after an epoch equal one process's to
float32 rounding.
"""

from __future__ import annotations

import atexit
import json
import os

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from smiexlm.errors import DataError
from smiexlm.finetuning import Examples, FitRun, LoopConfig, engine, fit, frozen
from smiexlm.finetuning.state import STATE_JSON, StateMismatchError
from tests.conftest import free_port
from tests.unit.finetuning.test_finetuning import SMILES

LABELS = torch.tensor([[float(len(s) % 2), float("c" in s)] for s in SMILES])
LABELS[3, 1] = float("nan")  # a missing label: the shares' weights must count it out


def _run(tmp, stop_after: int | None = None, dropout: float = 0.1, score=None, **loop):
    from smiexlm.model.config import ExLMConfig
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel
    from smiexlm.tokenizer import SmilesTokenizer

    tok = SmilesTokenizer.build(SMILES)
    torch.manual_seed(0)
    cfg = ExLMConfig.preset("tiny", vocab_size=tok.vocab_size, objective="exlm", dropout=dropout,
                            attention_dropout=dropout)  # fmt: skip
    model = ExLMForSequencePrediction(ExLMModel(cfg), 2, "multilabel", dropout)
    rows = tok.encode_many(SMILES)
    train = Examples(rows[:18], LABELS[:18])
    valid = Examples(rows[18:], LABELS[18:])
    config = LoopConfig(**{"epochs": 5, "batch_size": 4, "lr": 1e-3, "device": "cpu"} | loop)
    if score is None:
        score = lambda logits: float(-np.abs(logits).mean())  # noqa: E731 - any score will do
    if stop_after is None:
        return model, fit(model, train, valid, config, score, FitRun(0, state_dir=tmp))
    saves = engine._Fit._save

    def stopping(self):
        saves(self)
        if self.result.epochs_run == stop_after:
            raise KeyboardInterrupt

    engine._Fit._save = stopping
    try:
        fit(model, train, valid, config, score, FitRun(0, state_dir=tmp))
    except KeyboardInterrupt:
        return model, None
    finally:
        engine._Fit._save = saves
    raise AssertionError("the run did not stop")


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_resumes_exactly(tmp, **loop):
    """A run of ``loop`` stopped after its second epoch and resumed ends where an
    uninterrupted one does: the same history, best epoch and weights, bit for bit."""
    whole_model, whole = _run(tmp / "whole", **loop)
    _run(tmp / "cut", stop_after=2, **loop)
    state = json.loads((tmp / "cut" / STATE_JSON).read_text())
    assert state["progress"]["epochs_run"] == 2
    resumed_model, resumed = _run(tmp / "cut", **loop)
    assert resumed.history == whole.history and resumed.best_epoch == whole.best_epoch
    assert resumed.steps == whole.steps and resumed.resumed_seconds > 0
    a, b = _weights(whole_model), _weights(resumed_model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    return state


def test_a_resumed_run_ends_exactly_where_an_uninterrupted_one_does(tmp_path):
    torch.set_num_threads(1)
    assert_resumes_exactly(tmp_path, patience=None)


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.safetensors", STATE_JSON])
def test_a_state_file_changed_since_it_was_kept_is_refused_by_name(tmp_path, name):
    torch.set_num_threads(1)
    _run(tmp_path, stop_after=2)
    path = tmp_path / name
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # still readable: only its sha256 tells
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=f"{name}.*sha256"):
        _run(tmp_path)


def test_a_finished_state_only_selects_and_returns(tmp_path):
    torch.set_num_threads(1)
    model, first = _run(tmp_path)
    again_model, again = _run(tmp_path)  # the state says every step is done
    assert again.history == first.history and again.best_epoch == first.best_epoch
    a, b = _weights(model), _weights(again_model)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("freeze", [False, True])
def test_a_resumed_run_keeps_the_precision_it_began_in(tmp_path, monkeypatch, freeze):
    """Stopped where "auto" meant fp32 and resumed where it means bf16: the run goes on in
    fp32 and says fp32, rather than training in both and recording one. A frozen encoder's
    features are computed in that precision too."""
    from smiexlm import device

    torch.set_num_threads(1)
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)
    _run(tmp_path / "cut", stop_after=2, freeze=freeze)
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)  # another machine
    used, autocast, predict = [], engine.autocast, engine.predict
    monkeypatch.setattr(engine, "autocast", lambda dev, p: used.append(p) or autocast(dev, p))
    for module in (engine, frozen):  # validation, and the frozen encoder's features
        monkeypatch.setattr(
            module, "predict", lambda *a, **k: used.append(a[3]) or predict(*a, **k)
        )
    _, resumed = _run(tmp_path / "cut", freeze=freeze)
    assert resumed.precision == "fp32" and used and set(used) == {"fp32"}
    used.clear()
    _, fresh = _run(tmp_path / "fresh", epochs=1, freeze=freeze)  # "auto" resolves anew
    assert fresh.precision == "bf16" and set(used) == {"auto"}


def test_a_resumed_run_switches_precision_only_when_one_is_named_and_says_so(tmp_path, monkeypatch):
    """A bf16 state resumed with precision="fp32" goes on in fp32 (a machine that emulates
    bf16 would take several times as long) and records both; "auto" keeps its own."""
    from smiexlm import device

    torch.set_num_threads(1)
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)
    _run(tmp_path / "cut", stop_after=2, epochs=4)
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)  # another machine
    used, autocast = [], engine.autocast
    monkeypatch.setattr(engine, "autocast", lambda dev, p: used.append(p) or autocast(dev, p))
    _, switched = _run(tmp_path / "cut", epochs=4, precision="fp32")
    assert set(used) == {"fp32"} and switched.epochs_run == 4
    assert switched.precision == "fp32" and switched.precision_before == [["bf16", 2]]
    assert switched.summary()["precision"] == "bf16 to epoch 2, then fp32"
    used.clear()
    _run(tmp_path / "kept", stop_after=2, epochs=4, precision="bf16")
    _, kept = _run(tmp_path / "kept", epochs=4)  # "auto" goes on in the state's own
    assert set(used) == {"bf16"} and kept.summary()["precision"] == "bf16"


def test_a_state_of_other_settings_or_damaged_is_refused(tmp_path):
    torch.set_num_threads(1)
    _run(tmp_path, stop_after=1)
    with pytest.raises(StateMismatchError, match=r"loop\.lr: 0\.001 then, 0\.002 now"):
        _run(tmp_path, lr=2e-3)
    (tmp_path / STATE_JSON).write_text("{")
    with pytest.raises(DataError, match="state.json.*sha256"):
        _run(tmp_path)
    (tmp_path / "checksums.json").unlink()  # a state kept before its files' sha256 were
    with pytest.raises(DataError, match="not valid JSON"):
        _run(tmp_path)


# ------------------------------------------------------------------ data parallel
def _replica(rank: int, world: int, port: int, folder: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    torch.set_num_threads(1)
    model, result = _run(None, dropout=0.0, epochs=2, precision="fp32")
    if rank == 0:
        torch.save(_weights(model), os.path.join(folder, "weights.pt"))
        with open(os.path.join(folder, "history.json"), "w") as handle:
            json.dump(result.history, handle)
    # The group fit joined stays to the process's end, where Replicas.join's exit handler
    # destroys it: run the exit handlers now to see it go.
    assert torch.distributed.is_initialized()
    atexit._run_exitfuncs()
    assert not torch.distributed.is_initialized()


def test_two_processes_optimise_the_one_process_objective(tmp_path):
    torch.set_num_threads(1)
    one_model, one = _run(None, dropout=0.0, epochs=2, precision="fp32")
    mp.spawn(_replica, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    two = json.loads((tmp_path / "history.json").read_text())
    weights = torch.load(tmp_path / "weights.pt")
    for key, value in _weights(one_model).items():
        torch.testing.assert_close(weights[key], value, rtol=1e-4, atol=1e-5, msg=key)
    for a, b in zip(one.history, two, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        assert a["valid"] == pytest.approx(b["valid"], rel=1e-4)
