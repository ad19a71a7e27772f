"""``finetune --ensemble wide``: networks and forests of one split and seed kept in one folder
and served blended (smiexlm.finetuning.ensemble). One small wide run (two steps of the shipped
model, 20 trees a forest) is shared by the tests that read it; each member is held to the run
that makes it alone."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from smiexlm.errors import ConfigError, DataError
from tests.unit.forests.test_forest import LABELS, SMILES, _rechecksum

MEMBERS = ["model", "model_rdkit2d", "rf_rdkit2d", "rf_both", "rf_ecfp4"]


def _run(root, name, *extra, expect=0):
    from smiexlm.cli.main import app

    torch.set_num_threads(1)
    path = root / "mini.csv"
    if not path.exists():
        pd.DataFrame({"smi": SMILES, "y": LABELS}).to_csv(path, index=False)
    args = ["finetune", "mini", "--data", str(path), "--smiles-col", "smi", "--label-cols", "y",
            "--split", "random", "--max-train-steps", "2", "--batch-size", "8", "--epochs", "1",
            "--device", "cpu", "--seeds", "0", "--forest-trees", "20", "--out", str(root / name),
            *extra]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == expect, result.output
    return result


def _kept(root, name):
    return np.load(root / name / "runs" / "mini" / "seed0" / "predictions.npz")


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """(the run's folder, results row, kept predictions, the ensemble's seed folder)."""
    root = tmp_path_factory.mktemp("wide")
    _run(root, "wide", "--ensemble", "wide", "--save-dir", str(root / "models"))
    row = pd.read_csv(root / "wide" / "results.csv").iloc[0]
    return root, row, _kept(root, "wide"), root / "models" / "seed0"


def test_blend_members_of_two_is_the_forest_blend_and_of_several_their_mean_quantile():
    from smiexlm.forests.blend import blend, blend_members, quantiles

    rng = np.random.default_rng(0)
    valids = [rng.random((9, 2)) for _ in range(3)]
    scores = [rng.random((5, 2)) for _ in range(3)]
    two = blend("classification", valids[0], scores[0], valids[1], scores[1], 0.3)
    np.testing.assert_array_equal(
        two, blend_members("classification", valids[:2], scores[:2], [0.3, 0.7])
    )
    # by hand: a score's mid-rank among its own member's validation scores, then the mean
    by_hand = np.zeros((5, 2))
    for v, s in zip(valids, scores, strict=True):
        for j in range(2):
            for i in range(5):
                by_hand[i, j] += ((v[:, j] < s[i, j]).sum() + (v[:, j] <= s[i, j]).sum()) / 18 / 3
    np.testing.assert_allclose(blend_members("classification", valids, scores), by_hand)
    np.testing.assert_allclose(
        blend_members("classification", valids, scores),
        np.mean([quantiles(v, s) for v, s in zip(valids, scores, strict=True)], axis=0),
    )
    np.testing.assert_allclose(blend_members("regression", valids, scores), np.mean(scores, axis=0))
    with pytest.raises(ConfigError, match="weights"):
        blend_members("classification", valids, scores, [0.5, 0.5, 0.5])


def test_the_run_reports_the_members_blend_and_each_member(wide):
    from smiexlm.forests.blend import blend_members
    from smiexlm.moleculenet.metrics import score

    _, row, kept, _ = wide
    config = json.loads(row["config"])
    assert row["model"] == "default_model, wide ensemble"
    assert config["ensemble"] == "wide" and config["forest"] is None
    assert sorted(config["members"]) == sorted(MEMBERS)
    valids = [kept[f"valid_{m}"] for m in MEMBERS]
    expected = blend_members("classification", valids, [kept[f"test_{m}"] for m in MEMBERS])
    np.testing.assert_allclose(kept["test"], expected, rtol=1e-6)
    y = np.asarray(LABELS, dtype=float)[:, None]
    assert row["test"] == pytest.approx(score("classification", y[kept["test_rows"]], kept["test"]).mean * 100)  # fmt: skip
    for m in MEMBERS:
        alone = score("classification", y[kept["test_rows"]], kept[f"test_{m}"]).mean * 100
        assert config["members"][m]["test"] == pytest.approx(alone)
        assert config["members"][m]["cpu_seconds"] > 0
    assert config["train_cpu_seconds"] == pytest.approx(sum(config["members"][m]["cpu_seconds"] for m in MEMBERS))  # fmt: skip


def test_each_network_member_is_the_run_of_its_own_config(wide):
    """The model alone is ``--forest none``'s run, the other ``--features rdkit2d``'s, to
    the bit; the forests are the baseline forests of the same split and seed."""
    from smiexlm.forests.baseline import BaselineConfig, run_baseline
    from smiexlm.moleculenet.task import MoleculeTask

    root, _, kept, _ = wide
    _run(root, "alone", "--forest", "none")
    _run(root, "hybrid", "--forest", "none", "--features", "rdkit2d")
    for name, member in (("alone", "model"), ("hybrid", "model_rdkit2d")):
        own = _kept(root, name)
        np.testing.assert_array_equal(own["test"], kept[f"test_{member}"])
        np.testing.assert_array_equal(own["test_rows"], kept["test_rows"])
    task = MoleculeTask("mini", SMILES, np.asarray(LABELS, float)[:, None], ["y"], "classification")
    for kind in ("rdkit2d", "both", "ecfp4"):
        cfg = BaselineConfig(kind, n_trees=20, split="random")
        run_baseline(task, [0], cfg, run_root=root / f"rf_{kind}")
        forest = np.load(root / f"rf_{kind}" / "mini" / "seed0" / "predictions.npz")
        np.testing.assert_allclose(kept[f"test_rf_{kind}"], forest["test"], rtol=1e-6)
        np.testing.assert_allclose(kept[f"valid_rf_{kind}"], forest["valid"], rtol=1e-6)


def test_predict_serves_the_blend_fine_tuning_reported_with_each_member(wide):
    from smiexlm.forests.blend import quantiles
    from smiexlm.serving.prediction import predict

    root, _, kept, folder = wide
    smiles = [SMILES[i] for i in kept["test_rows"]] + ["not a smiles"]
    frame = predict(root / "models", smiles, conformal_alpha=0.2)  # the save-dir: its seed
    columns = [c for c in frame.columns if c.startswith("y")]
    assert columns == ["y", *(f"y_{m}" for m in MEMBERS), "y_members_std", "y_set", "y_difficulty"]
    np.testing.assert_allclose(frame["y"][:-1], kept["test"][:, 0], rtol=1e-5, atol=1e-6)
    for m in MEMBERS:
        np.testing.assert_allclose(frame[f"y_{m}"][:-1], kept[f"test_{m}"][:, 0], rtol=1e-5, atol=1e-6)  # fmt: skip
    spread = np.std([quantiles(kept[f"valid_{m}"], kept[f"test_{m}"]) for m in MEMBERS], axis=0)
    np.testing.assert_allclose(frame["y_members_std"][:-1], spread[:, 0], rtol=1e-5, atol=1e-6)
    numbers = [c for c in columns if c != "y_set"]
    assert not frame["valid"].iloc[-1] and frame.iloc[-1][numbers].isna().all()
    assert set(frame["y_set"][:-1]) <= {"{0}", "{1}", "{0,1}", "{}"}
    hard = np.std([kept[f"test_{m}"][:, 0] for m in MEMBERS], axis=0) + 0.01  # raw scores
    np.testing.assert_allclose(frame["y_difficulty"][:-1], hard, rtol=1e-5, atol=1e-6)
    assert {"nearest_tanimoto", "in_domain"} <= set(frame.columns)
    from smiexlm.trust.columns import label_columns

    assert label_columns(frame.columns) == ["y"]  # select reads the blend, not a member


def test_a_stopped_ensemble_goes_on_from_its_finished_members(wide, tmp_path):
    """The wide run's own record gone (stopped after its members finished): --resume reads
    the members back, trains nothing again and blends the same."""
    root, _, kept, _ = wide
    run = tmp_path / "wide"
    shutil.copytree(root / "wide", run)
    cell = run / "runs" / "mini" / "seed0"
    (cell / "result.json").unlink()
    (cell / "predictions.npz").unlink()
    stamps = {m: (cell / m / "result.json").stat().st_mtime_ns for m in ("model", "model_rdkit2d")}
    result = _run(tmp_path, "wide", "--ensemble", "wide", "--resume")
    assert "step/s" not in result.output  # no fine-tuning step ran
    assert stamps == {m: (cell / m / "result.json").stat().st_mtime_ns for m in stamps}
    np.testing.assert_array_equal(np.load(cell / "predictions.npz")["test"], kept["test"])


def test_an_ensemble_folder_is_checked_and_blended_alike_or_refused(wide, tmp_path):
    from smiexlm.serving.prediction import predict

    root, _, _, folder = wide
    twin = tmp_path / "twin"
    shutil.copytree(folder, twin)
    assert (predict([folder, twin], ["CCO"])["y_std"] == 0).all()
    with pytest.raises(DataError, match="blended alike"):
        predict([folder, folder / "model"], ["CCO"])
    meta = json.loads((twin / "ensemble.json").read_text())
    (twin / "ensemble.json").write_text(json.dumps(meta | {"blend": "mean"}))
    with pytest.raises(DataError, match="ensemble.json"):  # the checksum
        predict(twin, ["CCO"])
    meta["members"][0]["folder"] = "../model"
    (twin / "ensemble.json").write_text(json.dumps(meta))
    _rechecksum(twin, "ensemble.json")
    with pytest.raises(DataError, match="member 'model' names the folder '../model'"):
        predict(twin, ["CCO"])


def test_wide_settings_are_checked(tmp_path):
    from smiexlm.finetuning.config import FinetuneConfig

    with pytest.raises(ConfigError, match="ensemble"):
        FinetuneConfig(ensemble="widest")
    with pytest.raises(ConfigError, match="features"):
        FinetuneConfig(ensemble="wide", features="rdkit2d")
    result = _run(tmp_path, "x", "--ensemble", "wide", "--processes", "2", expect=1)
    assert isinstance(result.exception, ConfigError) and "one process" in str(result.exception)
    assert not (tmp_path / "x").exists()  # refused before anything ran


def test_export_onnx_of_an_ensemble_exports_each_network(wide, tmp_path, monkeypatch):
    """``export-onnx`` on an ensemble's folder writes each network member's graph (the graphs
    themselves and ``--backend onnx`` are tested on fine-tuned folders in test_onnx.py)."""
    from smiexlm.cli.main import app
    from smiexlm.embedding import onnx_export

    _, _, _, folder = wide
    written = []
    monkeypatch.setattr(onnx_export, "export_onnx", lambda f, kind=None: written.append(f) or f)
    result = CliRunner().invoke(app, ["export-onnx", str(folder)])
    assert result.exit_code == 0, result.output
    assert written == [folder / "model", folder / "model_rdkit2d"]


def test_a_finished_run_read_back_keeps_the_seconds_it_recorded(wide):
    """Resuming a finished run reports it with its own wall time, not the moment of reading."""
    root, _, _, _ = wide
    cell = root / "alone" / "runs" / "mini" / "seed0" / "result.json"
    if not cell.is_file():
        _run(root, "alone", "--forest", "none")
    recorded = json.loads(cell.read_text())["result"]["wall_s"]
    _run(root, "alone", "--forest", "none", "--resume")
    assert json.loads(cell.read_text())["result"]["wall_s"] == recorded
    assert pd.read_csv(root / "alone" / "results.csv")["wall_s"][0] == pytest.approx(recorded)
