"""ONNX export and the onnxruntime backend against the torch fp32 path.

Parity is checked on 1,000 MoleculeNet SMILES (500 BBBP, 500 ESOL as written, trailing spaces
included) for the featurizer (cls and mean; max and combined poolings on fewer) and for ``predict`` (a cls classifier
on the 1,000, served by ``smiexlm predict --backend onnx``; a mean-pooled regression head with
ECFP4 features reading the last two blocks, on 300, exported by ``smiexlm export-onnx``); the
limit is 1e-5, max abs.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from smiexlm.embedding.featurizer import Featurizer
from smiexlm.errors import ConfigError, DataError
from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
from tests.conftest import require_file
from tests.warm_cli import run_smiexlm

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def smiles(shared_data) -> list[str]:
    bbbp = pd.read_csv(require_file(shared_data, "moleculenet/bbbp.csv"))["smiles"]
    esol = pd.read_csv(require_file(shared_data, "moleculenet/esol.csv"))["smiles"]
    picked = bbbp.tolist()[:500] + esol.tolist()[:500]
    assert sum(s != s.strip() for s in picked) > 0  # ESOL's trailing spaces are in the set
    return picked


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A copy of the shipped model folder with its encoder.onnx."""
    from smiexlm.embedding.onnx_export import export_onnx

    path = tmp_path_factory.mktemp("onnx") / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, path)
    export_onnx(path)
    return path


@pytest.fixture(scope="module")
def featurizers(folder):
    torch_feat = Featurizer.from_pretrained(folder, device="cpu")
    return torch_feat, Featurizer.from_pretrained(folder, backend="onnx")


