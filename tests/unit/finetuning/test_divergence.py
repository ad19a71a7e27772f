"""A run that diverges stops: the first update whose gradients are not finite ends it with one
line naming where and what to lower, and it keeps no result and saves no model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smiexlm.errors import DivergedError
from smiexlm.finetuning import Examples, LoopConfig, fit
from tests.unit.finetuning.test_finetuning import _model_and_rows, _targets
from tests.unit.finetuning.test_moleculenet_finetune import _finetune_cli, _small_csv


def _poisoned_after(monkeypatch, calls: int) -> None:
    """The task loss turns NaN from its ``calls``-th call on, as a loss that overflows does."""
    import smiexlm.model.heads as heads

    real, seen = heads.task_loss, []

    def loss(*args, **kwargs):
        seen.append(1)
        value = real(*args, **kwargs)
        return value * float("nan") if len(seen) >= calls else value

    monkeypatch.setattr(heads, "task_loss", loss)


def test_a_loss_gone_nan_stops_the_loop_at_its_step_naming_the_rate(monkeypatch):
    model, rows = _model_and_rows()
    data = Examples(rows, _targets())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _poisoned_after(monkeypatch, calls=3)
    cfg = LoopConfig(epochs=2, batch_size=8, lr=1e-3, device="cpu")  # 3 updates an epoch
    with pytest.raises(DivergedError) as err:
        fit(model, data, None, cfg, None)
    assert str(err.value).startswith("fine-tuning diverged at epoch 1, step 3: the gradient norm")
    assert "lower lr (now 0.001)" in str(err.value)
    # the NaN update was never applied: the weights are those after two finite updates
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_head_first_epochs_stop_alike_naming_head_lr(monkeypatch):
    model, rows = _model_and_rows()
    data = Examples(rows, _targets())
    _poisoned_after(monkeypatch, calls=1)
    cfg = LoopConfig(epochs=1, batch_size=8, lr=1e-3, head_epochs=1, clip_norm=0.0, device="cpu")
    with pytest.raises(DivergedError, match=r"head first diverged at step 1.*lower head_lr "
                       r"\(now 0.001\), or clip the gradients"):  # fmt: skip
        fit(model, data, data, cfg, lambda z: float(-np.abs(z).mean()))


def test_weights_that_are_not_finite_are_never_kept():
    from smiexlm.training.optim import check_finite_weights

    model, _ = _model_and_rows()
    check_finite_weights(model.named_parameters(), "here", "lr")  # finite: nothing said
    with torch.no_grad():
        name, first = next(iter(model.named_parameters()))
        first.view(-1)[0] = float("nan")
    with pytest.raises(DivergedError, match=rf"^here: 1 weight tensors hold inf or NaN \({name}, "
                       r"\.\.\.\), so the run stops and keeps nothing; lower lr$"):  # fmt: skip
        check_finite_weights(model.named_parameters(), "here", "lr")


def test_a_diverged_finetune_writes_no_result_and_saves_no_model(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    path, _ = _small_csv(tmp_path)
    _poisoned_after(monkeypatch, calls=2)
    out, save = tmp_path / "out", tmp_path / "model"
    res = _finetune_cli(path, out, "--seeds", "0", "--save-dir", str(save))
    assert res.exit_code != 0
    assert isinstance(res.exception, DivergedError), res.output
    assert "epoch 1, step 2" in str(res.exception) and "lower lr" in str(res.exception)
    assert not (out / "results.csv").exists()
    assert not (save / "seed0").exists()
    assert not list(out.rglob("result.json"))
