"""``finetune --forest``: a random forest kept beside a fine-tuned model and served blended
(smiexlm.forests.forest). One small fine-tuning (two steps of the shipped model, 20
trees) is shared by the tests that read its folder; those that change a folder copy it."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from smiexlm.errors import ConfigError, DataError

SMILES = [f"{head}{'C' * n}{tail}" for n in range(1, 11)
          for head, tail in (("C", "O"), ("c1ccccc1", ""), ("C", "N"), ("c1ccncc1", "O"),
                             ("CC(C)", "Cl"), ("c1ccoc1", "C"))]  # fmt: skip
LABELS = [int("c1" in s) ^ (len(s) % 3 == 0) for s in SMILES]


def _finetune(root, *extra):
    from smiexlm.cli.main import app

    torch.set_num_threads(1)
    path = root / "mini.csv"
    if not path.exists():
        pd.DataFrame({"smi": SMILES, "y": LABELS}).to_csv(path, index=False)
    out = root / f"out{len(list(root.glob('out*')))}"
    args = ["finetune", "mini", "--data", str(path), "--smiles-col", "smi", "--label-cols", "y",
            "--split", "random", "--max-train-steps", "2", "--batch-size", "8", "--epochs", "1",
            "--device", "cpu", "--seeds", "0", "--out", str(out), *extra]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(out / "results.csv")
    return rows, np.load(out / "runs" / "mini" / "seed0" / "predictions.npz")


@pytest.fixture(scope="module")
def blended(tmp_path_factory):
    """(results row, kept predictions, fine-tuned folder) of a run with an RDKit 2D forest."""
    root = tmp_path_factory.mktemp("forest")
    rows, kept = _finetune(root, "--forest", "rdkit2d", "--forest-trees", "20", "--save-dir",
                           str(root / "models"))  # fmt: skip
    return rows.iloc[0], kept, root / "models" / "seed0"


def test_the_run_reports_the_blend_with_the_model_and_the_forest_beside_it(blended):
    from smiexlm.forests.blend import blend
    from smiexlm.moleculenet.metrics import score

    row, kept, _ = blended
    config = json.loads(row["config"])
    assert row["model"] == "default_model + RF-rdkit2d"
    assert (config["forest"], config["forest_trees"], config["forest_blend"]) == (
        "rdkit2d",
        20,
        "quantile",
    )
    y = np.asarray(LABELS, dtype=float)[:, None]
    expected = blend("classification", kept["valid_model"], kept["test_model"],
                     kept["valid_forest"], kept["test_forest"])  # fmt: skip
    np.testing.assert_allclose(kept["test"], expected, rtol=1e-6)
    test_rows = kept["test_rows"]
    assert row["test"] == pytest.approx(
        score("classification", y[test_rows], kept["test"]).mean * 100
    )
    for who in ("model", "forest"):
        alone = score("classification", y[test_rows], kept[f"test_{who}"]).mean * 100
        assert config[f"test_{who}"] == pytest.approx(alone)


def test_the_forest_is_the_baseline_forest_of_the_same_split_and_seed(blended, tmp_path):
    """Fitted on the training molecules' model-side SMILES, it scores as the RF-RDKit2D
    baseline row does on the same split and seed (descriptors do not depend on the writing)."""
    from smiexlm.forests.baseline import BaselineConfig, run_baseline
    from smiexlm.moleculenet.task import MoleculeTask

    _, kept, _ = blended
    task = MoleculeTask("mini", SMILES, np.asarray(LABELS, float)[:, None], ["y"], "classification")
    run_baseline(
        task, [0], BaselineConfig("rdkit2d", n_trees=20, split="random"), run_root=tmp_path
    )
    baseline = np.load(tmp_path / "mini" / "seed0" / "predictions.npz")
    np.testing.assert_array_equal(baseline["test_rows"], kept["test_rows"])
    np.testing.assert_allclose(kept["test_forest"], baseline["test"], rtol=1e-6)
    np.testing.assert_allclose(kept["valid_forest"], baseline["valid"], rtol=1e-6)


def test_the_forest_leaves_the_model_as_it_is(blended, tmp_path):
    _, kept, _ = blended
    rows, alone = _finetune(tmp_path, "--forest", "none")
    assert rows["model"][0] == "default_model"
    assert "valid_model" not in alone and json.loads(rows["config"][0])["forest"] is None
    np.testing.assert_array_equal(alone["test"], kept["test_model"])
    np.testing.assert_array_equal(alone["valid"], kept["valid_model"])


def test_predict_serves_the_scores_fine_tuning_reported(blended):
    from smiexlm.serving.prediction import predict

    _, kept, folder = blended
    smiles = [SMILES[i] for i in kept["test_rows"]] + ["not a smiles"]
    frame = predict(folder, smiles)
    assert [c for c in frame.columns if c.startswith("y")] == ["y", "y_model", "y_forest"]
    for column, key in (("y", "test"), ("y_model", "test_model"), ("y_forest", "test_forest")):
        np.testing.assert_allclose(frame[column][:-1], kept[key][:, 0], rtol=1e-5, atol=1e-6)
    assert not frame["valid"].iloc[-1] and frame.iloc[-1][["y", "y_model", "y_forest"]].isna().all()
    with_sets = predict(folder, smiles[:3], conformal_alpha=0.2, calibrate=True)
    assert set(with_sets["y_set"]) <= {"{0}", "{1}", "{0,1}", "{}"}
    np.testing.assert_array_equal(with_sets["y_forest"], frame["y_forest"][:3])


def test_an_ensemble_blends_each_folder_and_refuses_a_mixed_one(blended, tmp_path):
    from smiexlm.serving.prediction import predict

    _, _, folder = blended
    twin = tmp_path / "twin"
    shutil.copytree(folder, twin)
    smiles = ["CCO", "c1ccccc1CCO"]
    one, both = predict(folder, smiles), predict([folder, twin], smiles)
    np.testing.assert_allclose(both["y"], one["y"], rtol=1e-6)
    assert (both["y_std"] == 0).all()
    plain = tmp_path / "plain"
    shutil.copytree(folder, plain)
    meta = json.loads((plain / "finetune.json").read_text())
    del meta["forest"]
    (plain / "finetune.json").write_text(json.dumps(meta))
    _rechecksum(plain, "finetune.json")
    assert "y_forest" not in predict(plain, smiles)  # a folder without a forest, as before
    with pytest.raises(DataError, match="blended alike"):
        predict([folder, plain], smiles)


def test_a_forest_file_loads_without_pickle(blended, monkeypatch):
    import pickle

    from smiexlm.forests.forest import KeptForest

    _, kept, folder = blended

    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    meta = json.loads((folder / "finetune.json").read_text())
    forest = KeptForest.load(folder, meta)
    np.testing.assert_array_equal(forest.valid_scores, kept["valid_forest"])
    assert len(forest.forests) == 1 and len(forest.forests[0].estimators_) == 20


def test_a_damaged_or_foreign_forest_file_is_refused(blended, tmp_path):
    import collections

    import skops.io

    from smiexlm.forests.forest import KeptForest
    from smiexlm.serving.prediction import predict

    _, _, folder = blended
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    path = copy / "forest.skops"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="sha256"):
        predict(copy, ["CCO"])
    skops.io.dump({"format": "smiexlm-forest/1", "forests": [collections.Counter(a=1)],
                   "valid_scores": np.zeros((6, 1), np.float32)}, path)  # fmt: skip
    _rechecksum(copy, "forest.skops")
    meta = json.loads((copy / "finetune.json").read_text())
    with pytest.raises(DataError, match="collections.Counter"):
        KeptForest.load(copy, meta)
    meta["forest"]["blend"] = "median"
    with pytest.raises(DataError, match="'blend' is 'median'"):
        KeptForest.load(copy, meta)


def test_forest_settings_are_checked():
    from smiexlm.finetuning.config import finetune_config

    assert finetune_config("bace", forest="both").forest_trees == 500
    for key, value in (("forest", "maccs"), ("forest_trees", 0), ("forest_blend", "median"),
                       ("forest_weight", 1.5), ("forest_weight", True)):  # fmt: skip
        with pytest.raises(ConfigError, match=key):
            finetune_config("bace", **{key: value})


def _rechecksum(folder, name):
    from smiexlm.modelio.integrity import record_checksums

    record_checksums(folder, name)


def test_the_default_forest_follows_the_task_type_and_the_tree_budget():
    import dataclasses

    from smiexlm.finetuning.config import (
        AUTO_FOREST,
        AUTO_KERNELS,
        FOREST_TREE_BUDGET,
        MIN_FOREST_TREES,
        finetune_config,
        resolve_forest,
    )

    shipped = finetune_config("bbbp")
    assert shipped.forest == "auto" and finetune_config("bbbp", forest="none").forest is None
    assert resolve_forest(shipped, "classification", 1).forest == "rdkit2d"
    assert resolve_forest(shipped, "regression", 1).forest == AUTO_FOREST["regression"]
    assert resolve_forest(shipped, "classification", 12).forest_trees == 500  # Tox21
    toxcast = resolve_forest(shipped, "classification", 617)
    assert toxcast.forest_trees == FOREST_TREE_BUDGET // 617 == 162
    assert resolve_forest(shipped, "classification", 10**6).forest_trees == MIN_FOREST_TREES
    assert resolve_forest(shipped, "regression", 1).kernels == AUTO_KERNELS["regression"]
    assert resolve_forest(shipped, "classification", 1).kernels == "none"
    mine = dataclasses.replace(shipped, forest="ecfp4", forest_trees=20, kernels="tanimoto")
    assert resolve_forest(mine, "regression", 1) == mine  # named members are kept as named
    assert (
        resolve_forest(finetune_config("bbbp", forest="none"), "classification", 1).forest is None
    )
