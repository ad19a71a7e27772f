"""Kernel members kept beside a fine-tuned regression model (smiexlm.forests.members): the
rules that weigh the members against a hand computation, and a small fine-tuning (two steps
of the shipped model, 20 trees) whose folder ``predict`` serves exactly as fine-tuning
scored it, with every member's column, and refuses when damaged."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from smiexlm.errors import ConfigError, DataError
from smiexlm.forests.members import combine, least_squares_weights, rmse

SMILES = [f"{head}{'C' * n}{tail}" for n in range(1, 11)
          for head, tail in (("C", "O"), ("c1ccccc1", ""), ("C", "N"), ("c1ccncc1", "O"),
                             ("CC(C)", "Cl"), ("c1ccoc1", "C"))]  # fmt: skip
VALUES = [0.3 * len(s) - 2.0 * ("c1" in s) + 0.5 * ("O" in s) for s in SMILES]
LONG = "C" * 600 + "O"  # more tokens than the model's 512 positions: cut, as the network cuts it
SMILES.append(LONG)
VALUES.append(1.0)
MEMBERS = ["model", "forest", "svr_tanimoto", "svr_rbf", "svr_both"]


def _rules_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.normal(size=(40, 1))
    oof = {
        "forest": y + rng.normal(0, 0.8, y.shape),
        "svr_tanimoto": y + rng.normal(0, 0.3, y.shape),
    }
    yv = rng.normal(size=(10, 1))
    valid = {"forest": yv + 0.5, "svr_tanimoto": yv + 0.2}
    return oof, y, valid, yv


def test_each_rule_weighs_the_members_as_computed_by_hand():
    from scipy.optimize import nnls

    oof, y, valid, yv = _rules_data()
    assert combine("fixed", oof, y, valid | {"model": yv}, yv, 0.5) == {
        "model": 0.5, "forest": 0.5, "svr_tanimoto": 0.0}  # fmt: skip
    best = combine("oof-best", oof, y, valid | {"model": yv}, yv, 0.5)
    assert best == {"model": 0.0, "forest": 0.0, "svr_tanimoto": 1.0}
    w, _ = nnls(np.hstack([oof["forest"], oof["svr_tanimoto"]]), y[:, 0])
    fitted = combine("oof-weights", oof, y, valid | {"model": yv}, yv, 0.5)
    np.testing.assert_allclose([fitted["forest"], fitted["svr_tanimoto"]], w / w.sum())
    assert fitted["model"] == 0.0
    np.testing.assert_allclose(least_squares_weights(list(oof.values()), y), w / w.sum())
    # gated: the network joins at its weight where it beats the others on validation...
    joined = combine("gated", oof, y, valid | {"model": yv + 0.01}, yv, 0.4)
    assert joined["model"] == 0.4 and sum(joined.values()) == pytest.approx(1.0)
    assert joined["svr_tanimoto"] == pytest.approx(0.6 * fitted["svr_tanimoto"])
    # ... and stays out where it does not
    assert combine("gated", oof, y, valid | {"model": yv + 3.0}, yv, 0.4) == fitted
    # picked: of fixed, gated, the forest alone and oof-best, the lowest validation RMSE
    cases = ((yv + 0.05, yv + 0.05, yv + 0.2, "fixed"), (yv - 0.2, yv + 0.5, yv + 0.2, "gated"),
             (yv + 3.0, yv + 0.01, yv + 0.2, "forest alone"),
             (yv + 3.0, yv + 3.0, yv + 0.01, "oof-best"))  # fmt: skip
    for model, forest, svr, want in cases:
        scores = {"model": model, "forest": forest, "svr_tanimoto": svr}
        picked = combine("picked", oof, y, scores, yv, 0.5)
        candidates = {rule: combine(rule, oof, y, scores, yv, 0.5)
                      for rule in ("fixed", "gated", "oof-best")}  # fmt: skip
        candidates["forest alone"] = {"model": 0.0, "forest": 1.0, "svr_tanimoto": 0.0}
        errors = {k: rmse(yv, sum(w[n] * scores[n] for n in w)) for k, w in candidates.items()}
        assert min(errors, key=errors.get) == want and picked == candidates[want], errors
    no_forest = {"svr_tanimoto": oof["svr_tanimoto"]}  # then fixed, gated or the kernel alone
    assert combine("picked", no_forest, y, valid | {"model": yv + 3.0}, yv, 0.5) == combine(
        "gated", no_forest, y, valid | {"model": yv + 3.0}, yv, 0.5
    )
    with pytest.raises(ConfigError, match="combine"):
        combine("median", oof, y, valid, yv, 0.5)
    assert rmse(np.array([[1.0], [np.nan]]), np.array([[3.0], [0.0]])) == 2.0


def test_kernel_and_combine_settings_are_checked():
    from smiexlm.finetuning.config import finetune_config, resolve_forest

    assert finetune_config("esol", kernels="tanimoto,both").kernels == "tanimoto,both"
    for key, value in (("kernels", "linear"), ("kernels", "tanimoto,tanimoto"),
                       ("combine", "stack")):  # fmt: skip
        with pytest.raises(ConfigError, match=key):
            finetune_config("esol", **{key: value})
    with pytest.raises(ConfigError, match="kernels"):
        finetune_config("esol", ensemble="wide", kernels="tanimoto")
    assert resolve_forest(finetune_config("bbbp"), "classification", 1).kernels == "none"
    with pytest.raises(ConfigError, match="kernels.*classification"):  # not silently dropped
        resolve_forest(finetune_config("bbbp", kernels="tanimoto"), "classification", 1)
    with pytest.raises(ConfigError, match="combine.*classification"):  # not silently ignored
        resolve_forest(finetune_config("bbbp", combine="oof-best"), "classification", 1)
    # without a pretrained model (a random init): auto keeps tanimoto, rbf named is refused
    random_init = resolve_forest(finetune_config("esol"), "regression", 1, embedding=False)
    assert random_init.kernels == "tanimoto"
    with pytest.raises(ConfigError, match="kernels.*without a pretrained model"):
        resolve_forest(finetune_config("esol", kernels="rbf"), "regression", 1, embedding=False)


def test_a_training_part_too_small_for_the_folds_is_refused_before_training(tmp_path):
    from smiexlm.finetuning.adapter import finetune_once
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.config import finetune_config
    from smiexlm.forests.members import check_kernel_rows
    from smiexlm.moleculenet.splits import Split
    from smiexlm.moleculenet.task import MoleculeTask

    check_kernel_rows(np.array([[1.0, 2.0], [0.5, 3.0]]), ["a", "b"])
    with pytest.raises(DataError, match=r"label 'a': 1 labelled training molecule"):
        check_kernel_rows(np.array([[1.0, 2.0], [np.nan, 3.0]]), ["a", "b"])
    task = MoleculeTask("mini", SMILES[:12], np.array(VALUES[:12])[:, None], ["y"], "regression")
    split = Split("column:part", None, [0], list(range(1, 6)), list(range(6, 12)))
    cfg = finetune_config(None, kernels="tanimoto", forest="none", device="cpu")
    with pytest.raises(DataError, match=r"label 'y': 1 labelled training molecule.*kernels=none"):
        finetune_once(task, split, cfg, 0, Backbone(), progress=False, run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before a run began


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """(results row, kept predictions, fine-tuned folder) of a regression run with a forest
    and the three kernel members, weighted out-of-fold."""
    from smiexlm.cli.main import app

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("members")
    path = root / "mini.csv"
    pd.DataFrame({"smi": SMILES, "y": VALUES}).to_csv(path, index=False)
    args = ["finetune", "mini", "--data", str(path), "--smiles-col", "smi", "--label-cols", "y",
            "--task-type", "regression", "--split", "random", "--max-train-steps", "2",
            "--batch-size", "8", "--epochs", "1", "--device", "cpu", "--seeds", "0",
            "--out", str(root / "out"), "--forest", "rdkit2d", "--forest-trees", "20",
            "--set", "kernels=tanimoto,rbf,both", "--set", "combine=oof-weights",
            "--save-dir", str(root / "models")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = pd.read_csv(root / "out" / "results.csv")
    npz = np.load(root / "out" / "runs" / "mini" / "seed0" / "predictions.npz")
    return rows.iloc[0], npz, root / "models" / "seed0"


def test_the_run_records_each_member_and_the_weights_it_chose(kept):
    row, npz, folder = kept
    meta = json.loads((folder / "finetune.json").read_text())
    weights = meta["members"]["weights"]
    assert sorted(weights) == sorted(MEMBERS) and sum(weights.values()) == pytest.approx(1.0)
    assert weights["model"] == 0.0  # oof-weights: the network has no out-of-fold predictions
    assert set(meta["members"]["cv_rmse"]) == set(MEMBERS) - {"model"}
    served = sum(weights[n] * npz[f"test_{n}"].astype(np.float64) for n in MEMBERS)
    np.testing.assert_allclose(npz["test"], served, rtol=1e-5, atol=1e-5)
    y = np.array(VALUES)[npz["test_rows"]]
    config = json.loads(row["config"])
    for name in MEMBERS:  # each alone in the results row, beside the served RMSE
        alone = float(np.sqrt(np.mean((npz[f"test_{name}"][:, 0] - y) ** 2)))
        assert config[f"test_{name}"] == pytest.approx(alone, rel=1e-4)
        assert config[f"member_weight_{name}"] == pytest.approx(weights[name], abs=1e-4)
    assert row["model"].endswith("+ RF-rdkit2d + SVR-tanimoto,rbf,both (oof-weights)")
    checksums = json.loads((folder / "checksums.json").read_text())["sha256"]
    assert "kernels.safetensors" in checksums
    assert (folder / "embedder" / "model.safetensors").is_file()


def test_predict_serves_every_member_as_fine_tuning_scored_it(kept, tmp_path):
    from smiexlm.serving.prediction import predict

    _, npz, folder = kept
    smiles = [SMILES[i] for i in npz["test_rows"]] + ["not a smiles"]
    frame = predict(folder, smiles)
    assert [c for c in frame.columns if c.startswith("y")] == ["y"] + [f"y_{n}" for n in MEMBERS]
    for name in ["", *(f"_{n}" for n in MEMBERS)]:
        key = f"test{name}"
        np.testing.assert_allclose(frame[f"y{name}"][:-1], npz[key][:, 0], rtol=1e-5, atol=1e-5)
    assert frame.iloc[-1][["y", "y_svr_both"]].isna().all()
    long = predict(folder, [LONG, "C" * 700])  # the same first 511 tokens, then EOS
    assert long["truncated"].all() and np.isfinite(long.filter(like="y").to_numpy()).all()
    assert long["y_svr_rbf"].nunique() == 1
    from smiexlm.embedding.onnx_export import export_onnx

    shutil.copytree(folder, tmp_path / "onnx")  # the ONNX path serves every member as torch does
    export_onnx(tmp_path / "onnx")
    both = smiles[:4] + [LONG]
    by_torch, by_onnx = predict(folder, both), predict(tmp_path / "onnx", both, backend="onnx")
    for name in ["", *(f"_{n}" for n in MEMBERS)]:
        np.testing.assert_allclose(by_onnx[f"y{name}"], by_torch[f"y{name}"], rtol=1e-4, atol=1e-4)


def test_the_kernel_file_loads_without_pickle_and_a_damaged_folder_is_refused(kept, tmp_path):
    import pickle

    from smiexlm.modelio.integrity import record_checksums
    from smiexlm.serving.prediction import predict

    _, _, folder = kept
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    real = pickle.loads
    try:
        pickle.loads = None  # type: ignore[assignment]  # any pickle use fails loudly
        predict(copy, SMILES[:2])
    finally:
        pickle.loads = real
    data = bytearray((copy / "kernels.safetensors").read_bytes())
    data[-8] ^= 0xFF
    (copy / "kernels.safetensors").write_bytes(bytes(data))
    with pytest.raises(DataError, match="kernels.safetensors.*sha256"):
        predict(copy, SMILES[:2])
    shutil.rmtree(copy)
    shutil.copytree(folder, copy)
    other = tmp_path / "other.safetensors"
    shutil.copyfile(copy / "embedder" / "model.safetensors", other)
    with open(copy / "embedder" / "model.safetensors", "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(DataError, match="embedder.*frozen embedding"):
        predict(copy, SMILES[:2])
    shutil.copyfile(other, copy / "embedder" / "model.safetensors")
    meta = json.loads((copy / "finetune.json").read_text())
    meta["members"]["weights"]["model"] = 0.7
    (copy / "finetune.json").write_text(json.dumps(meta))
    record_checksums(copy, "finetune.json")  # a record edited by hand, its sha256 redone
    with pytest.raises(DataError, match="members.weights"):
        predict(copy, SMILES[:2])


@pytest.mark.parametrize("edit, field", [
    (lambda m: m.update(members="nonsense"), "'members'"),
    (lambda m: m["members"].update(kernels=[1, 2]), "'members.kernels'"),
    (lambda m: m["members"]["kernels"].update(svr_rbf="x"), "'members.kernels.svr_rbf'"),
    (lambda m: m["members"]["kernels"]["svr_rbf"].update(C="abc"), "svr_rbf.*C = 'abc'"),
    (lambda m: m["members"]["kernels"]["svr_rbf"].update(gamma=None), "svr_rbf.*gamma = None"),
    (lambda m: m["members"]["kernels"]["svr_tanimoto"].update(gamma=2.0), "gamma = 2.0.*none"),
    (lambda m: m["members"].update(file="../other/kernels.safetensors"), "'members.file'"),
    (lambda m: m["members"].update(embedder="/elsewhere/embedder"), "'members.embedder'"),
])  # fmt: skip
def test_a_members_record_edited_to_nonsense_is_refused_in_one_line(kept, tmp_path, edit, field):
    """finetune.json's sha256 redone after the edit: the record itself is checked, field by
    field, and its paths are the folder's own."""
    from smiexlm.modelio.integrity import record_checksums
    from smiexlm.serving.prediction import predict

    copy = tmp_path / "copy"
    shutil.copytree(kept[2], copy)
    meta = json.loads((copy / "finetune.json").read_text())
    edit(meta)
    (copy / "finetune.json").write_text(json.dumps(meta))
    record_checksums(copy, "finetune.json")
    with pytest.raises(DataError, match=field):
        predict(copy, SMILES[:2])


