"""Fine-tuning: masked loss by hand, schedule, and the real CLI end to end on BBBP."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner


def test_multilabel_loss_masks_missing_labels_by_hand():
    from smiexlm.model.heads import task_loss

    logits = torch.tensor([[0.0, 2.0], [1.0, -1.0]])
    labels = torch.tensor([[1.0, float("nan")], [0.0, 1.0]])
    # present entries: (0,0) y=1 z=0; (1,0) y=0 z=1; (1,1) y=1 z=-1
    by_hand = (math.log(2) + math.log(1 + math.e) + math.log(1 + math.e)) / 3
    assert task_loss(logits, labels, "multilabel").item() == pytest.approx(by_hand, rel=1e-6)


def test_balanced_class_weights_are_scikit_learns_per_task():
    from sklearn.utils.class_weight import compute_class_weight

    from smiexlm.model.heads import balanced_class_weights

    nan = float("nan")
    labels = np.array([[1, 0, 1, nan], [0, 0, 1, nan], [0, 0, nan, 1], [0, 1, 1, nan],
                       [nan, 0, 1, 0]])  # fmt: skip
    weights = balanced_class_weights(labels)
    for t in (0, 1, 3):
        y = labels[~np.isnan(labels[:, t]), t]
        expected = compute_class_weight("balanced", classes=np.array([0.0, 1.0]), y=y)
        np.testing.assert_allclose(weights[:, t], expected, rtol=1e-12)
    assert weights[:, 2].tolist() == [1.0, 1.0]  # one class only: unweighted


def test_weighted_multilabel_loss_is_torchs_weighted_bce_over_the_present_labels():
    from smiexlm.model.heads import task_loss

    torch.manual_seed(0)
    logits = torch.randn(6, 3, dtype=torch.float64)
    labels = torch.tensor([[1, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 1], [0, 1, 0]],
                          dtype=torch.float64)  # fmt: skip
    labels[2, 0] = labels[4, 1] = float("nan")
    weights = torch.tensor([[0.6, 0.75, 0.8], [3.0, 1.5, 1.25]], dtype=torch.float64)
    present = ~labels.isnan()
    target = labels.nan_to_num(0.0)
    per_entry = torch.where(target > 0.5, weights[1], weights[0])  # each entry's class's weight
    expected = (
        torch.nn.functional.binary_cross_entropy_with_logits(
            logits[present], target[present], weight=per_entry[present], reduction="sum"
        )
        / present.sum()
    )
    got = task_loss(logits, labels, "multilabel", class_weights=weights)
    assert got.item() == pytest.approx(expected.item(), rel=1e-12)
    ones = task_loss(logits, labels, "multilabel", class_weights=torch.ones(2, 3))
    assert ones.item() == pytest.approx(task_loss(logits, labels, "multilabel").item(), rel=1e-12)


def test_rare_positives_are_warned_of_unless_the_classes_are_weighted(caplog):
    from smiexlm.finetuning.adapter import warn_rare_positives
    from smiexlm.finetuning.config import FinetuneConfig
    from smiexlm.moleculenet.task import MoleculeTask

    labels = np.zeros((300, 2))
    labels[:2, 0] = 1.0  # 2 positives of 599 present labels: 0.33 %
    labels[5, 1] = np.nan
    task = MoleculeTask("rare", ["C"] * 300, labels, ["a", "b"])
    with caplog.at_level("WARNING", logger="smiexlm.finetuning.adapter"):
        share = warn_rare_positives(task, FinetuneConfig())
    assert share == pytest.approx(2 / 599)
    assert "rare: 0.33 % of its labels are positive" in caplog.text
    assert "--class-weight balanced" in caplog.text
    assert warn_rare_positives(task, FinetuneConfig(class_weight="balanced")) is None
    labels[:6, 0] = 1.0  # 6 of 599: 1.0 %, no longer rare
    assert warn_rare_positives(MoleculeTask("x", ["C"] * 300, labels, ["a", "b"]),
                               FinetuneConfig()) is None  # fmt: skip
    values = MoleculeTask("y", ["C"] * 3, np.zeros((3, 1)), ["v"], task_type="regression")
    assert warn_rare_positives(values, FinetuneConfig()) is None


def test_cli_class_weight_balanced_is_named_recorded_and_refused_for_regression(tmp_path):
    from smiexlm.errors import DataError
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.config import FinetuneConfig
    from smiexlm.moleculenet import runs
    from smiexlm.moleculenet.loaders import read_task
    from smiexlm.moleculenet.splits import make_split

    torch.set_num_threads(1)
    _finetune(tmp_path, "--seeds", "0")
    rows = _finetune(tmp_path, "--seeds", "0", "--class-weight", "balanced")
    assert rows["model"][0] == "default_model, classes balanced"
    doc = json.loads((tmp_path / "out1" / "runs" / "mini" / "seed0" / "history.json").read_text())
    (epoch,) = doc["history"]  # one epoch of two updates, with its validation score
    assert (epoch["epoch"], epoch["step"]) == (1, 2) and epoch["train_loss"] > 0
    assert epoch["valid"] * 100 == pytest.approx(rows["valid"][0])
    assert json.loads(rows["config"][0])["class_weight"] == "balanced"
    scores = [np.load(tmp_path / out / "runs" / "mini" / "seed0" / "predictions.npz")["test"]
              for out in ("out0", "out1")]  # fmt: skip
    assert not np.array_equal(*scores)  # two updates of another loss
    # a finished run made without class weights is not read back as a weighted one
    path, _ = _small_csv(tmp_path)
    again = _finetune_cli(path, tmp_path / "out0", "--seeds", "0", "--class-weight", "balanced",
                          "--resume")  # fmt: skip
    assert again.exit_code != 0 and "class_weight" in str(again.exception), again.output
    # nor a weighted one as unweighted, though an unweighted run's record leaves the key out
    back = _finetune_cli(path, tmp_path / "out1", "--seeds", "0", "--class-weight", "none",
                         "--resume")  # fmt: skip
    assert back.exit_code != 0, back.output
    assert "class_weight = 'balanced', but this run asks for class_weight = 'none'" in str(
        back.exception)  # fmt: skip
    # the same check without reading the set (the table script's, before it skips a cell)
    weighted_run = tmp_path / "out1" / "runs" / "mini" / "seed0"
    done, backbone = runs.finished(weighted_run), Backbone()
    made = {key: value for key, value in done.config.items() if key in FinetuneConfig.flat_keys()}
    assert runs.check_settings(done, weighted_run, FinetuneConfig.from_flat(**made), backbone)
    unweighted = FinetuneConfig.from_flat(**made | {"class_weight": "none"})
    with pytest.raises(DataError, match="class_weight = 'balanced', but this run asks for"):
        runs.check_settings(done, weighted_run, unweighted, backbone)
    # a state kept before the setting existed holds no record of it, and goes on as before
    task = read_task(path, "smi", ["y"])
    split, backbone = make_split(task.smiles, "random"), Backbone()
    assert "class_weight" not in runs.identity(task, split, FinetuneConfig(), backbone)["finetune"]
    weighted = runs.identity(task, split, FinetuneConfig(class_weight="balanced"), backbone)
    assert weighted["finetune"]["class_weight"] == "balanced"
    bad = _finetune_cli(path, tmp_path / "reg", "--seeds", "0", "--task-type", "regression",
                        "--class-weight", "balanced")  # fmt: skip
    assert bad.exit_code != 0 and "regression" in str(bad.exception), bad.output
    typo = _finetune_cli(path, tmp_path / "typo", "--class-weight", "balance")
    assert typo.exit_code != 0 and "class_weight" in str(typo.exception), typo.output


@pytest.mark.slow
def test_cli_finetune_then_predict_on_bbbp(shared_data, tmp_path):
    from smiexlm.cli.main import app

    torch.set_num_threads(1)
    runner = CliRunner()
    out, models = tmp_path / "report", tmp_path / "models"
    result = runner.invoke(app, [
        "finetune", "bbbp", "--random-init", "--preset", "tiny", "--seeds", "0", "--max-train-steps", "3",
        "--batch-size", "16", "--device", "cpu", "--out", str(out), "--save-dir", str(models),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(out / "results.csv")
    assert len(rows) == 1 and rows["split"][0] == "scaffold" and rows["sizes"][0] == "1631/204/204"
    assert 0.0 <= rows["test"][0] <= 100.0 and json.loads(rows["config"][0])["steps"] == 3
    assert (out / "report.png").is_file() and "ExLM (paper)" in (out / "report.md").read_text()

    inputs = tmp_path / "x.csv"
    pd.DataFrame({"smiles": ["CCO", "not a smiles", "c1ccccc1O"]}).to_csv(inputs, index=False)
    preds_path = tmp_path / "preds.csv"
    result = runner.invoke(app, [
        "predict", "--checkpoint", str(models / "seed0"), "--input", str(inputs),
        "--output", str(preds_path),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    preds = pd.read_csv(preds_path)
    assert preds["valid"].tolist() == [True, False, True]
    assert preds["p_np"].isna().tolist() == [False, True, False]
    assert preds["p_np"].dropna().between(0, 1).all()


def test_cli_user_csv_single_class_test_is_a_clear_error(tmp_path):
    from smiexlm.cli.main import app
    from smiexlm.moleculenet import scaffold_split

    smiles = [f"C1{'C' * n}1{tail}" for n in range(2, 12) for tail in ("", "O")]
    train, valid, test = scaffold_split(smiles)
    labels = [0] * len(smiles)
    labels[train[0]] = 1  # both classes overall, a single class in test
    frame = pd.DataFrame({"S": smiles, "Y": labels})
    path = tmp_path / "my.csv"
    frame.to_csv(path, index=False)
    result = CliRunner().invoke(app, [
        "baseline", "--data", str(path), "--smiles-col", "S", "--label-cols", "Y",
        "--seeds", "0", "--n-trees", "5", "--out", str(tmp_path / "o"),
    ])  # fmt: skip
    assert result.exit_code != 0
    assert "single class" in str(result.exception) or "single class" in result.output


def test_predict_rejects_a_folder_that_is_not_fine_tuned(tmp_path):
    from smiexlm.errors import DataError
    from smiexlm.serving.prediction import predict

    with pytest.raises(DataError, match="finetune.json"):
        predict(tmp_path, ["CCO"])


def test_cli_seeds_accept_space_separated_values(shared_data, monkeypatch):
    import smiexlm.forests.baseline as baseline
    from smiexlm.cli.main import app

    seen = []

    def fake_run(df, seeds, cfg, **kept):
        seen.append(list(seeds))
        raise SystemExit(0)

    monkeypatch.setattr(baseline, "run_baseline", fake_run)
    runner = CliRunner()
    assert (
        runner.invoke(app, ["baseline", "--tasks", "bace", "--seeds", "0", "1", "2"]).exit_code == 0
    )
    assert (
        runner.invoke(
            app, ["baseline", "--tasks", "bace", "--seeds", "4", "--seeds", "5"]
        ).exit_code
        == 0
    )
    assert runner.invoke(app, ["baseline", "--tasks", "bace"]).exit_code == 0
    assert seen == [[0, 1, 2], [4, 5], [0, 1, 2]]
    assert runner.invoke(app, ["baseline", "--tasks", "bace", "--seeds", "0", "x"]).exit_code == 2


def _small_csv(tmp_path):
    """60 molecules; label 1 = aromatic ring. Random split seed 0 has both classes in test."""
    smiles = [f"{head}{'C' * n}{tail}" for n in range(1, 11)
              for head, tail in (("C", "O"), ("c1ccccc1", ""), ("C", "N"), ("c1ccncc1", "O"),
                                 ("CC(C)", "Cl"), ("c1ccoc1", "C"))]  # fmt: skip
    path = tmp_path / "mini.csv"
    frame = pd.DataFrame({"smi": smiles, "y": [int("c1" in s) for s in smiles]})
    frame["id"] = [f"m{i}" for i in range(len(frame))]
    frame.to_csv(path, index=False)
    return path, frame


def _finetune_cli(path, out, *extra, forest: str | None = "none"):
    """``smiexlm finetune`` on a CSV for two updates, in-process; the network alone unless
    ``forest`` (None: the command's default, a forest beside it)."""
    from smiexlm.cli.main import app

    args = ["finetune", "mini", "--data", str(path), "--smiles-col", "smi", "--label-cols", "y",
            "--split", "random", "--max-train-steps", "2", "--batch-size", "8", "--epochs", "1",
            "--device", "cpu", "--out", str(out), *extra]  # fmt: skip
    if forest is not None and "--forest" not in extra:
        args += ["--forest", forest]
    return CliRunner().invoke(app, args)


def _finetune(tmp_path, *extra, out=None, forest: str | None = "none"):
    path, _ = _small_csv(tmp_path)
    out = out or tmp_path / f"out{len(list(tmp_path.glob('out*')))}"  # a run folder of its own
    result = _finetune_cli(path, out, *extra, forest=forest)
    assert result.exit_code == 0, result.output
    return pd.read_csv(out / "results.csv")


def test_cli_finetune_defaults_to_the_shipped_model_and_random_init_is_explicit(tmp_path):
    torch.set_num_threads(1)
    rows = _finetune(tmp_path, "--seeds", "0", forest=None)  # served blended with a forest
    config = json.loads(rows["config"][0])
    assert (
        config["backbone"] == "default_model" and rows["model"][0] == "default_model + RF-rdkit2d"
    )
    assert config["forest"] == "rdkit2d" and config["forest_trees"] == 500
    assert {"valid_model", "test_model", "valid_forest", "test_forest"} <= set(config)
    assert config["n_unk_tokens"] == config["n_unk_molecules"] == 0
    assert config["steps"] == 2 and config["patience"] is None
    rows = _finetune(tmp_path, "--seeds", "0", "--random-init")
    assert json.loads(rows["config"][0])["backbone"].startswith("random-init tiny")


def test_a_finished_cell_knows_its_backbone_by_its_weights_not_only_its_name(tmp_path):
    import shutil

    from smiexlm.finetuning.state import StateMismatchError, check_identity
    from smiexlm.modelio.integrity import read_checksums
    from smiexlm.modelio.layout import DEFAULT_MODEL_DIR, WEIGHTS_NAME, shipped_models

    torch.set_num_threads(1)
    model = tmp_path / "first" / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, model)
    out = tmp_path / "cells"
    rows = _finetune(tmp_path, "--seeds", "0", "--checkpoint", str(model), out=out)
    sha = json.loads(rows["config"][0])["backbone_sha256"]
    assert sha == read_checksums(DEFAULT_MODEL_DIR)[WEIGHTS_NAME]
    other = tmp_path / "second" / "model"  # the same folder name, other weights
    shutil.copytree(shipped_models()["exlm"], other)
    path, _ = _small_csv(tmp_path)
    result = _finetune_cli(path, out, "--seeds", "0", "--checkpoint", str(other), "--resume")
    assert result.exit_code != 0 and "backbone_sha256" in str(result.exception), result.output
    saved, now = {"backbone": "model"}, {"backbone": "model", "backbone_sha256": sha}
    check_identity(tmp_path, saved, now)  # a state kept before the record resumes as it did
    with pytest.raises(StateMismatchError, match="backbone_sha256"):
        check_identity(tmp_path, now | {"backbone_sha256": "0" * 64}, now)


