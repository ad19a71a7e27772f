"""The linear probe's hybrid features: filled and scaled on the train rows of each split."""

from __future__ import annotations

import numpy as np
import pytest

from smiexlm.errors import ConfigError
from smiexlm.finetuning import probe as probe_module
from smiexlm.finetuning.probe import ProbeConfig, probe_split, run_probe
from smiexlm.moleculenet.splits import make_split
from smiexlm.moleculenet.task import MoleculeTask

N = 100


class _Backbone:
    """What run_probe asks of a backbone, with the embeddings given."""

    name, pooling, layers, weights_sha256 = "fixed", "cls", 1, None

    def model_texts(self, smiles, canonicalize):
        return list(smiles)


def _data(seed: int = 0, classes: bool = True):
    rng = np.random.default_rng(seed)
    signal = rng.normal(size=N)
    labels = (signal + 0.3 * rng.normal(size=N))[:, None]
    labels = (labels > 0).astype(float) if classes else labels
    feature = signal.copy()
    feature[::3] = np.nan  # not computable for a third of the molecules
    smiles = ["C" * (i + 1) for i in range(N)]
    return rng.normal(size=(N, 4)), feature[:, None], labels, smiles


def test_test_rows_do_not_change_the_fill_of_the_others(monkeypatch):
    embeddings, feature, labels, smiles = _data(classes=False)
    test_rows = make_split(smiles, "random", 0).test
    # a regression target: its valid RMSE moves with any change of the fill
    task = MoleculeTask("toy", smiles, labels, ["y"], "regression")
    monkeypatch.setattr(probe_module, "_pooled", lambda *_: embeddings)
    runs = []
    for test_value in (-50.0, 50.0):  # every computable test feature pulled one way
        raw = feature.copy()
        known = [i for i in test_rows if not np.isnan(raw[i, 0])]
        raw[known, 0] = test_value
        monkeypatch.setattr(
            "smiexlm.chemistry.fingerprints.molecule_features", lambda *_, r=raw, **__: r
        )
        cfg = ProbeConfig(split="random", features="rdkit2d", c_grid=(0.01, 1.0))
        (result,) = run_probe(task, _Backbone(), [0], cfg)
        runs.append(result)
    # the model is fitted and chosen without the test rows, so nothing before test moves
    assert runs[0].valid == runs[1].valid
    assert runs[0].config["chosen_c"] == runs[1].config["chosen_c"]


def test_missing_features_take_the_train_median_by_hand():
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    embeddings, feature, labels, smiles = _data(1)
    split = make_split(smiles, "random", 0)
    train, valid, test = (np.asarray(p) for p in (split.train, split.valid, split.test))
    cfg = ProbeConfig(c_grid=(0.1,), features="rdkit2d")
    got_valid, got_test, chosen, *_ = probe_split(
        embeddings, labels, split, "classification", cfg, 0, feature
    )
    median = np.nanmedian(feature[train, 0])
    x = np.hstack([embeddings, np.where(np.isnan(feature), median, feature)])
    z = (x - x[train].mean(0)) / x[train].std(0)
    clf = LogisticRegression(C=0.1, class_weight="balanced", max_iter=2000).fit(
        z[train], labels[train, 0]
    )
    assert chosen == [0.1]
    assert got_valid.mean == pytest.approx(
        roc_auc_score(labels[valid, 0], clf.predict_proba(z[valid])[:, 1])
    )
    assert got_test.mean == pytest.approx(
        roc_auc_score(labels[test, 0], clf.predict_proba(z[test])[:, 1])
    )


def test_a_deterministic_split_is_fitted_once_for_every_seed(monkeypatch, tmp_path):
    embeddings, _, labels, _ = _data()
    smiles = [f"C1{'C' * ring}C1{'C' * chain}" for ring in range(1, 11) for chain in range(10)]
    task = MoleculeTask("toy", smiles, labels, ["y"], "classification")  # 10 scaffolds
    monkeypatch.setattr(probe_module, "_pooled", lambda *_: embeddings)
    calls = []
    real = probe_module.probe_split
    monkeypatch.setattr(probe_module, "probe_split", lambda *a: calls.append(a) or real(*a))
    cfg = ProbeConfig(c_grid=(0.1, 1.0))
    scaffold = run_probe(task, _Backbone(), [0, 1, 2], cfg, run_root=tmp_path)
    assert len(calls) == 1 and len({(r.valid, r.test) for r in scaffold}) == 1
    kept = [np.load(tmp_path / "toy" / f"seed{s}" / "predictions.npz")["test"] for s in (0, 2)]
    np.testing.assert_array_equal(*kept)
    calls.clear()
    run_probe(task, _Backbone(), [0, 1], ProbeConfig(c_grid=(0.1,), split="random"))
    assert len(calls) == 2  # a seeded split kind: one fit per seed


def test_tta_embeddings_are_the_mean_over_the_spellings():
    """tta=K: each row is the mean of the canonical SMILES' embedding and its K random
    spellings' (seed 0), each embedded on its own."""
    import torch

    from smiexlm.data.augment import random_smiles
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.probe import pooled_embeddings

    torch.set_num_threads(1)
    backbone, inputs = Backbone(), ["CCO", "c1ccccc1CN", "CC(=O)Nc1ccc(O)cc1"]
    cfg = ProbeConfig(device="cpu", pooling="cls")
    spellings = [inputs] + [list(v) for v in zip(*random_smiles(inputs, 3, 0), strict=True)]
    each = [pooled_embeddings(backbone, view, cfg) for view in spellings]
    got = pooled_embeddings(backbone, inputs, ProbeConfig(device="cpu", pooling="cls", tta=3))
    np.testing.assert_allclose(got, np.mean(each, axis=0), rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, each[0])
    with pytest.raises(ConfigError, match="tta"):
        ProbeConfig(tta=-1)


def test_layers_put_the_last_blocks_side_by_side_as_the_featurizer_pools_them():
    """layers=3: the last, second-last and third-last blocks' poolings, equal to the
    Featurizer's embedding of each block (an independent path: its own batching)."""
    import torch

    from smiexlm.embedding.featurizer import Featurizer
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.probe import pooled_embeddings

    torch.set_num_threads(1)
    backbone = Backbone()
    inputs = backbone.model_texts(["CCO", "c1ccccc1CN", "CC(=O)Nc1ccc(O)cc1", "C"], True)
    cfg = ProbeConfig(device="cpu", pooling="cls+mean", layers=3)
    got = pooled_embeddings(backbone, inputs, cfg)
    featurizer = Featurizer.from_pretrained(None, device="cpu")
    blocks = [featurizer.featurize(inputs, pooling="cls+mean", layer=layer, whiten=False,
                                   canonicalize=False) for layer in (-1, -2, -3)]  # fmt: skip
    np.testing.assert_allclose(got, np.hstack(blocks), rtol=1e-4, atol=1e-5)
    last = pooled_embeddings(backbone, inputs, ProbeConfig(device="cpu", pooling="cls+mean",
                                                           layers=1))  # fmt: skip
    np.testing.assert_allclose(last, blocks[0], rtol=1e-4, atol=1e-5)
    with pytest.raises(ConfigError, match="layers"):
        pooled_embeddings(backbone, inputs, ProbeConfig(device="cpu", layers=9))
    with pytest.raises(ConfigError, match="no whitening for cls\\+mean pooling of the last 2"):
        pooled_embeddings(backbone, inputs, ProbeConfig(device="cpu", pooling="cls+mean",
                                                        layers=2, whiten=True))  # fmt: skip
