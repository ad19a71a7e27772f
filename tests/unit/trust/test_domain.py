"""The applicability domain: nearest-neighbour similarities against brute force, the bounds,
the fine-tuned folder's reference file, and predict's columns."""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from smiexlm.errors import ConfigError, DataError
from smiexlm.trust.domain import DomainBounds, cosine_neighbours, tanimoto_neighbours

LIBRARY = ["CCO", "CCN", "c1ccccc1O", "c1ccncc1C", "CC(=O)Nc1ccc(O)cc1", "CCCCCCCC",
           "C1CCNCC1", "O=C(O)c1ccccc1", "CN1CCN(C)CC1", "Clc1ccccc1Cl"]  # fmt: skip
QUERIES = ["CCCO", "c1ccccc1N", "CC(=O)Nc1ccccc1", "C1CCOCC1", "FC(F)(F)c1ccccc1", "CCO"]


def _rdkit_tanimoto(queries, library):
    from rdkit import Chem, DataStructs
    from rdkit.Chem import rdFingerprintGenerator

    generator = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)
    lib = [generator.GetFingerprint(Chem.MolFromSmiles(s)) for s in library]
    return np.array(
        [DataStructs.BulkTanimotoSimilarity(generator.GetFingerprint(Chem.MolFromSmiles(q)), lib)
         for q in queries]
    )  # fmt: skip


@pytest.mark.parametrize("k", [1, 3, 10, 50])
def test_tanimoto_neighbours_equal_rdkit_brute_force(k, monkeypatch):
    import smiexlm.trust.domain as domain
    from smiexlm.chemistry.fingerprints import ecfp4_packed

    monkeypatch.setattr(domain, "QUERY_BLOCK", 4)  # several blocks of queries
    nearest, mean = tanimoto_neighbours(ecfp4_packed(QUERIES), ecfp4_packed(LIBRARY), k)
    full = _rdkit_tanimoto(QUERIES, LIBRARY)
    top = -np.sort(-full, axis=1)[:, : min(k, len(LIBRARY))]
    np.testing.assert_allclose(nearest, full.max(axis=1), rtol=1e-6)
    np.testing.assert_allclose(mean, top.mean(axis=1), rtol=1e-6)
    assert nearest[-1] == 1.0  # CCO is in the library


def test_cosine_neighbours_equal_a_loop():
    rng = np.random.default_rng(0)
    library, queries = rng.normal(size=(40, 8)), rng.normal(size=(7, 8))
    nearest, mean = cosine_neighbours(queries, library, k=4)
    for q, query in enumerate(queries):
        sims = sorted(
            (float(query @ row / np.linalg.norm(query) / np.linalg.norm(row)) for row in library),
            reverse=True,
        )
        assert nearest[q] == pytest.approx(sims[0], rel=1e-5)
        assert mean[q] == pytest.approx(np.mean(sims[:4]), rel=1e-5)


def test_cosine_neighbours_do_not_depend_on_the_queries_beside_a_molecule(monkeypatch):
    """Each molecule's figures alone, in a batch of 257 and in blocks of 5 are the same bits,
    and none is above 1."""
    import smiexlm.trust.domain as domain

    rng = np.random.default_rng(1)
    library = rng.normal(size=(300, 1152)).astype(np.float32)
    queries = np.concatenate([library[:4], rng.normal(size=(253, 1152)).astype(np.float32)])
    together = cosine_neighbours(queries, library, k=5)
    alone = [cosine_neighbours(q[None], library, k=5) for q in queries]
    monkeypatch.setattr(domain, "QUERY_BLOCK", 5)
    blocks = cosine_neighbours(queries, library, k=5)
    for i in range(2):
        np.testing.assert_array_equal(together[i], np.array([a[i][0] for a in alone]))
        np.testing.assert_array_equal(together[i], blocks[i])
    assert together[0][:4] == pytest.approx(1.0, abs=1e-6) and (together[0] <= 1.0).all()