def test_a_sparse_label_missing_from_a_fold_scores_nan_there_and_weighs_nothing():
    """Label b is measured on three molecules of one scaffold alone: the fold that holds
    that scaffold out has no value of b to fit on. Its out-of-fold predictions are NaN there
    (not a crash), and the scores and weights read the cells that are scored."""
    from smiexlm.chemistry.fingerprints import morgan_fingerprints
    from smiexlm.forests.kernels import KernelInputs, fit_kernel_member
    from smiexlm.forests.members import forest_oof

    smiles = SMILES[:30]
    y = np.full((30, 2), np.nan)
    y[:, 0] = VALUES[:30]
    groups = np.arange(30) % 6  # six "scaffolds", five folds: group 0 is held out alone once
    b_rows = np.flatnonzero(groups == 0)[:3]
    y[b_rows, 1] = [5.0, 6.0, 7.0]
    inputs = KernelInputs(morgan_fingerprints(smiles).astype(np.float32), None)
    member, oof = fit_kernel_member("tanimoto", inputs, y, groups)
    assert np.isnan(oof[b_rows, 1]).all() and np.isfinite(oof[:, 0]).all()
    assert np.isfinite(member.predict(inputs)).all()  # fitted on every row: b has its three
    trees = forest_oof(smiles, y, np.arange(30), groups, 0, "ecfp4", 5)
    assert np.isnan(trees[b_rows, 1]).all() and np.isfinite(trees[:, 0]).all()
    assert np.isfinite(rmse(y, oof))
    weights = least_squares_weights([oof, trees], y)
    assert weights.sum() == pytest.approx(1.0) and np.isfinite(weights).all()


