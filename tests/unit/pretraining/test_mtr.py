"""Descriptor regression: the ``mtr`` objective and the descriptor auxiliary of mlm/exlm/maelm.

Hand-computed losses, NaN masking, the wiring of the "masked" and "clean" auxiliary inputs,
an overfit test, training end to end (metrics, exact resume, export, predictions in
descriptor units), pinned losses of ``mol_tiny_mtr`` and a DDP run.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os

import numpy as np
import pytest
import torch

from smiexlm.chemistry.descriptor_stats import DescriptorStats, fit_descriptor_stats
from smiexlm.chemistry.fingerprints import rdkit2d_descriptors
from smiexlm.data.pipeline import PreprocessConfig, preprocess
from smiexlm.errors import ConfigError
from smiexlm.model.config import ExLMConfig
from smiexlm.model.heads import task_loss
from smiexlm.model.model import ExLMModel
from smiexlm.model.pooling import pool
from smiexlm.pretraining.config import load_config
from smiexlm.tokenizer import SmilesTokenizer
from tests.conftest import require_file
from tests.unit.pretraining.test_training_pinned import PINNED_RUN
from tests.unit.pretraining.test_training_support import FAST, MICRO_MODEL, ddp_and_one_process

NAN = float("nan")
MICRO = dict(n_layers=2, n_heads=2, d_model=32, d_ff=64, n_transition_heads=2, dropout=0.0,
             attention_dropout=0.0)  # fmt: skip


@pytest.fixture(scope="module")
def dataset(shared_data, tmp_path_factory):
    """300 MOSES test molecules (and one with NaN descriptors) with rdkit2d targets."""
    source = require_file(shared_data, "pretrain/moses_test.smi.gz")
    with gzip.open(source, "rt") as handle:
        smiles = [line.strip() for line in itertools.islice(handle, 300)] + ["CC[Se]CC"]
    root = tmp_path_factory.mktemp("mtr")
    raw = root / "mols.smi"
    raw.write_text("\n".join(smiles) + "\n")
    vocab = SmilesTokenizer.build(smiles).save(root / "vocab.json")
    config = PreprocessConfig(valid_fraction=0.1, descriptors="rdkit2d")
    preprocess([raw], root / "ds", config, vocab=vocab, progress=False)
    return root / "ds"


# ------------------------------------------------------------------ losses by hand
def test_masked_losses_by_hand():
    pred = torch.tensor([[0.0, 2.0], [1.0, 3.0]], requires_grad=True)
    target = torch.tensor([[1.0, NAN], [1.0, 0.0]])
    mse = task_loss(pred, target, "regression")  # (1 + 0 + 9) / 3 present entries
    assert float(mse.detach()) == pytest.approx(10 / 3)
    huber = task_loss(pred, target, "regression", "huber")  # 0.5·1² + 0 + (3 − 0.5)
    assert float(huber.detach()) == pytest.approx(3.0 / 3)
    mse.backward()
    assert pred.grad[0, 1] == 0.0  # a NaN target gives no gradient
    assert pred.grad[1, 1] == pytest.approx(2 * 3 / 3)
    empty = task_loss(pred, torch.full((2, 2), NAN), "regression")
    assert float(empty.detach()) == 0.0 and empty.requires_grad  # nothing present: 0, graph kept


def _batch(vocab_size: int, b: int = 3, t: int = 9, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (b, t), generator=g)
    ids[:, 0], ids[:, -1] = 1, 2  # BOS ... EOS
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[0, 6:] = False  # a padded row
    ids[0, 6:], ids[0, 5] = 0, 2
    return ids, mask


def test_mtr_forward_is_the_head_on_the_pooled_state_with_masked_mse():
    torch.manual_seed(0)
    config = ExLMConfig.tiny(objective="mtr", n_descriptors=4, descriptor_pooling="mean", **MICRO)
    model = ExLMModel(config).eval()
    assert model.lm_head is None
    ids, mask = _batch(config.vocab_size)
    target = torch.tensor([[0.5, NAN, -1.0, 2.0], [NAN] * 4, [0.0, 1.0, 1.0, -3.0]])
    out = model(ids, mask, descriptors=target)
    hidden = model.encode(ids, mask, pooling="mean").hidden_states  # (B, T, d)
    pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    head = model.descriptor_head
    pred = head.out_proj(torch.tanh(head.dense(pooled))).detach().numpy()
    t = target.numpy()
    present = ~np.isnan(t)
    expected = ((pred - np.nan_to_num(t)) ** 2)[present].mean()
    assert float(out.loss.detach()) == pytest.approx(float(expected), rel=1e-5)
    assert out.desc_loss is out.loss and out.n_descriptor_targets == int(present.sum()) == 7
    np.testing.assert_allclose(out.logits.detach().numpy(), pred, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match="n_descriptors"):
        ExLMModel(ExLMConfig.tiny(objective="mtr", **MICRO))
    with pytest.raises(ConfigError, match="aux_descriptor_weight"):
        ExLMConfig.tiny(objective="mtr", n_descriptors=4, aux_descriptor_weight=1.0)


@pytest.mark.parametrize("objective", ["mlm", "exlm", "maelm"])
@pytest.mark.parametrize("source", ["masked", "clean"])
@torch.no_grad()
def test_auxiliary_adds_the_weighted_descriptor_loss(objective, source):
    torch.manual_seed(0)
    base = ExLMConfig.tiny(objective=objective, **MICRO)
    config = ExLMConfig.tiny(objective=objective, n_descriptors=3, aux_descriptor_weight=0.5,
                             aux_descriptor_input=source, **MICRO)  # fmt: skip
    model = ExLMModel(config).eval()
    plain = ExLMModel(base).eval()
    weights = {k: v for k, v in model.state_dict().items() if not k.startswith("descriptor_")}
    plain.load_state_dict(weights)
    clean, mask = _batch(config.vocab_size)
    labels = torch.full_like(clean, -100)
    masked = clean.clone()
    masked[:, 2], labels[:, 2] = config.mask_id, clean[:, 2]  # one masked token per row
    target = torch.tensor([[1.0, NAN, 0.0], [0.5, 0.5, 0.5], [NAN, -1.0, 2.0]])
    out = model(masked, mask, labels, descriptors=target)
    assert float(out.lm_loss) == pytest.approx(float(plain(masked, mask, labels).loss), rel=1e-6)
    assert float(out.loss) == pytest.approx(float(out.lm_loss) + 0.5 * float(out.desc_loss))
    seen = clean if source == "clean" else masked  # what the descriptor head pooled
    enc = model.encode(seen, mask, pooling="cls")
    pred = model.descriptor_head(pool(enc.hidden_states, enc.attention_mask, "cls"))
    torch.testing.assert_close(out.descriptor_predictions, pred, rtol=1e-5, atol=1e-6)
    expected = task_loss(pred, target, "regression")
    assert float(out.desc_loss) == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("objective", ["mtr", "exlm"])
def test_bf16_autocast_keeps_the_descriptor_loss_in_fp32(objective):
    torch.manual_seed(0)
    aux = {} if objective == "mtr" else {"aux_descriptor_weight": 1.0}
    config = ExLMConfig.tiny(objective=objective, n_descriptors=3, **aux, **MICRO)
    model = ExLMModel(config)
    ids, mask = _batch(config.vocab_size)
    labels = torch.full_like(ids, -100)
    labels[:, 2], ids[:, 2] = ids[:, 2], config.mask_id
    target = torch.tensor([[1.0, NAN, 0.0], [0.5, 0.5, 0.5], [NAN, -1.0, 2.0]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, mask, labels, descriptors=target)
    assert out.desc_loss.dtype == out.descriptor_predictions.dtype == torch.float32
    out.loss.backward()
    grad = model.descriptor_head.out_proj.weight.grad
    assert torch.isfinite(out.loss) and grad is not None and torch.isfinite(grad).all()


# ------------------------------------------------------------------ overfit
STEPS = 200  # full-batch Adam, lr 1e-2: MSE 1.09 -> about 0.01


def test_tiny_model_memorises_the_descriptors_of_32_molecules(shared_data):
    source = require_file(shared_data, "pretrain/moses_test.smi.gz")
    with gzip.open(source, "rt") as handle:
        smiles = [line.strip() for line in itertools.islice(handle, 32)]
    raw = rdkit2d_descriptors(smiles)  # (32, D)
    names = [f"d{j}" for j in range(raw.shape[1])]
    stats = fit_descriptor_stats([raw.astype(np.float32)], "rdkit2d", names)
    target = torch.from_numpy(stats.normalize(raw))
    tokenizer = SmilesTokenizer.build(smiles)
    batch = tokenizer.encode_batch(smiles)
    torch.manual_seed(0)
    config = ExLMConfig.tiny(vocab_size=tokenizer.vocab_size, objective="mtr",
                             n_descriptors=raw.shape[1], **{**MICRO, "d_model": 64})  # fmt: skip
    model = ExLMModel(config)
    model.descriptor_stats = stats
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    first, threads = None, torch.get_num_threads()
    torch.set_num_threads(1)  # milliseconds per step; threads only contend at this size
    try:
        for _ in range(STEPS):
            loss = model(batch.input_ids, batch.attention_mask, descriptors=target).loss
            first = float(loss.detach()) if first is None else first
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.eval()
    with torch.no_grad():
        final = float(model(batch.input_ids, batch.attention_mask, descriptors=target).loss)
    assert first > 0.5 and final < 0.05, (first, final)
    predicted = model.predict_descriptors(batch.input_ids, batch.attention_mask).numpy()
    reference = stats.denormalize(target.numpy())  # the clipped targets in descriptor units
    error = np.abs(predicted - reference) / stats.scale
    assert np.nanmedian(error) < 0.15


# ------------------------------------------------------------------ training
def _train(dataset, out, config_name, *overrides, **kwargs):
    from smiexlm.pretraining.trainer import pretrain

    config = load_config(config_name, [*MICRO_MODEL, *FAST, 'precision="fp32"', *overrides])
    return pretrain(config, dataset, out, **kwargs)


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_auxiliary_training_logs_resumes_exactly_and_exports(dataset, tmp_path):
    from smiexlm.pretraining.export import export_run

    steps = ["max_steps=8", "total_steps=8", "valid_every=4", "save_every=4"]
    full = _train(dataset, tmp_path / "full", "mol_tiny_exlm_desc", *steps)
    half = tmp_path / "half"
    _train(dataset, half, "mol_tiny_exlm_desc", *steps, max_steps=4)
    resumed = _train(dataset, half, "mol_tiny_exlm_desc", *steps, resume=True)
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    records = _records(tmp_path / "full")
    assert [r["loss"] for r in records] == [r["loss"] for r in _records(half)]
    assert all("desc_loss" in r for r in records)
    assert "valid_desc_loss" in records[-1] and "valid_loss" in records[-1]
    checkpoint = tmp_path / "full" / "checkpoints" / "last"
    assert DescriptorStats.load(checkpoint / "descriptors.json").names == (
        DescriptorStats.load(dataset / "descriptors.json").names
    )
    model_dir = tmp_path / "model"
    export_run(tmp_path / "full", model_dir, dataset=dataset)
    model = ExLMModel.from_pretrained(model_dir)
    assert model.config.aux_descriptor_weight == 1.0 and model.descriptor_stats is not None
    card = (model_dir / "MODEL_CARD.md").read_text()
    assert "| descriptor regression | auxiliary, weight 1, on the masked input: MSE" in card
    tokenizer = SmilesTokenizer.load(model_dir / "vocab.json")
    batch = tokenizer.encode_batch(["CCO", "c1ccccc1O"])
    values = model.predict_descriptors(batch.input_ids, batch.attention_mask)
    assert values.shape == (2, model.config.n_descriptors) and torch.isfinite(values).all()


def test_processes_that_resume_from_different_checkpoints_are_refused(dataset, tmp_path):
    """Two nodes whose --out are two folders (not one shared one): rank 0 finds no checkpoint
    where rank 1 finds step 12; every rank refuses, naming what each found."""
    from smiexlm.pretraining.resume import start_state
    from smiexlm.training.run_state import ResumeMismatchError

    model = ExLMModel(ExLMConfig.tiny(objective="mtr", n_descriptors=4, **MICRO))
    optimizer = torch.optim.Adam(model.parameters())
    args = (tmp_path / "run", dataset, "hash", model, optimizer, True, False)
    with pytest.raises(ResumeMismatchError, match=r"rank 0: none, rank 1: step 12\).*shared"):
        start_state(*args, lambda step: [step, 12])
    start, state = start_state(*args, lambda step: [step, step])  # all alike: from scratch
    assert start is None and state.step == 0


# Training loss of mol_tiny_mtr, steps 1..20 (precision fp32, one thread, one process).
PINNED_MTR_LOSSES = [
    1.156047,
    0.90226,
    1.002486,
    0.750403,
    1.606953,
    0.870395,
    0.938331,
    0.843063,
    0.854532,
    0.89551,
    1.338499,
    0.773998,
    0.765286,
    0.953415,
    0.828339,
    0.866985,
    0.891935,
    1.206367,
    0.763833,
    0.816498,
]


def test_tiny_mtr_run_repeats_the_pinned_losses(dataset, tmp_path):
    from smiexlm.pretraining.trainer import pretrain

    out = tmp_path / "run"
    pretrain(load_config("mol_tiny_mtr", PINNED_RUN), dataset, out, max_steps=20)
    records = _records(out)
    losses = [r["loss"] for r in records]
    if os.environ.get("PINNED_LOSSES_PRINT"):
        print("PINNED_MTR_LOSSES =", [round(x, 6) for x in losses])
    assert [r["desc_loss"] for r in records] == losses  # mtr: the loss is the descriptors'
    assert len(losses) == 20
    assert losses == pytest.approx(PINNED_MTR_LOSSES, abs=1e-4)
    assert records[-1]["valid_loss"] == records[-1]["valid_desc_loss"]


# ------------------------------------------------------------------ DDP
@pytest.mark.slow
def test_two_process_ddp_with_descriptors_matches_one_process(dataset, tmp_path):
    overrides = [*MICRO_MODEL, *FAST, "max_steps=4", "valid_every=4", 'precision="fp32"']
    ddp, single, r0, r1, ref = ddp_and_one_process(dataset, tmp_path, "mol_tiny_exlm_desc", overrides)  # fmt: skip
    assert all(torch.equal(r0[k], r1[k]) for k in r0)
    for k in r0:
        torch.testing.assert_close(r0[k], ref[k], rtol=1e-4, atol=1e-5)
    for a, b in zip(_records(ddp), _records(single), strict=True):
        assert a["desc_loss"] == pytest.approx(b["desc_loss"], rel=1e-4, abs=1e-6)