def test_tokens_outside_the_vocabulary_are_counted_and_said(tmp_path, caplog):
    path, frame = _small_csv(tmp_path)
    frame.loc[[0, 7], "smi"] = ["CC[Cf]CO", "[Lr]CC[Lr]"]  # elements the vocabulary lacks
    frame.to_csv(path, index=False)
    with caplog.at_level("WARNING", logger="smiexlm.finetuning.adapter"):
        result = _finetune_cli(path, tmp_path / "out", "--seeds", "0")
    assert result.exit_code == 0, result.output
    config = json.loads(pd.read_csv(tmp_path / "out" / "results.csv")["config"][0])
    assert (config["n_unk_tokens"], config["n_unk_molecules"]) == (3, 2)
    assert any("2 of 60 molecules hold 3 tokens" in r.getMessage() for r in caplog.records)


def test_cli_freeze_freeze_layers_features_patience(tmp_path):
    torch.set_num_threads(1)
    rows = _finetune(tmp_path, "--seeds", "0", "--freeze")
    assert rows["model"][0] == "default_model frozen" and json.loads(rows["config"][0])["freeze"]
    rows = _finetune(tmp_path, "--seeds", "0", "--freeze-layers", "2", "--patience", "3")
    config = json.loads(rows["config"][0])
    assert config["freeze_layers"] == 2 and config["patience"] == 3
    assert rows["model"][0] == "default_model (2 layers frozen)"
    rows = _finetune(tmp_path, "--seeds", "0", "--features", "ecfp4")
    assert rows["model"][0] == "default_model + ecfp4"
    from smiexlm.cli.main import app

    bad = CliRunner().invoke(app, ["finetune", "bbbp", "--features", "maccs"])
    assert bad.exit_code != 0 and "features" in str(bad.exception)


