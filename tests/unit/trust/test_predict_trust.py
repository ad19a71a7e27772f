"""predict's calibration and conformal columns, against the folder's own validation data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from smiexlm.errors import ConfigError, DataError


def _models(tmp_path, task_type="classification", seeds=("0",), split="random", forest="none"):
    from smiexlm.cli.main import app
    from tests.unit.finetuning.test_moleculenet_finetune import _small_csv

    path, frame = _small_csv(tmp_path)
    if task_type == "regression":
        frame["y"] = frame["smi"].str.len() / 10.0
        frame.to_csv(path, index=False)
    models = tmp_path / f"models_{task_type}_{split}_{forest}"
    result = CliRunner().invoke(app, [
        "finetune", "mini", "--data", str(path), "--smiles-col", "smi", "--label-cols", "y",
        "--task-type", task_type, "--split", split, "--max-train-steps", "3", "--batch-size",
        "8", "--epochs", "1", "--device", "cpu", "--random-init", "--seeds", *seeds,
        "--save-dir", str(models), "--out", str(tmp_path / f"ft_{task_type}_{split}_{forest}"),
        # the network's own probabilities are what is calibrated here, unless a forest is asked
        # (the kernel members of a regression blend: tests/unit/forests/test_members.py)
        "--forest", forest, "--set", "forest_trees=20", "--set", "kernels=none",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    return [models / f"seed{s}" for s in seeds], frame


def _valid_smiles(frame, split="random"):
    from smiexlm.moleculenet.splits import make_split

    return [frame["smi"][i] for i in make_split(frame["smi"].tolist(), split, 0).valid]


def test_calibrated_probabilities_and_sets_cover_the_validation_molecules(tmp_path):
    from smiexlm.serving.prediction import predict
    from smiexlm.trust.calibration import fit_temperature
    from smiexlm.trust.reference import Reference

    (folder,), frame = _models(tmp_path)
    ref = Reference.load(folder)
    valid = _valid_smiles(frame)
    plain = predict(folder, valid)
    np.testing.assert_allclose(plain["y"], ref.valid_scores[:, 0], rtol=1e-5)  # as stored
    t = fit_temperature(ref.valid_labels, ref.valid_logits)[0]
    calibrated = predict(folder, valid, calibrate=True, conformal_alpha=0.2)
    np.testing.assert_allclose(calibrated["y"], 1 / (1 + np.exp(-ref.valid_logits[:, 0] / t)),
                               rtol=1e-5)  # fmt: skip
    # split-conformal on its own calibration molecules covers at least 1 - alpha of them
    labels = ref.valid_labels[:, 0].astype(int)
    sets = calibrated["y_set"].tolist()
    assert set(sets) <= {"{0}", "{1}", "{0,1}", "{}"}
    covered = np.mean([str(y) in s for y, s in zip(labels, sets, strict=True)])
    assert covered >= 0.8
    wide = predict(folder, valid, conformal_alpha=0.01)  # too few molecules: {0,1} for all
    assert set(wide["y_set"]) == {"{0,1}"}


def test_regression_intervals_are_the_validation_residual_quantile(tmp_path):
    import math

    from smiexlm.serving.prediction import predict
    from smiexlm.trust.reference import Reference

    (folder,), frame = _models(tmp_path, "regression")
    ref = Reference.load(folder)
    residual = np.sort(np.abs(ref.valid_labels[:, 0] - ref.valid_scores[:, 0]).astype(float))
    n, alpha = len(residual), 0.25
    q = residual[math.ceil((n + 1) * (1 - alpha)) - 1]  # brute force order statistic
    got = predict(folder, ["CCO", "CCCCO", "xx"], conformal_alpha=alpha)
    np.testing.assert_allclose(got["y_high"][:2] - got["y"][:2], q, rtol=1e-5)
    np.testing.assert_allclose(got["y"][:2] - got["y_low"][:2], q, rtol=1e-5)
    assert np.isnan(got["y_low"][2]) and not got["valid"][2]
    with pytest.raises(ConfigError, match="calibrate"):
        predict(folder, ["CCO"], calibrate=True)
    with pytest.raises(ConfigError, match="mondrian"):
        predict(folder, ["CCO"], conformal_alpha=0.2, mondrian=True)
    with pytest.raises(ConfigError, match="alpha"):
        predict(folder, ["CCO"], conformal_alpha=1.5)


def test_conformal_methods_calibrate_by_distance_or_weight_and_say_where(tmp_path):
    """``distance``: each molecule's set is split-conformal on the validation molecules of its
    bin of nearest similarity (by brute force); ``class`` is ``--mondrian``; a molecule
    farther than every validation molecule is flagged; ``weighted`` keeps the columns."""
    import math

    from smiexlm.serving.prediction import predict
    from smiexlm.trust.reference import Reference
    from smiexlm.trust.shift import distance_bins

    (folder,), frame = _models(tmp_path)
    ref = Reference.load(folder)
    far = "FC(F)(F)C(F)(F)C(F)(F)C(F)(F)C(F)(F)F"
    queries = frame["smi"].tolist()[:40] + [far]
    alpha = 0.25
    got = predict(folder, queries, conformal_alpha=alpha, conformal_method="distance")
    cal_bins, query_bins, _ = distance_bins(ref.valid_tanimoto, got["nearest_tanimoto"], alpha)
    np.testing.assert_array_equal(got["conformal_bin"], query_bins)
    y = ref.valid_labels[:, 0]
    nonconformity = np.where(y == 1, 1 - ref.valid_scores[:, 0], ref.valid_scores[:, 0])
    for i, b in enumerate(query_bins):
        scores = np.sort(nonconformity[cal_bins == b].astype(float))
        k = math.ceil((len(scores) + 1) * (1 - alpha))
        q = scores[k - 1] if k <= len(scores) else np.inf
        p = got["y"][i]
        expected = "{" + ",".join(c for c, s in (("0", p), ("1", 1 - p)) if s <= q + 1e-6) + "}"
        assert got["y_set"][i] == expected, (i, b, q, p)
    assert got["outside_calibration"].tolist() == [
        n < ref.valid_tanimoto.min() for n in got["nearest_tanimoto"]
    ]
    assert got["outside_calibration"].iloc[-1]  # a perfluoroalkane among small alcohols
    mondrian = predict(folder, queries, conformal_alpha=alpha, mondrian=True)
    by_class = predict(folder, queries, conformal_alpha=alpha, conformal_method="class")
    assert mondrian["y_set"].equals(by_class["y_set"])
    weighted = predict(folder, queries, conformal_alpha=alpha, conformal_method="weighted")
    assert set(weighted["y_set"]) <= {"{0}", "{1}", "{0,1}", "{}"}
    assert "conformal_bin" not in weighted and (weighted["conformal_weight"] > 0).all()
    alone = predict(folder, queries[:1], conformal_alpha=alpha, conformal_method="weighted")
    assert alone["conformal_weight"][0] == 1  # one molecule: no shift to estimate, split
    with pytest.raises(ConfigError, match="conformal-alpha"):
        predict(folder, queries, conformal_method="distance")
    with pytest.raises(ConfigError, match="mondrian"):
        predict(folder, queries, conformal_alpha=alpha, mondrian=True, conformal_method="distance")
    with pytest.raises(ConfigError, match="conformal_method"):
        predict(folder, queries, conformal_alpha=alpha, conformal_method="nearest")


@pytest.mark.parametrize("task_type", ["classification", "regression"])
def test_a_blend_is_calibrated_by_its_members_disagreement_by_default(tmp_path, task_type):
    """A folder with a forest beside its model: ``difficulty`` scales each molecule's
    nonconformity by its members' spread plus the floor, the threshold the k-th smallest of
    the validation molecules' (by brute force); the default of a classification blend, while
    regression and a model alone get ``split`` by default and the latter refuses
    ``difficulty``."""
    import math

    from smiexlm.forests.forest import KeptForest
    from smiexlm.modelio.pretrained import load_finetuned
    from smiexlm.serving.prediction import predict
    from smiexlm.trust.conformal import DIFFICULTY_FLOOR
    from smiexlm.trust.reference import Reference

    (folder,), frame = _models(tmp_path, task_type, forest="rdkit2d")
    ref, meta = Reference.load(folder), load_finetuned(folder)[2]
    forest = KeptForest.load(folder, meta)
    queries, alpha = frame["smi"].tolist()[:40], 0.3
    got = predict(folder, queries, conformal_alpha=alpha, conformal_method="difficulty")
    default = predict(folder, queries, conformal_alpha=alpha)
    if task_type == "classification":
        pd.testing.assert_frame_equal(default, got)
    else:
        pd.testing.assert_frame_equal(default, predict(folder, queries, conformal_alpha=alpha,
                                                       conformal_method="split"))  # fmt: skip
        assert "y_difficulty" not in default
    hard = np.std([got["y_model"], got["y_forest"]], axis=0) + DIFFICULTY_FLOOR
    np.testing.assert_allclose(got["y_difficulty"], hard, rtol=1e-5)
    members = (ref.valid_scores[:, 0], forest.valid_scores[:, 0])
    hard_valid = np.std(members, axis=0) + DIFFICULTY_FLOOR
    y = ref.valid_labels[:, 0]
    if task_type == "classification":
        from smiexlm.forests.blend import blend

        model, rf = (m[:, None] for m in members)
        blended = blend(task_type, model, model, rf, rf)[:, 0]  # on the validation molecules
        residual = np.where(y == 1, 1 - blended, blended)
    else:
        residual = np.abs(y - (members[0] + members[1]) / 2)
    scores = np.sort(residual / hard_valid)
    q = scores[math.ceil((len(scores) + 1) * (1 - alpha)) - 1]
    for i, p in enumerate(got["y"]):
        if task_type == "classification":
            expected = "{" + ",".join(c for c, s in (("0", p), ("1", 1 - p))
                                      if s / got["y_difficulty"][i] <= q * (1 + 1e-6)) + "}"  # fmt: skip
            assert got["y_set"][i] == expected, (i, p, q)
        else:
            assert got["y_high"][i] - p == pytest.approx(q * got["y_difficulty"][i], rel=1e-4)
    (alone,), _ = _models(tmp_path, task_type)
    plain = predict(alone, queries, conformal_alpha=alpha)
    assert "y_difficulty" not in plain
    pd.testing.assert_frame_equal(plain, predict(alone, queries, conformal_alpha=alpha,
                                                 conformal_method="split"))  # fmt: skip
    with pytest.raises(ConfigError, match="'conformal_method'.*serve a blend"):
        predict(alone, queries, conformal_alpha=alpha, conformal_method="difficulty")


def test_an_ensemble_must_share_its_validation_molecules(tmp_path):
    from smiexlm.serving.prediction import predict

    a, b = _models(tmp_path, seeds=("0", "1"))[0]  # random splits: seeded, so they differ
    assert "y_std" in predict([a, b], ["CCO"]).columns  # predictions alone are fine
    with pytest.raises(DataError, match="validation molecules differ"):
        predict([a, b], ["CCO"], conformal_alpha=0.2)


def test_cli_writes_the_columns_into_a_csv_and_parts_alike(tmp_path):
    from smiexlm.cli.main import app
    from smiexlm.parts.reading import read_parts

    folders, _ = _models(tmp_path)
    inputs = tmp_path / "new.csv"
    pd.DataFrame({"smiles": ["CCO", "", "c1ccccc1CC", "xx", "CCN"]}).to_csv(inputs, index=False)
    args = ["predict", "--checkpoint", *map(str, folders), "--input", str(inputs),
            "--calibrate", "--conformal-alpha", "0.2"]  # fmt: skip
    csv = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "p.csv")])
    assert csv.exit_code == 0, csv.output
    parts = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "p"), "--part-rows", "2"])
    assert parts.exit_code == 0, parts.output
    want = pd.read_csv(tmp_path / "p.csv", keep_default_na=False)
    got = read_parts(tmp_path / "p").to_pandas()
    assert list(got.columns) == list(want.columns) and "y_set" in got.columns
    assert got["y_set"].tolist() == want["y_set"].astype(str).tolist()
    assert got["y_set"][1] == "" and got["y_set"][0] != ""


def test_unbounded_intervals_come_with_one_line_that_says_why(tmp_path, monkeypatch, caplog):
    """Too few validation molecules for --conformal-alpha: (-inf, inf) intervals, and one
    stderr line with how many there are, how many alpha needs and what to do, however many
    parts the output is written in; the Python API says the same."""
    import logging

    from smiexlm.serving.prediction import predict
    from smiexlm.trust import conformal
    from smiexlm.trust.reference import Reference
    from tests.warm_cli import run_smiexlm

    (folder,), _ = _models(tmp_path, "regression")
    n = int((~np.isnan(Reference.load(folder).valid_labels[:, 0])).sum())
    assert n < 99  # what alpha 0.01 needs
    inputs = tmp_path / "new.csv"
    pd.DataFrame({"smiles": ["CCO", "CCCCO", "c1ccccc1CC"]}).to_csv(inputs, index=False)
    said = (f"conformal alpha 0.01: task 'y' has {n} calibration molecule(s) (its labelled "
            "validation molecules) and needs at least 99 at that alpha, so its intervals are "
            f"(-inf, inf); use a larger alpha (at least 1/(n + 1) = {1 / (n + 1):.3g}) or more "
            "validation molecules")  # fmt: skip
    for out in (["--out", tmp_path / "p.csv"], ["--out", tmp_path / "p", "--part-rows", "1"]):
        res = run_smiexlm("predict", "--checkpoint", folder, "--input", inputs,
                          "--conformal-alpha", "0.01", *out)  # fmt: skip
        assert res.returncode == 0, res.stderr
        assert [line for line in res.stderr.splitlines() if "conformal" in line] == [said]
    assert np.isinf(pd.read_csv(tmp_path / "p.csv")["y_high"]).all()
    monkeypatch.setattr(conformal, "_SAID", set())
    with caplog.at_level(logging.WARNING):
        got = predict(folder, ["CCO"], conformal_alpha=0.01)
    assert [r.getMessage() for r in caplog.records if "conformal" in r.getMessage()] == [said]
    assert got["y_low"][0] == -np.inf


def test_a_backend_without_an_embedding_says_in_domain_rests_on_tanimoto_alone(caplog):
    """The ONNX predictor gives logits, no pooled embedding: in_domain is then the Tanimoto
    bound's alone, said once, and the cosine columns are left out."""
    import logging
    from types import SimpleNamespace

    import smiexlm.serving.predict_trust as trust
    from smiexlm.chemistry.fingerprints import ecfp4_packed
    from smiexlm.trust.domain import DomainBounds

    train = ["CCO", "CCCO", "c1ccccc1O", "CC(=O)O"]
    reference = SimpleNamespace(train_ecfp4=ecfp4_packed(train),
                                train_embedding=np.eye(4, dtype=np.float32),
                                bounds=lambda q: DomainBounds(0.3, 0.99))  # fmt: skip
    served = SimpleNamespace(texts=["CCCCO", "Clc1ccccc1Br"], reference=reference, pooled=None)
    trust._SAID.clear()
    with caplog.at_level(logging.WARNING, logger="smiexlm.serving.predict_trust"):
        first = trust.domain_columns(["m"], [served], 0.05)
        trust.domain_columns(["m"], [served], 0.05)
    assert "nearest_cosine" not in first and first["in_domain"].tolist() == [True, False]
    assert caplog.text.count("ECFP4 Tanimoto alone") == 1
    with_embedding = SimpleNamespace(**{**vars(served), "pooled": np.eye(4)[:2] + 0.5})
    assert "nearest_cosine" in trust.domain_columns(["m"], [with_embedding], 0.05)