# ---------------------------------------------------------------------- featurizer
@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize(
    ("pooling", "n", "layer"),
    [("cls", 1000, -1), ("mean", 1000, -1), ("max", 200, -1), ("cls+max", 200, -1),
     ("max+mean", 100, -1), ("cls+mean+max", 200, (-1, -2, -3)), ("cls", 100, (0, -1))],
)  # fmt: skip
def test_featurizer_parity(featurizers, smiles, pooling, n, layer):
    torch_feat, onnx_feat = featurizers
    smiles = smiles if n == len(smiles) else smiles[: n // 2] + smiles[-n // 2 :]
    # the graph's contract, before the model's whitening (shared numpy code on both paths,
    # which scales the directions of least spread up, differences with them)
    how = dict(pooling=pooling, layer=layer, errors="nan", whiten=False)
    expected = torch_feat.featurize(smiles, **how)
    got = onnx_feat.featurize(smiles, **how)
    assert np.array_equal(np.isnan(got), np.isnan(expected))
    assert np.isnan(expected).any(axis=1).sum() < 10  # the comparison covers the set
    assert np.nanmax(np.abs(got - expected)) <= TOLERANCE


@pytest.mark.data
@pytest.mark.slow
@pytest.mark.parametrize("threads", [1, 2])
def test_onnx_outputs_do_not_depend_on_the_batch(folder, smiles, threads):
    from smiexlm.embedding.onnx_runtime import OnnxEncoder
    from smiexlm.modelio.folder import ModelFolder

    feat = Featurizer.from_pretrained(folder, backend="onnx")
    feat._onnx = OnnxEncoder.from_folder(ModelFolder(folder), threads)
    part = smiles[:40] + smiles[-40:]
    for pooling in ("cls", "mean", "max"):
        batched = feat.featurize(part, pooling=pooling, errors="nan")
        small = feat.featurize(part, pooling=pooling, errors="nan", batch_tokens=300)
        alone = [feat.featurize([s], pooling=pooling, errors="nan") for s in part[::4]]
        np.testing.assert_array_equal(small, batched)
        np.testing.assert_array_equal(np.concatenate(alone), batched[::4])


def test_cli_embed_with_the_onnx_backend_matches_torch(folder, tmp_path):
    """``smiexlm embed --backend onnx`` serves the folder's encoder.onnx: the same table as
    the torch path (ids, order, failures) within the parity tolerance; a folder of parts
    records the backend, so a resume cannot mix the two."""
    table = tmp_path / "in.csv"
    pd.DataFrame({"id": ["a", "b", "c", "d"],
                  "smiles": ["CCO", "not a smiles", "c1ccccc1O", "OCC"]}).to_csv(table, index=False)  # fmt: skip
    frames = {}
    for backend in ("torch", "onnx"):
        out = tmp_path / f"{backend}.parquet"
        done = run_smiexlm(
            # before the whitening, which scales the directions of least spread up, and
            # differences with them (see test_featurizer_parity)
            "embed", table, "--out", out, "--checkpoint", folder, "--device", "cpu",
            "--backend", backend, "--no-whiten",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "1 failed" in done.stdout
        frames[backend] = pd.read_parquet(out)
    a, b = frames["torch"], frames["onnx"]
    assert a["id"].tolist() == b["id"].tolist() == ["a", "b", "c", "d"]
    emb = [c for c in a.columns if c.startswith("e")]
    assert a[emb].iloc[1].isna().all() and b[emb].iloc[1].isna().all()
    np.testing.assert_allclose(a[emb].to_numpy(), b[emb].to_numpy(), atol=TOLERANCE, equal_nan=True)
    np.testing.assert_array_equal(b[emb].iloc[0], b[emb].iloc[3])  # normalised: one molecule

    from smiexlm.embedding.embed import embed_parts

    parts = tmp_path / "parts"
    embed_parts(table, parts, checkpoint=folder, backend="onnx", progress=False, part_rows=2)
    manifest = json.loads((parts / "manifest.json").read_text())
    assert json.dumps(manifest).count('"backend": "onnx"') >= 1


def test_in_memory_graph_of_an_mlm_model():
    """Featurizer(Pretrained(model, tokenizer), backend="onnx") exports in memory; MLM layout,
    1D RoPE."""
    from smiexlm.model.config import ExLMConfig
    from smiexlm.model.model import ExLMModel
    from smiexlm.modelio.pretrained import Pretrained
    from smiexlm.tokenizer import SmilesTokenizer

    tokenizer = SmilesTokenizer()
    torch.manual_seed(0)
    config = ExLMConfig.tiny(objective="mlm", vocab_size=tokenizer.vocab_size, n_layers=2)
    model = ExLMModel(config).eval()
    some = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "C1CCCCC1N", "O=C(O)c1ccccc1OC(C)=O"]
    expected = Featurizer(Pretrained(model, tokenizer), device="cpu").featurize(some, "mean")
    served = Featurizer(Pretrained(model, tokenizer), backend="onnx")
    assert np.abs(served.featurize(some, "mean") - expected).max() <= TOLERANCE
    both = Featurizer(Pretrained(model, tokenizer), device="cpu").featurize(some, "cls", (0, -1))
    assert np.abs(served.featurize(some, "cls", (0, -1)) - both).max() <= TOLERANCE


# the three poolings side by side cover each one's graph (``max`` and ``cls`` alone, with
# their own graphs, took a minute each and found nothing the combination does not)
@pytest.mark.parametrize(("pooling", "head"), [("cls+mean+max", "mlp"), ("cls", "linear")])
def test_predictor_graph_of_a_head_on_the_last_three_blocks(pooling, head):
    """A head reading the last three blocks (``layers=3``) of a micro ExLM model: the
    exported graph gives the torch head's logits (cls: the last block on the first two
    positions only, the blocks under it cut to match); a saved probe's linear head too."""
    from smiexlm.embedding.onnx_export import predictor_onnx
    from smiexlm.embedding.onnx_runtime import open_session
    from smiexlm.model.config import ExLMConfig
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel
    from smiexlm.tokenizer import SmilesTokenizer

    tokenizer = SmilesTokenizer()
    torch.manual_seed(0)
    config = ExLMConfig.tiny(objective="exlm", vocab_size=tokenizer.vocab_size, n_layers=3,
                             d_model=32, d_ff=64, n_heads=2, k=2)  # fmt: skip
    model = ExLMForSequencePrediction(ExLMModel(config), 2, "regression", 0.0, pooling, layers=3,
                                      head=head)  # fmt: skip
    model.eval()
    some = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "C1CCCCC1N", "O=C(O)c1ccccc1OC(C)=O"]
    enc = tokenizer.encode_batch(some)
    with torch.no_grad():
        expected = model(enc.input_ids, enc.attention_mask).logits.numpy()
    run = open_session(predictor_onnx(model), threads=1)
    (got,) = run.run(None, {"input_ids": enc.input_ids.numpy(),
                            "attention_mask": enc.attention_mask.long().numpy()})  # fmt: skip
    assert np.abs(got - expected).max() <= TOLERANCE