def test_finished_runs_are_read_back_without_texts_or_features(tmp_path, monkeypatch):
    """``--resume`` on a finished fine-tuning gives back its results and computes nothing of
    the set first: neither the model's texts nor the features beside them (the descriptors of
    MUV alone take minutes)."""
    import smiexlm.chemistry.fingerprints
    from smiexlm.finetuning.backbone import Backbone

    torch.set_num_threads(1)
    args = ("--seeds", "0", "1", "--features", "ecfp4")
    first = _finetune(tmp_path, *args)

    def refused(*args, **kwargs):
        raise AssertionError("computed for a finished run")

    monkeypatch.setattr(smiexlm.chemistry.fingerprints, "molecule_features", refused)
    monkeypatch.setattr(Backbone, "model_texts", refused)
    again = _finetune(tmp_path, *args, "--resume", out=tmp_path / "out0")
    assert again[["seed", "valid", "test"]].equals(first[["seed", "valid", "test"]])


def test_a_head_on_the_last_three_blocks_is_saved_and_served(tmp_path):
    """The default model's head reads its three embedding blocks unless told otherwise:
    recorded in the run and the folder, and ``predict`` gives back the test scores the run
    kept; ``--layers 1`` reads the last block, as a folder from before the option (no
    ``layers`` key) does; more layers than blocks is a clear error."""
    from smiexlm.cli.main import app
    from smiexlm.modelio.integrity import record_checksums
    from smiexlm.serving.prediction import predict

    torch.set_num_threads(1)
    models = tmp_path / "models"
    rows = _finetune(tmp_path, "--seeds", "0", "--save-dir", str(models))
    assert rows["model"][0] == "default_model"  # its own blocks: no suffix
    assert json.loads(rows["config"][0])["layers"] == 3
    meta = json.loads((models / "seed0" / "finetune.json").read_text())
    assert meta["layers"] == 3
    kept = np.load(tmp_path / "out0" / "runs" / "mini" / "seed0" / "predictions.npz")
    _, frame = _small_csv(tmp_path)
    test = frame["smi"].to_numpy()[kept["test_rows"]].tolist()
    np.testing.assert_allclose(predict(models / "seed0", test)["y"], kept["test"][:, 0],
                               rtol=1e-5, atol=1e-6)  # fmt: skip

    older = tmp_path / "older"
    rows = _finetune(tmp_path, "--seeds", "0", "--layers", "1", "--save-dir", str(older))
    assert rows["model"][0] == "default_model, head on the last block"
    before = predict(older / "seed0", test)["y"]
    meta = json.loads((older / "seed0" / "finetune.json").read_text())
    del meta["layers"], meta["config"]["layers"]
    (older / "seed0" / "finetune.json").write_text(json.dumps(meta))
    record_checksums(older / "seed0", "finetune.json")
    np.testing.assert_array_equal(predict(older / "seed0", test)["y"], before)

    bad = CliRunner().invoke(app, ["finetune", "mini", "--data", str(tmp_path / "mini.csv"),
                                   "--smiles-col", "smi", "--label-cols", "y", "--layers", "5",
                                   "--split", "random", "--out", str(tmp_path / "bad")])  # fmt: skip
    assert bad.exit_code != 0 and "layers" in str(bad.exception)


