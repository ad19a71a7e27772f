"""The fine-tuning engine: batches, evaluation order, freezing, patience, features, probe."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smiexlm.data.collate import collate
from smiexlm.errors import ConfigError
from smiexlm.finetuning import Examples, FitRun, LoopConfig, fit, predict
from smiexlm.finetuning.batches import bucketed_batches, sorted_batches

SMILES = ["CCO", "c1ccccc1O", "CC(=O)Oc1ccccc1C(=O)O", "CCN", "CCCCCCCCCC", "O=C=O", "CCCl",
          "c1ccncc1", "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "CNC", "OCCO", "CC#N"] * 2  # fmt: skip


def _model_and_rows(n_features: int = 0):
    from smiexlm.model.config import ExLMConfig
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel
    from smiexlm.tokenizer import SmilesTokenizer

    tok = SmilesTokenizer.build(SMILES)
    torch.manual_seed(0)
    cfg = ExLMConfig.preset("tiny", vocab_size=tok.vocab_size, objective="exlm")
    model = ExLMForSequencePrediction(ExLMModel(cfg), 1, "multilabel", 0.1, n_features=n_features)
    return model, tok.encode_many(SMILES)


def _targets():
    return torch.tensor([[float(len(s) % 2)] for s in SMILES])


def test_bucketed_batches_cover_every_example_once_and_cut_padding():
    lengths = np.random.default_rng(0).integers(5, 200, size=1000)
    rng = np.random.default_rng(1)
    batches = bucketed_batches(lengths, 64, rng, window=50)
    flat = np.concatenate(batches)
    assert sorted(flat.tolist()) == list(range(1000))
    padded = sum(len(b) * lengths[b].max() for b in batches)
    plain = sum(len(b) * lengths[b].max() for b in bucketed_batches(lengths, 64, rng, window=1))
    assert padded < 0.7 * plain
    assert [len(b) for b in sorted_batches(lengths, 300)] == [300, 300, 300, 100]


def test_sorted_batches_cap_padded_positions():
    lengths = np.array([5, 3, 100, 4, 50, 7, 6, 400])
    batches = sorted_batches(lengths, 3, max_tokens=100)
    assert np.concatenate(batches).tolist() == np.argsort(lengths, kind="stable").tolist()
    assert [lengths[b].tolist() for b in batches] == [[3, 4, 5], [6, 7], [50], [100], [400]]
    cost = [len(b) * lengths[b].max() for b in batches]
    assert all(c <= 100 or len(b) == 1 for c, b in zip(cost, batches, strict=True))


def test_collate_mask_and_values():
    ids, mask = collate([[1, 5, 2], [1, 2]], pad_id=0)
    assert ids.tolist() == [[1, 5, 2], [1, 2, 0]]
    assert mask.tolist() == [[True, True, True], [True, True, False]]


@pytest.mark.parametrize(("precision", "atol"), [("fp32", 1e-6), ("bf16", 5e-2)])
def test_predict_returns_input_order_whatever_the_batching(precision, atol):
    """fp32 (predict's default) is batch-invariant to 1e-6; forced bf16 rounds each batch
    shape its own way (AVX512-BF16 and AMX kernels differ), so it only keeps bf16's tolerance."""
    model, rows = _model_and_rows()
    logits = predict(model, Examples(rows), batch_size=5, precision=precision)
    one_by_one = np.concatenate(
        [predict(model, Examples([r]), batch_size=1, precision=precision) for r in rows]
    )
    np.testing.assert_allclose(logits, one_by_one, atol=atol, rtol=0)


def test_freeze_trains_the_head_only_and_freeze_layers_the_first_blocks():
    model, rows = _model_and_rows()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = Examples(rows, _targets())
    cfg = LoopConfig(epochs=2, batch_size=8, lr=1e-2, freeze=True, device="cpu")
    fit(model, data, data, cfg, lambda z: float(-np.abs(z).mean()))
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith("head.") for n in changed)

    model, rows = _model_and_rows()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = LoopConfig(epochs=2, batch_size=8, lr=1e-2, freeze_layers=2, device="cpu")
    fit(model, Examples(rows, _targets()), None, cfg, None)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert not any(n.startswith(("model.embed.", "model.encoder.layers.0.", "model.encoder.layers.1."))
                   for n in changed)  # fmt: skip
    assert any(n.startswith("model.encoder.layers.3.") for n in changed)
    with pytest.raises(ConfigError, match="freeze_layers"):
        fit(model, Examples(rows, _targets()), None, LoopConfig(1, 8, 1e-3, freeze_layers=9), None)