def test_a_sharded_backbone_is_recorded_and_checked_by_its_index(tmp_path):
    """A backbone saved in shards has no model.safetensors: the kernel members name its
    weights by the shards' index (which records each shard's sha256), and a changed index is
    refused as a changed model.safetensors is."""
    from smiexlm.forests.members import KernelMembers, _checked_embedder
    from smiexlm.model.config import ExLMConfig
    from smiexlm.model.model import ExLMModel
    from smiexlm.modelio.integrity import weights_file, weights_sha256
    from smiexlm.modelio.layout import EMBEDDER_DIR, WEIGHTS_INDEX_NAME
    from smiexlm.modelio.weights import save_pretrained_sharded
    from smiexlm.paths import file_sha256

    torch.manual_seed(0)
    model = ExLMModel(ExLMConfig.tiny(n_layers=1, d_model=32, n_heads=2, d_ff=64))
    folder = tmp_path / "fine" / EMBEDDER_DIR
    save_pretrained_sharded(model, folder, max_shard_mib=0.05)
    assert weights_file(folder) == folder / WEIGHTS_INDEX_NAME
    assert weights_sha256(folder) == file_sha256(folder / WEIGHTS_INDEX_NAME)
    record = KernelMembers({}, {}, folder).record()
    assert record["embedder_sha256"] == file_sha256(folder / WEIGHTS_INDEX_NAME)
    assert _checked_embedder(tmp_path / "fine", record) == folder
    with pytest.raises(DataError, match="not the frozen embedding the kernel members"):
        _checked_embedder(tmp_path / "fine", record | {"embedder_sha256": "0" * 64})


def test_fixed_without_a_forest_is_the_network_alone_and_kept_weights_sum_to_one():
    from smiexlm.forests.members import member_weights

    oof, y, valid, yv = _rules_data()
    kernels_only = {"svr_tanimoto": oof["svr_tanimoto"]}
    weights = combine("fixed", kernels_only, y, {"model": yv} | valid, yv, 0.5)
    assert weights == {"model": 1.0, "svr_tanimoto": 0.0}  # the kernels weigh nothing in fixed
    record = {"weights": {"model": 0.5, "forest": 0.25, "svr_tanimoto": 0.2499995}}
    kept = member_weights(record, ["model", "forest", "svr_tanimoto"], "m")
    assert sum(kept.values()) == pytest.approx(1.0, abs=1e-15)