def test_a_head_on_several_poolings_side_by_side_is_saved_and_served(tmp_path):
    """``--pooling cls+mean+max``: the head reads the three poolings of each of its blocks
    side by side (3 x 3 x d inputs for the default's three blocks); the folder records it and
    ``predict`` gives back the run's kept test scores; an unknown pooling names the field."""
    from smiexlm.cli.main import app
    from smiexlm.errors import DataError
    from smiexlm.modelio.integrity import record_checksums
    from smiexlm.serving.prediction import predict

    torch.set_num_threads(1)
    models = tmp_path / "models"
    rows = _finetune(tmp_path, "--seeds", "0", "--pooling", "cls+mean+max", "--save-dir",
                     str(models))  # fmt: skip
    assert json.loads(rows["config"][0])["pooling"] == "cls+mean+max"
    meta = json.loads((models / "seed0" / "finetune.json").read_text())
    assert meta["pooling"] == "cls+mean+max" and meta["layers"] == 3
    kept = np.load(tmp_path / "out0" / "runs" / "mini" / "seed0" / "predictions.npz")
    _, frame = _small_csv(tmp_path)
    test = frame["smi"].to_numpy()[kept["test_rows"]].tolist()
    np.testing.assert_allclose(predict(models / "seed0", test)["y"], kept["test"][:, 0],
                               rtol=1e-5, atol=1e-6)  # fmt: skip

    meta["pooling"] = "cls+sum"  # a record naming a pooling there is none of
    (models / "seed0" / "finetune.json").write_text(json.dumps(meta))
    record_checksums(models / "seed0", "finetune.json")
    with pytest.raises(DataError, match="key 'pooling' is 'cls\\+sum': expected one of"):
        predict(models / "seed0", test)

    bad = CliRunner().invoke(app, ["finetune", "mini", "--data", str(tmp_path / "mini.csv"),
                                   "--smiles-col", "smi", "--label-cols", "y", "--pooling",
                                   "cls+sum", "--out", str(tmp_path / "bad")])  # fmt: skip
    assert (
        bad.exit_code != 0 and "pooling" in str(bad.exception) and "cls+sum" in str(bad.exception)
    )