def test_unparsable_and_empty_cases():
    from smiexlm.chemistry.fingerprints import ecfp4_packed

    nearest, _ = tanimoto_neighbours(ecfp4_packed(["not a smiles"]), ecfp4_packed(LIBRARY))
    assert nearest.tolist() == [0.0]
    nearest, mean = tanimoto_neighbours(ecfp4_packed(["CCO"]), ecfp4_packed([]))
    assert np.isnan(nearest).all() and np.isnan(mean).all()
    assert tanimoto_neighbours(ecfp4_packed([]), ecfp4_packed(LIBRARY))[0].shape == (0,)
    with pytest.raises(ConfigError, match="k"):
        cosine_neighbours(np.ones((1, 2)), np.ones((3, 2)), k=0)


def test_bounds_at_quantile_zero_are_the_lowest_validation_similarity():
    bounds = DomainBounds.of(np.array([0.5, 0.3, np.nan]), np.array([0.9, 0.8, 0.7]), 0.0)
    assert (bounds.tanimoto, bounds.cosine) == (0.3, pytest.approx(0.7))
    inside = bounds.inside(np.array([0.3, 0.29, 0.9]), np.array([0.7, 0.9, 0.69]))
    assert inside.tolist() == [True, False, False]
    assert bounds.inside(np.array([0.4]), None).tolist() == [True]  # cosine does not decide
    none = DomainBounds.of(np.array([]), np.array([]))
    assert none.inside(np.array([0.0]), np.array([0.0])).tolist() == [True]


def test_a_quantile_bound_leaves_that_share_of_the_validation_molecules_outside():
    rng = np.random.default_rng(0)
    tanimoto, cosine = rng.random(200), rng.random(200)
    for q in (0.0, 0.05, 0.25):
        bounds = DomainBounds.of(tanimoto, cosine, q)
        assert bounds.tanimoto == pytest.approx(np.quantile(tanimoto, q))
        outside = ~bounds.inside(tanimoto, None)
        assert outside.mean() == pytest.approx(q, abs=1 / 200)  # of the validation molecules
    assert DomainBounds.of(tanimoto, cosine, 0.0).tanimoto == tanimoto.min()
    for q in (-0.1, 0.6, True, "0.1", float("nan")):
        with pytest.raises(ConfigError, match="--domain-quantile"):
            DomainBounds.of(tanimoto, cosine, q)


def test_predict_and_its_command_share_the_default_quantile():
    import inspect

    from smiexlm.cli.predict import predict as command
    from smiexlm.serving.prediction import predict
    from smiexlm.trust.domain import DEFAULT_QUANTILE

    for function in (command, predict):
        assert inspect.signature(function).parameters["domain_quantile"].default == DEFAULT_QUANTILE
    assert DomainBounds.of(np.arange(100.0), np.arange(100.0)).tanimoto == pytest.approx(4.95)