def test_patience_stops_early_and_is_recorded_and_best_epoch_is_restored(caplog):
    model, rows = _model_and_rows()
    data = Examples(rows, _targets())
    scores = iter([0.9, 0.5, 0.4, 0.3, 0.2, 0.1])  # best at epoch 1, then worse
    states = []

    def score(logits):
        states.append(logits.copy())
        return next(scores)

    cfg = LoopConfig(epochs=6, batch_size=8, lr=1e-2, patience=2, device="cpu")
    with caplog.at_level("INFO", logger="smiexlm.finetuning.engine"):
        result = fit(model, data, data, cfg, score, FitRun(desc="toy"))
    assert result.stopped_early and result.epochs_run == 3 and result.best_epoch == 1
    lines = [r.getMessage() for r in caplog.records]  # one per epoch, with its scores
    assert len(lines) == 3 and lines[2].startswith("toy: epoch 3 (step ")
    assert "valid 0.4000 (best 0.9000 at epoch 1)" in lines[2] and "min left" in lines[2]
    assert result.summary()["stopped_early"] is True and result.best_valid == 0.9
    restored = predict(model, data, precision=cfg.precision)  # validation's precision
    np.testing.assert_allclose(restored, states[0], atol=1e-5)  # epoch 1 weights


def test_on_epoch_sees_each_validation_and_its_exception_ends_the_run():
    """The hook gets (epoch, score) after every validation; what it raises stops training
    at that epoch and reaches the caller (a search's pruning)."""
    model, rows = _model_and_rows()
    data = Examples(rows, _targets())  # 24 examples: 3 steps per epoch
    scores = iter([0.6, 0.7, 0.65, 0.8, 0.9])
    seen: list[tuple[int, float]] = []
    cfg = LoopConfig(epochs=5, batch_size=8, lr=1e-3, device="cpu")
    result = fit(
        model, data, data, cfg, lambda z: next(scores), FitRun(on_epoch=lambda *a: seen.append(a))
    )
    assert seen == [(1, 0.6), (2, 0.7), (3, 0.65), (4, 0.8), (5, 0.9)] and result.steps == 15

    class Stop(Exception):
        pass

    def stop_at_two(epoch: int, value: float) -> None:
        seen.append((epoch, value))
        if epoch == 2:
            raise Stop(epoch)

    model, rows = _model_and_rows()
    seen.clear()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    scores = iter([0.6, 0.7, 0.65])
    with pytest.raises(Stop):
        fit(model, data, data, cfg, lambda z: next(scores), FitRun(on_epoch=stop_at_two))
    assert seen == [(1, 0.6), (2, 0.7)]
    assert next(scores) == 0.65  # no third validation: the run ended at epoch 2
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_hybrid_head_needs_its_features_and_scaler_matches_sklearn():
    from sklearn.preprocessing import StandardScaler

    from smiexlm.forests.features import FeatureScaler

    model, rows = _model_and_rows(n_features=3)
    with pytest.raises(ConfigError, match="features"):
        predict(model, Examples(rows))
    raw = np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32)
    raw[4, 1] = np.nan
    scaler = FeatureScaler.fit(raw[:40], "rdkit2d", clip=100.0)
    filled = np.where(np.isnan(raw), np.nanmedian(raw[:40], axis=0), raw)
    expected = StandardScaler().fit(filled[:40]).transform(filled)
    np.testing.assert_allclose(scaler.transform(raw), expected, atol=1e-5)
    again = FeatureScaler.from_dict(scaler.to_dict())
    np.testing.assert_allclose(again.transform(raw), scaler.transform(raw))
    assert np.abs(FeatureScaler.fit(raw[:40], "x", clip=1.0).transform(raw * 50)).max() <= 1.0