def test_cli_predict_ensemble_mean_and_std_per_molecule(tmp_path):
    from smiexlm.cli.main import app
    from smiexlm.serving.prediction import predict

    torch.set_num_threads(1)
    models = tmp_path / "models"
    _finetune(tmp_path, "--seeds", "0", "1", "--features", "both", "--save-dir", str(models))
    inputs = tmp_path / "new.csv"
    pd.DataFrame({"smiles": ["CCO", "c1ccccc1CC", "not a smiles"]}).to_csv(inputs, index=False)
    out = tmp_path / "preds.csv"
    result = CliRunner().invoke(app, [
        "predict", "--checkpoint", str(models / "seed0"), str(models / "seed1"),
        "--input", str(inputs), "--output", str(out),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    preds = pd.read_csv(out)
    single = [predict(models / f"seed{s}", ["CCO", "c1ccccc1CC"])["y"].to_numpy() for s in (0, 1)]
    np.testing.assert_allclose(preds["y"][:2], np.mean(single, axis=0), rtol=1e-5)
    np.testing.assert_allclose(preds["y_std"][:2], np.std(single, axis=0), rtol=1e-4, atol=1e-7)
    assert preds["valid"].tolist() == [True, True, False] and preds["y_std"].isna().tolist()[2]


@pytest.mark.parametrize("whiten", [True, False])
def test_a_saved_probe_is_served_by_predict_as_it_scored(tmp_path, whiten):
    """``probe --save-dir`` keeps the fit as a folder with a linear head (its standardisation
    and the corpus whitening folded into the weights): ``predict`` gives back the probe's own
    validation and test probabilities, with the domain and calibration columns."""
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.probe import ProbeConfig, run_probe
    from smiexlm.moleculenet.loaders import read_task
    from smiexlm.serving.prediction import predict

    torch.set_num_threads(1)
    path, frame = _small_csv(tmp_path)
    task = read_task(path, "smi", ["y"])
    cfg = ProbeConfig(split="random", device="cpu", whiten=whiten, c_grid=(0.01, 0.1, 1.0))
    runs_root, save = tmp_path / "runs", tmp_path / "saved"
    (result,) = run_probe(task, Backbone(), [0], cfg, run_root=runs_root, save_dir=save)
    kept = np.load(runs_root / "mini" / "seed0" / "predictions.npz")
    meta = json.loads((save / "seed0" / "finetune.json").read_text())
    assert meta["head"] == "linear" and meta["config"]["whiten"] is whiten
    for part in ("valid", "test"):
        rows = kept[f"{part}_rows"]
        served = predict(save / "seed0", frame["smi"].iloc[rows].tolist(), calibrate=True)
        plain = predict(save / "seed0", frame["smi"].iloc[rows].tolist())
        np.testing.assert_allclose(plain["y"].to_numpy(), kept[part][:, 0], atol=2e-5)
        assert served["in_domain"].notna().all() and served["y"].between(0, 1).all()
    from sklearn.metrics import roc_auc_score

    test_rows = kept["test_rows"]
    served = predict(save / "seed0", frame["smi"].iloc[test_rows].tolist())
    assert roc_auc_score(frame["y"].iloc[test_rows], served["y"]) * 100 == pytest.approx(
        result.test, abs=1e-6
    )


def test_a_probe_is_saved_once_per_fit_and_not_over_another_model(tmp_path):
    from smiexlm.cli.main import app

    torch.set_num_threads(1)
    path, frame = _small_csv(tmp_path)
    frame["part"] = ["train"] * 40 + ["valid", "valid", "test", "test"] * 5  # its own split
    frame.to_csv(path, index=False)
    args = ["probe", "mini", "--data", str(path), "--smiles-col", "smi", "--label-cols", "y",
            "--seeds", "0", "1", "--device", "cpu", "--out", str(tmp_path / "probe"),
            "--save-dir", str(tmp_path / "saved"), "--split", "column:part"]  # fmt: skip
    first = CliRunner().invoke(app, args)  # a deterministic split: one fit serves both seeds
    assert first.exit_code == 0, first.output
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == ["seed0"]
    seeded = CliRunner().invoke(app, [*args[:-2], "--split", "random", "--save-dir",
                                      str(tmp_path / "seeded")])  # fmt: skip
    assert seeded.exit_code == 0, seeded.output
    assert sorted(p.name for p in (tmp_path / "seeded").iterdir()) == ["seed0", "seed1"]
    again = CliRunner().invoke(app, args)
    assert again.exit_code != 0 and "--overwrite" in str(again.exception)
    assert CliRunner().invoke(app, [*args, "--overwrite"]).exit_code == 0
    with_features = CliRunner().invoke(app, [*args, "--overwrite", "--features", "ecfp4"])
    assert with_features.exit_code != 0 and "features" in str(with_features.exception)


def test_cli_probe_on_a_user_csv(tmp_path):
    from smiexlm.cli.main import app

    torch.set_num_threads(1)
    path, _ = _small_csv(tmp_path)
    out = tmp_path / "probe"
    result = CliRunner().invoke(app, [
        "probe", "mini", "--data", str(path), "--smiles-col", "smi", "--label-cols", "y",
        "--split", "random", "--seeds", "0", "--device", "cpu", "--out", str(out),
        "--pooling", "cls+max",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(out / "results.csv")
    assert rows["model"][0] == "default_model linear probe (logistic)"
    config = json.loads(rows["config"][0])
    assert 0.0 <= rows["test"][0] <= 100.0 and config["chosen_c"] and config["pooling"] == "cls+max"
    # without options, the probe reads the model's own embedding, whitened as its folder says
    for flags, name in (((), "default_model linear probe (logistic), whitened"),
                        (("--no-whiten",), "default_model linear probe (logistic)")):  # fmt: skip
        result = CliRunner().invoke(app, [
            "probe", "mini", "--data", str(path), "--smiles-col", "smi", "--label-cols", "y",
            "--split", "random", "--seeds", "0", "--device", "cpu", "--out", str(out / "own"),
            *flags,
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
        assert pd.read_csv(out / "own" / "results.csv")["model"][0] == name


@pytest.mark.parametrize("features", ["ecfp4", "rdkit2d", "both"])
def test_baseline_features_match_a_forest_trained_by_hand(features, tmp_path):
    """The baseline's score, and the predictions it keeps, equal a RandomForest's fitted here
    on the same features and split (descriptors median-filled and scaled on the split's train
    rows)."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.metrics import roc_auc_score

    from smiexlm.chemistry.fingerprints import morgan_fingerprints, rdkit2d_descriptors
    from smiexlm.forests.baseline import DESCRIPTOR_CLIP, BaselineConfig, run_baseline
    from smiexlm.forests.features import FeatureScaler
    from smiexlm.moleculenet.splits import make_split
    from smiexlm.moleculenet.task import MoleculeTask

    smiles = [f"C1{'C' * n}1{tail}" for n in range(2, 14) for tail in ("", "O", "N", "Cl", "CC=O")]
    y = np.array([(len(s) + s.count("O")) % 2 for s in smiles], dtype=float)
    task = MoleculeTask("toy", smiles, y, ["y"], "classification")
    cfg = BaselineConfig(features, n_trees=20, split="random")
    (result,) = run_baseline(task, [3], cfg, run_root=tmp_path)
    assert result.model == {"ecfp4": "RF-ECFP4", "rdkit2d": "RF-RDKit2D",
                            "both": "RF-ECFP4+RDKit2D"}[features] + " (20 trees)"  # fmt: skip

    split = make_split(smiles, "random", 3)
    parts = []
    if features != "rdkit2d":
        parts.append(morgan_fingerprints(smiles).astype(np.float32))
    if features != "ecfp4":
        raw = rdkit2d_descriptors(smiles)
        scaler = FeatureScaler.fit(raw[split.train], "rdkit2d", clip=DESCRIPTOR_CLIP)
        parts.append(scaler.transform(raw))
    x = np.concatenate(parts, axis=1)
    assert np.isfinite(x).all()
    forest = RandomForestClassifier(n_estimators=20, random_state=3, class_weight="balanced")
    forest.fit(x[split.train], y[split.train])
    expected = roc_auc_score(y[split.test], forest.predict_proba(x[split.test])[:, 1]) * 100
    assert result.test == pytest.approx(expected)
    kept = np.load(tmp_path / "toy" / "seed3" / "predictions.npz")
    assert kept["test_rows"].tolist() == list(split.test)
    np.testing.assert_allclose(kept["test"][:, 0], forest.predict_proba(x[split.test])[:, 1],
                               rtol=1e-6)  # fmt: skip
    np.testing.assert_allclose(kept["valid"][:, 0], forest.predict_proba(x[split.valid])[:, 1],
                               rtol=1e-6)  # fmt: skip


def test_predict_with_no_parsable_smiles_gives_nan_rows(tmp_path):
    """A file of nothing but bad SMILES still gets one NaN row per input, valid False."""
    from smiexlm.finetuning.folder import save_finetuned
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel
    from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
    from smiexlm.serving.prediction import predict
    from smiexlm.tokenizer import SmilesTokenizer

    model = ExLMForSequencePrediction(
        ExLMModel.from_pretrained(DEFAULT_MODEL_DIR), 1, "regression", 0.0, "cls"
    )
    meta = {"task_type": "regression", "n_outputs": 1, "pooling": "cls", "label_cols": ["y"],
            "target_mean": [0.0], "target_std": [1.0], "config": {}}  # fmt: skip
    save_finetuned(model, SmilesTokenizer.load(DEFAULT_MODEL_DIR / "vocab.json"), tmp_path, meta)
    frame = predict(tmp_path, ["not a smiles", ""])
    assert frame["valid"].tolist() == [False, False] and frame["y"].isna().all()


def test_both_features_are_the_bits_then_the_descriptors():
    from smiexlm.chemistry.fingerprints import molecule_features

    smiles = ["CCO", "c1ccccc1O", "CC(=O)Oc1ccccc1C(=O)O"]
    both = molecule_features(smiles, "both")
    bits, descriptors = molecule_features(smiles, "ecfp4"), molecule_features(smiles, "rdkit2d")
    assert both.shape == (3, 2048 + descriptors.shape[1]) and both.dtype == np.float32
    np.testing.assert_array_equal(both, np.hstack([bits, descriptors]))


def test_predict_with_test_time_augmentation(tmp_path):
    """tta=K: the mean over the canonical and K random spellings, their spread in
    <label>_tta_std; a molecule's value is the same alone or among others; tta=0 is unchanged."""
    from smiexlm.finetuning.folder import save_finetuned
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel
    from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
    from smiexlm.serving.prediction import predict
    from smiexlm.tokenizer import SmilesTokenizer

    torch.manual_seed(0)
    model = ExLMForSequencePrediction(
        ExLMModel.from_pretrained(DEFAULT_MODEL_DIR), 1, "regression", 0.0, "cls"
    )
    meta = {"task_type": "regression", "n_outputs": 1, "pooling": "cls", "label_cols": ["y"],
            "target_mean": [0.0], "target_std": [1.0], "config": {}}  # fmt: skip
    save_finetuned(model, SmilesTokenizer.load(DEFAULT_MODEL_DIR / "vocab.json"), tmp_path, meta)
    smiles = ["CC(=O)Oc1ccccc1C(=O)O", "bad", "CN1CCC[C@H]1c1cccnc1", "C"]
    plain, tta = predict(tmp_path, smiles), predict(tmp_path, smiles, tta=4)
    assert list(tta.columns) == ["smiles", "valid", "y", "y_tta_std", "truncated"]
    assert tta["valid"].tolist() == [True, False, True, True] and tta.loc[1, ["y", "y_tta_std"]].isna().all()  # fmt: skip
    assert tta.loc[3, "y_tta_std"] == 0.0  # methane has one spelling
    assert tta.loc[0, "y_tta_std"] > 0.0 and tta.loc[0, "y"] != plain.loc[0, "y"]
    alone = predict(tmp_path, smiles[2:3], tta=4)
    assert alone.loc[0, "y"] == pytest.approx(tta.loc[2, "y"], abs=1e-6)
    assert predict(tmp_path, smiles, tta=0).equals(plain)


def test_a_stopped_forest_seed_goes_on_to_the_uninterrupted_predictions(tmp_path, monkeypatch):
    """A seed's forests are fitted task by task and the finished tasks' scores kept in the
    cell's state/: a run stopped after two of four tasks fits only the other two when started
    again, and keeps bitwise the predictions of an uninterrupted run; the state is gone after."""
    from smiexlm.errors import DataError
    from smiexlm.forests import baseline
    from smiexlm.forests.baseline import BaselineConfig, run_baseline
    from smiexlm.moleculenet.task import MoleculeTask

    smiles = [f"C1{'C' * n}1{tail}" for n in range(2, 14) for tail in ("", "O", "N", "Cl", "CC=O")]
    y = np.array([[(len(s) + k * s.count("C")) % 2 for k in range(4)] for s in smiles], float)
    task = MoleculeTask("toy", smiles, y, [f"y{k}" for k in range(4)], "classification")
    cfg = BaselineConfig("ecfp4", n_trees=5, split="random")
    (whole,) = run_baseline(task, [1], cfg, run_root=tmp_path / "whole")

    monkeypatch.setattr(baseline, "KEEP_EVERY_S", 0.0)
    fit = baseline.fit_forests
    calls = []

    def stopping(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return fit(*args, **kwargs)

    monkeypatch.setattr(baseline, "fit_forests", stopping)
    with pytest.raises(KeyboardInterrupt):
        run_baseline(task, [1], cfg, run_root=tmp_path / "cut")
    state = tmp_path / "cut" / "toy" / "seed1" / "state" / baseline.PARTIAL_NAME
    assert state.is_file()
    calls.clear()
    monkeypatch.setattr(baseline, "fit_forests", lambda *a, **k: (calls.append(1), fit(*a, **k))[1])
    with pytest.raises(DataError, match="holds a stopped run of toy seed 1"):
        run_baseline(task, [1], cfg, run_root=tmp_path / "cut")
    (resumed,) = run_baseline(task, [1], cfg, run_root=tmp_path / "cut", resume=True)
    assert len(calls) == 2  # tasks 3 and 4 only
    assert (resumed.valid, resumed.test) == (whole.valid, whole.test)
    for part in ("valid", "test"):
        kept = [np.load(tmp_path / run / "toy" / "seed1" / "predictions.npz")[part]
                for run in ("whole", "cut")]  # fmt: skip
        np.testing.assert_array_equal(*kept)
    assert not state.exists() and not state.parent.exists()  # the state folder goes with it

    # a finished seed is read back, with nothing fitted, and its recorded time; with other
    # forests it is refused, naming what differs
    calls.clear()
    (read,) = run_baseline(task, [1], cfg, run_root=tmp_path / "cut", resume=True)
    assert (
        not calls and read.read_back and (read.test, read.wall_s) == (resumed.test, resumed.wall_s)
    )
    other = BaselineConfig("ecfp4", n_trees=4, split="random")
    with pytest.raises(DataError, match="made with n_trees = 5, but this run asks for n_trees = 4"):
        run_baseline(task, [1], other, run_root=tmp_path / "cut", resume=True)

    # a state of other forests (4 trees), or one that cannot be read, is not used: all four
    # tasks are fitted again
    for name in ("predictions.npz", "result.json"):
        (tmp_path / "cut" / "toy" / "seed1" / name).unlink()
    monkeypatch.setattr(baseline, "fit_forests", stopping)
    calls.clear()
    with pytest.raises(KeyboardInterrupt):
        run_baseline(task, [1], other, run_root=tmp_path / "cut")
    assert state.is_file()
    for damaged in (False, True):
        if damaged:
            state.parent.mkdir(parents=True, exist_ok=True)
            state.write_bytes(b"not an npz")
        monkeypatch.setattr(
            baseline, "fit_forests", lambda *a, **k: (calls.append(1), fit(*a, **k))[1]
        )
        calls.clear()
        for name in ("predictions.npz", "result.json"):
            (tmp_path / "cut" / "toy" / "seed1" / name).unlink(missing_ok=True)
        (again,) = run_baseline(task, [1], cfg, run_root=tmp_path / "cut", resume=True)
        assert len(calls) == 4 and (again.valid, again.test) == (whole.valid, whole.test)


def test_each_result_records_the_versions_its_scores_depend_on(tmp_path):
    import rdkit
    import sklearn

    from smiexlm import __version__

    frame = _finetune(tmp_path, "--seeds", "0", "--random-init")
    software = json.loads(frame["config"][0])["software"]
    assert software == {"smiexlm": __version__, "rdkit": rdkit.__version__,
                        "torch": torch.__version__, "scikit-learn": sklearn.__version__,
                        "numpy": np.__version__}  # fmt: skip


def test_a_table_brings_its_own_split_in_a_column(tmp_path):
    """``--split column:NAME``: the rows the table says, never a computed split; a bad cell is
    named with its row, and the kind is refused where no table column can be read."""
    from smiexlm.cli.main import app
    from smiexlm.errors import ConfigError, DataError
    from smiexlm.moleculenet import read_task
    from smiexlm.moleculenet.splits import make_split

    path, frame = _small_csv(tmp_path)
    fold = [
        "test" if i % 5 == 0 else "valid" if i % 5 == 1 else " Train " for i in range(len(frame))
    ]
    frame["fold"] = fold
    frame.loc[7, "smi"] = "not a smiles"  # dropped as unparsable: the parts stay aligned
    frame.to_csv(path, index=False)
    task = read_task(path, "smi", ["y"], split_col="fold")
    kept = [f.strip().lower() for i, f in enumerate(fold) if i != 7]
    split = task.split("column:fold", 0)
    assert [kept[i] for i in split.test] == ["test"] * len(split.test)
    assert sorted(split.train + split.valid + split.test) == list(range(len(task)))
    assert split.label == "column:fold" and split.seed is None
    with pytest.raises(ConfigError, match="read with 'column:fold'"):
        task.split("column:other", 0)
    with pytest.raises(ConfigError, match="split column"):
        make_split(task.smiles, "column:fold")

    out = tmp_path / "own"
    result = _finetune_cli(path, out, "--split", "column:fold", "--seeds", "0", "--random-init")
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(out / "results.csv")
    assert rows["split"][0] == "column:fold"
    assert rows["sizes"][0] == "/".join(str(kept.count(p)) for p in ("train", "valid", "test"))
    with np.load(out / "runs" / "mini" / "seed0" / "predictions.npz") as kept_scores:
        assert kept_scores["test_rows"].tolist() == split.test

    frame.loc[3, "fold"] = "holdout"
    frame.to_csv(path, index=False)
    with pytest.raises(DataError, match="split column 'fold', line 5, holds 'holdout'"):
        read_task(path, "smi", ["y"], split_col="fold")
    result = CliRunner().invoke(app, ["probe", "bbbp", "--split", "column:fold"])
    assert result.exit_code != 0 and "your own table" in str(result.exception)


def test_a_split_column_without_valid_rows_gets_one_carved_from_train(tmp_path, caplog):
    """Whole scaffold groups of the train rows (seed 0), about 10 %, the test rows untouched;
    said once; ``valid_from_train=0`` keeps the column as it is, which training refuses."""
    from smiexlm.errors import DataError
    from smiexlm.moleculenet import read_task
    from smiexlm.moleculenet.splits import murcko_scaffolds

    # 40 scaffolds (a ring of 3 to 12 atoms, a linker of 1 to 4, a phenyl), two molecules each
    smiles = [f"C1{'C' * (ring - 1)}C1{'C' * linker}c1ccc({x})cc1"
              for ring in range(3, 13) for linker in range(1, 5) for x in ("O", "N")]  # fmt: skip
    fold = ["test" if i % 10 < 2 else "train" for i in range(len(smiles))]  # 16 test, 64 train
    path = tmp_path / "own.csv"
    pd.DataFrame({"smi": smiles, "y": [i % 2 for i in range(len(smiles))], "fold": fold}).to_csv(
        path, index=False
    )
    task = read_task(path, "smi", ["y"], split_col="fold")
    assert [p for p, f in zip(task.parts, fold, strict=True) if f == "test"] == ["test"] * 16
    valid = [i for i, p in enumerate(task.parts) if p == "valid"]
    train = [i for i, p in enumerate(task.parts) if p == "train"]
    assert 0 < len(valid) <= 0.1 * 64 and len(valid) + len(train) == 64
    scaffolds = murcko_scaffolds(task.smiles)
    assert not {scaffolds[i] for i in valid} & {scaffolds[i] for i in train}  # whole groups
    assert read_task(path, "smi", ["y"], split_col="fold").parts == task.parts  # seeded
    assert sum("has no valid rows" in r.getMessage() for r in caplog.records) == 2
    kept = read_task(path, "smi", ["y"], split_col="fold", valid_from_train=0.0)
    assert "valid" not in kept.parts
    with pytest.raises(DataError, match="--valid-from-train above 0"):
        kept.check_split(kept.split("column:fold", 0))


def test_a_resume_with_other_label_columns_or_kind_is_refused(tmp_path):
    """One table, two label columns: a finished run of ``y`` is not the result of ``y2``,
    nor of ``y`` as a regression; each is refused in one line naming the option, and the
    baseline's resume too."""
    from smiexlm.cli.main import app

    path, frame = _small_csv(tmp_path)
    frame.assign(y2=1 - frame["y"]).to_csv(path, index=False)
    out = tmp_path / "out"
    common = ["--data", str(path), "--smiles-col", "smi", "--split", "random", "--seeds", "0",
              "--device", "cpu", "--random-init", "--max-train-steps", "1", "--epochs", "1",
              "--forest", "none", "--set", "kernels=none", "--out", str(out)]  # fmt: skip
    first = CliRunner().invoke(app, ["finetune", "mini", *common, "--label-cols", "y"])
    assert first.exit_code == 0, first.output
    for extra, said in ((["--label-cols", "y2"], "--label-cols = ['y']"),
                        (["--label-cols", "y", "--task-type", "regression"],
                         "--task-type = 'classification'")):  # fmt: skip
        again = CliRunner().invoke(app, ["finetune", "mini", *common, *extra, "--resume"])
        assert again.exit_code != 0 and said in str(again.exception), again.output
    base = ["baseline", "--data", str(path), "--smiles-col", "smi", "--split", "random",
            "--seeds", "0", "--n-trees", "5", "--out", str(tmp_path / "base")]  # fmt: skip
    assert CliRunner().invoke(app, [*base, "--label-cols", "y"]).exit_code == 0
    again = CliRunner().invoke(app, [*base, "--label-cols", "y2", "--resume"])
    assert again.exit_code != 0 and "--label-cols = ['y']" in str(again.exception)