def _finetuned(tmp_path):
    from smiexlm.cli.main import app
    from tests.unit.finetuning.test_moleculenet_finetune import _small_csv

    train, frame = _small_csv(tmp_path)
    models = tmp_path / "models"
    result = CliRunner().invoke(app, [
        "finetune", "mini", "--data", str(train), "--smiles-col", "smi", "--label-cols", "y",
        "--split", "random", "--max-train-steps", "1", "--batch-size", "8", "--epochs", "1",
        "--device", "cpu", "--random-init", "--seeds", "0", "--save-dir", str(models),
        "--out", str(tmp_path / "ft"), "--forest", "none",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return models / "seed0", frame, tmp_path / "ft" / "runs" / "mini" / "seed0"


def test_reference_and_predict_columns_match_brute_force(tmp_path, caplog):
    from smiexlm.modelio.layout import REFERENCE_NAME
    from smiexlm.modelio.pretrained import load_finetuned
    from smiexlm.moleculenet.splits import make_split
    from smiexlm.serving.prediction import predict
    from smiexlm.trust.reference import Reference

    folder, frame, run = _finetuned(tmp_path)
    ref = Reference.load(folder)
    split = make_split(frame["smi"].tolist(), "random", 0)
    assert ref.train_embedding.shape[0] == len(split.train) == len(ref.train_ecfp4)
    assert np.array_equal(ref.valid_labels[:, 0], frame["y"].to_numpy()[split.valid])
    np.testing.assert_allclose(ref.valid_scores, 1 / (1 + np.exp(-ref.valid_logits)), rtol=1e-5)
    kept = np.load(run / "predictions.npz")
    np.testing.assert_array_equal(kept["valid_tanimoto"], ref.valid_tanimoto)

    queries = ["CCO", "c1ccccc1CCCC", "FC(F)(F)C(F)(F)F", "xx"]
    got = predict(folder, queries)
    assert got.columns[-5:].tolist() == ["nearest_tanimoto", "mean_tanimoto_k5",
                                         "nearest_cosine", "mean_cosine_k5", "in_domain"]  # fmt: skip
    train = [frame["smi"][i] for i in split.train]
    full = _rdkit_tanimoto(queries[:3], train)
    np.testing.assert_allclose(got["nearest_tanimoto"][:3], full.max(axis=1), rtol=1e-6)
    model, inputs, _ = load_finetuned(folder, device="cpu")
    from smiexlm.finetuning import Examples
    from smiexlm.finetuning import predict as engine_predict

    rows, _ = inputs.rows(inputs.texts(queries[:3], True), 256)
    pooled = engine_predict(model, Examples(rows, None, None), output="pooled")
    unit = ref.train_embedding
    brute = (pooled / np.linalg.norm(pooled, axis=1, keepdims=True)) @ unit.T
    np.testing.assert_allclose(got["nearest_cosine"][:3], brute.max(axis=1), rtol=1e-4)
    assert got["nearest_tanimoto"][2] < ref.bounds().tanimoto and not got["in_domain"][2]
    assert not got["in_domain"][3] and np.isnan(got["nearest_tanimoto"][3])
    for q in (0.0, 0.05, 0.5):  # bounds at the lowest, the default and the median
        bounds, kept = ref.bounds(q), predict(folder, queries, domain_quantile=q)
        expected = ((kept["nearest_tanimoto"] >= bounds.tanimoto)
                    & (kept["nearest_cosine"] >= bounds.cosine))  # fmt: skip
        assert kept["in_domain"].tolist() == expected.tolist()
        assert bounds.tanimoto == pytest.approx(np.quantile(ref.valid_tanimoto, q))
    assert predict(folder, queries)["in_domain"].tolist() == got["in_domain"].tolist()

    # a folder from before the reference existed: predictions, no domain columns, one warning
    (folder / REFERENCE_NAME).unlink()
    sums = json.loads((folder / "checksums.json").read_text())
    del sums["sha256"][REFERENCE_NAME]
    (folder / "checksums.json").write_text(json.dumps(sums))
    with caplog.at_level(logging.WARNING):
        old = predict(folder, queries)
        predict(folder, queries)
    assert "nearest_tanimoto" not in old.columns
    np.testing.assert_allclose(old["y"], got["y"], rtol=1e-6)
    assert sum("no reference.safetensors" in r.message for r in caplog.records) == 1


def test_a_damaged_reference_is_refused(tmp_path):
    from smiexlm.modelio.layout import REFERENCE_NAME
    from smiexlm.serving.prediction import predict

    folder, _, _ = _finetuned(tmp_path)
    data = bytearray((folder / REFERENCE_NAME).read_bytes())
    data[-3] ^= 0xFF
    (folder / REFERENCE_NAME).write_bytes(bytes(data))
    with pytest.raises(DataError, match=REFERENCE_NAME):
        predict(folder, ["CCO"])


def test_predict_output_keeps_domain_columns_for_bad_rows(tmp_path):
    from smiexlm.serving.prediction import predict

    folder, _, _ = _finetuned(tmp_path)
    got = predict(folder, ["", "xx"])
    assert got["valid"].tolist() == [False, False]
    assert isinstance(got, pd.DataFrame) and got["in_domain"].tolist() == [False, False]