def test_a_scaler_served_with_another_rdkit_says_so_once_per_folder(caplog):
    import logging

    from smiexlm.forests.features import FeatureScaler, features_version

    record = FeatureScaler.fit(np.ones((4, 2), dtype=np.float32), "rdkit2d").to_dict()
    assert record["version"] == features_version() and features_version().startswith("RDKit ")
    older = record | {"version": "RDKit 2019.03.1"}
    with caplog.at_level(logging.WARNING, logger="smiexlm.forests.features"):
        FeatureScaler.from_dict(record, "same-rdkit")
        FeatureScaler.from_dict({k: v for k, v in record.items() if k != "version"}, "unrecorded")
        assert not caplog.text  # the same RDKit, or a folder saved before versions were kept
        for _ in range(2):
            assert FeatureScaler.from_dict(older, "older").version == "RDKit 2019.03.1"
    assert caplog.text.count("fitted with RDKit 2019.03.1") == 1 and "'older'" not in caplog.text
    assert f"computed here with {features_version()}" in caplog.text


def test_probe_scores_match_sklearn_by_hand():
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    from smiexlm.finetuning.probe import ProbeConfig, probe_split
    from smiexlm.moleculenet.splits import Split

    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 6))
    y = (x[:, :1] + 0.5 * rng.normal(size=(120, 1)) > 0).astype(float)
    split = Split("random", 0, list(range(80)), list(range(80, 100)), list(range(100, 120)))
    cfg = ProbeConfig(c_grid=(0.1,))
    valid, test, chosen, valid_pred, test_pred = probe_split(x, y, split, "classification", cfg, 0)[
        :5
    ]
    z = (x - x[:80].mean(0)) / x[:80].std(0)
    clf = LogisticRegression(C=0.1, class_weight="balanced", max_iter=2000).fit(z[:80], y[:80, 0])
    assert chosen == [0.1]
    np.testing.assert_allclose(test_pred[:, 0], clf.predict_proba(z[100:])[:, 1], rtol=1e-6)
    np.testing.assert_allclose(valid_pred[:, 0], clf.predict_proba(z[80:100])[:, 1], rtol=1e-6)
    assert test.mean == pytest.approx(roc_auc_score(y[100:, 0], clf.predict_proba(z[100:])[:, 1]))
    assert valid.mean == pytest.approx(
        roc_auc_score(y[80:100, 0], clf.predict_proba(z[80:100])[:, 1])
    )


def test_precision_auto_is_bf16_on_cuda_and_on_bf16_native_cpus_only(monkeypatch):
    import smiexlm.device as policy

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert policy.uses_bf16(cuda, "auto") and not policy.uses_bf16(cuda, "fp32")
    assert policy.uses_bf16(cpu, "bf16") and not policy.uses_bf16(cpu, "fp32")
    for native in (False, True):
        monkeypatch.setattr(policy, "cpu_has_native_bf16", lambda native=native: native)
        assert policy.uses_bf16(cpu, "auto") is native
    # fine-tuning's former amp="off" is fp32; anything else names the field
    assert LoopConfig(epochs=1, batch_size=8, lr=1e-3, precision="off").precision == "fp32"  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="precision"):
        LoopConfig(epochs=1, batch_size=8, lr=1e-3, precision="fp16")  # type: ignore[arg-type]
    model, rows = _model_and_rows()
    cfg = LoopConfig(epochs=1, batch_size=8, lr=1e-3, precision="fp32", device="cpu")
    assert fit(model, Examples(rows, _targets()), None, cfg, None).summary()["precision"] == "fp32"


def test_scores_of_no_molecule_have_the_labels_width():
    """An empty pass reports (0, 0) logits; a regression head's scores are still (0, T), so
    a batch none of whose SMILES can be served gives NaN rows, not a broadcast error."""
    from smiexlm.finetuning.inference import to_scores

    empty = np.zeros((0, 0), dtype=np.float32)
    mean, std = np.array([1.0, 2.0]), np.array([0.5, 0.5])
    assert to_scores(empty, "regression", mean, std).shape == (0, 2)
    assert to_scores(np.ones((1, 2)), "regression", mean, std).tolist() == [[1.5, 2.5]]