# ---------------------------------------------------------------------- checks
def test_graph_sha256_mismatch_is_one_line(folder, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    payload = bytearray((copy / "encoder.onnx").read_bytes())
    payload[-1] ^= 0xFF
    (copy / "encoder.onnx").write_bytes(bytes(payload))
    with pytest.raises(DataError, match="does not match the sha256 recorded in onnx.json") as err:
        Featurizer.from_pretrained(copy, backend="onnx")
    assert "\n" not in str(err.value)


def test_encoder_record(folder):
    from smiexlm.embedding.onnx_export import sha256_bytes

    record = json.loads((folder / "onnx.json").read_text())["graphs"]["encoder"]
    assert record["inputs"] == ["input_ids", "attention_mask", "cls_only"]
    assert record["outputs"] == ["poolings"]
    assert record["pooling_rows"] == {"cls": 0, "mean": 1, "max": 2}
    assert record["sha256"] == sha256_bytes((folder / "encoder.onnx").read_bytes())


def test_record_of_an_older_format_is_refused(folder, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    doc = json.loads((copy / "onnx.json").read_text())
    (copy / "onnx.json").write_text(json.dumps(doc | {"format": "smiexlm-onnx/1"}))
    with pytest.raises(
        DataError, match="'smiexlm-onnx/1': expected 'smiexlm-onnx/3'; write the graphs again"
    ):
        Featurizer.from_pretrained(copy, backend="onnx")


def test_graph_of_other_weights_is_refused(folder, tmp_path):
    from smiexlm.embedding.onnx_runtime import read_graph
    from smiexlm.modelio.folder import ModelFolder

    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    manifest = json.loads((copy / "onnx.json").read_text())
    manifest["graphs"]["encoder"]["weights_sha256"]["model.safetensors"] = "0" * 64
    (copy / "onnx.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="exported from another model.safetensors"):
        read_graph(ModelFolder(copy), "encoder")


def test_missing_graph_names_the_command(tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL_DIR, copy)
    (copy / "onnx.json").unlink(missing_ok=True)
    with pytest.raises(DataError, match="smiexlm export-onnx"):
        Featurizer.from_pretrained(copy, backend="onnx")


def test_onnx_backend_rejects_what_the_graph_cannot_do(featurizers):
    _, onnx_feat = featurizers
    with pytest.raises(ConfigError, match="layer"):
        onnx_feat.featurize(["CCO"], layer=9)
    with pytest.raises(DataError, match="token row 1"):
        onnx_feat._onnx.encode([[1, 6, 2], [1, 6, 6]])  # the second row has no EOS
    with pytest.raises(ConfigError, match="backend"):
        Featurizer.from_pretrained(DEFAULT_MODEL_DIR, backend="tensorrt")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- predict
def _finetuned(path, smiles, pooling: str, task_type: str, features: str | None, layers: int = 1):
    """A fine-tuned folder as ``finetune --save-dir`` writes it: the shipped encoder and a
    random head on its last ``layers`` blocks (the weights do not matter for parity, only
    that both backends share them)."""
    from smiexlm.finetuning.config import FinetuneConfig
    from smiexlm.finetuning.folder import save_finetuned
    from smiexlm.forests.features import FeatureScaler
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.inputs import model_texts
    from smiexlm.model.model import ExLMModel
    from smiexlm.modelio.records import DEFAULT_NORMALIZATION
    from smiexlm.tokenizer import SmilesTokenizer

    scaler = None
    if features:
        from smiexlm.chemistry.fingerprints import molecule_features
        from smiexlm.data.normalize import smiles_problem

        parsable = [s for s in smiles if smiles_problem(s) is None]
        parsable = model_texts(parsable, DEFAULT_NORMALIZATION)
        scaler = FeatureScaler.fit(molecule_features(parsable, features), features)
    torch.manual_seed(1)
    head_type = "multilabel" if task_type == "classification" else "regression"
    n_features = 0 if scaler is None else len(scaler.mean)
    model = ExLMForSequencePrediction(ExLMModel.from_pretrained(DEFAULT_MODEL_DIR), 2, head_type,
                                      0.0, pooling, n_features=n_features, layers=layers)  # type: ignore[arg-type]  # fmt: skip
    config = FinetuneConfig(pooling=pooling, features=features, layers=layers).to_dict()
    meta = dict(dataset="parity", task_type=task_type, label_cols=["a", "b"], config=config,
                seed=0, split="scaffold", target_mean=[0.5, -1.0], target_std=[2.0, 0.25],
                backbone="default_model", best_epoch=1,
                feature_scaler=None if scaler is None else scaler.to_dict())  # fmt: skip
    tokenizer = SmilesTokenizer.load(DEFAULT_MODEL_DIR / "vocab.json")
    return save_finetuned(model, tokenizer, path, meta)


@pytest.mark.data
@pytest.mark.slow
def test_predict_parity_cls_classifier_through_the_cli(smiles, tmp_path):
    from smiexlm.embedding.onnx_export import export_onnx
    from smiexlm.serving.prediction import predict

    folder = _finetuned(tmp_path / "seed0", smiles, "cls", "classification", None)
    export_onnx(folder)
    expected = predict(folder, smiles)
    pd.DataFrame({"smiles": smiles}).to_csv(tmp_path / "in.csv", index=False)
    run = run_smiexlm("predict", "--checkpoint", folder, "--input", tmp_path / "in.csv", "--out",
                      tmp_path / "out.csv", "--backend", "onnx", timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr
    got = pd.read_csv(tmp_path / "out.csv")
    assert got["valid"].tolist() == expected["valid"].tolist()
    valid = expected["valid"].to_numpy()
    assert valid.sum() > 990
    for label in ("a", "b"):
        diff = got[label].to_numpy()[valid] - expected[label].to_numpy()[valid]
        assert np.abs(diff).max() <= TOLERANCE


@pytest.mark.data
@pytest.mark.slow
def test_predict_parity_mean_regression_with_features_on_two_blocks(smiles, tmp_path):
    from smiexlm.serving.prediction import predict

    smiles = smiles[:150] + smiles[-150:]
    folder = _finetuned(tmp_path / "seed0", smiles, "mean", "regression", "ecfp4", layers=2)
    run = run_smiexlm("export-onnx", tmp_path, timeout=600)  # as --save-dir: each seed's
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(folder / "predictor.onnx")
    manifest = json.loads((folder / "onnx.json").read_text())["graphs"]["predictor"]
    assert manifest["inputs"] == ["input_ids", "attention_mask", "features"]
    assert set(manifest["weights_sha256"]) == {"model.safetensors", "head.safetensors"}
    expected = predict(folder, smiles)
    got = predict(folder, smiles, backend="onnx")
    assert got["valid"].tolist() == expected["valid"].tolist()
    values = expected[["a", "b"]].to_numpy()
    assert np.nanmax(np.abs(got[["a", "b"]].to_numpy() - values)) <= TOLERANCE
    assert np.array_equal(np.isnan(got[["a", "b"]].to_numpy()), np.isnan(values))
