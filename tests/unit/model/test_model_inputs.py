"""One loader and one input path: a model folder is served, fine-tuned and probed on SMILES
prepared the way its corpus was, whatever the caller."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from smiexlm import Featurizer
from smiexlm.data.normalize import NormalizeConfig
from smiexlm.errors import DataError
from smiexlm.model.inputs import ModelInputs, normalize_inputs
from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
from smiexlm.modelio.pretrained import load_pretrained
from smiexlm.modelio.records import read_normalization
from smiexlm.tokenizer import EOS_ID, SmilesTokenizer

SALTED = ["CCO.[Na+].[Cl-]", "OCC", "c1ccccc1C(=O)O.[K+]", "OC(=O)c1ccccc1"]


@pytest.fixture
def salt_stripping_model(tmp_path):
    """The shipped model, declared as trained on salt-stripped canonical SMILES."""
    folder = tmp_path / "stripped"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    (folder / "normalization.json").write_text(json.dumps({"canonicalize": True, "strip_salts": True}))  # fmt: skip
    return folder


def test_load_pretrained_gives_model_tokenizer_normalisation_and_card():
    pre = load_pretrained()
    assert pre.is_default and not pre.model.training
    assert pre.tokenizer.vocab_size == pre.model.config.vocab_size
    assert pre.normalization.canonicalize and not pre.normalization.strip_salts
    assert pre.normalization_source.endswith("normalization.json")
    assert pre.card is not None and pre.card.startswith("# Model card")


def test_prepare_keeps_a_reason_for_every_rejected_input():
    inputs = load_pretrained().inputs()
    smiles = ["OCC", None, "", "C C", "C1CC", "C" * 9000, 3.5, "CCO"]
    prepared = inputs.prepare(smiles)
    assert prepared.texts[0] == prepared.texts[-1] == "CCO" and prepared.n_changed == 1
    assert prepared.reasons == [
        None, "missing value", "empty string", "whitespace inside the SMILES",
        "RDKit cannot parse it", "longer than 8,192 characters", "expected str, got float", None,
    ]  # fmt: skip
    assert prepared.good == [0, 7]
    assert prepared.rows[0] == prepared.rows[7] == inputs.tokenizer.encode("CCO")
    assert all(prepared.rows[i] is None for i in range(1, 7))


def test_the_length_rule_rejects_or_cuts_keeping_eos():
    tok = SmilesTokenizer.build(["CCO", "c1ccccc1CCCCCCCC"])
    from smiexlm.model.config import ExLMConfig

    config = ExLMConfig.tiny(vocab_size=tok.vocab_size, max_positions=8, objective="exlm", k=2)
    inputs = ModelInputs(tok, config, NormalizeConfig(max_length=None))
    rejected = inputs.prepare(["CCO", "c1ccccc1CCCCCCCC"], canonicalize=False)
    assert rejected.reasons[1] == "18 tokens exceed the model's 8" and rejected.n_cut == 0
    rows, cut = inputs.rows(["CCO", "c1ccccc1CCCCCCCC"], max_length=6)
    assert cut == [1] and len(rows[1]) == 6 and rows[1][-1] == EOS_ID
    assert inputs.encoder_lengths(rows) == [len(rows[0]) + 2, 8]  # BOS and EOS doubled


def test_the_featurizer_applies_the_folders_normalisation(salt_stripping_model):
    feat = Featurizer.from_pretrained(salt_stripping_model, device="cpu")
    assert feat.normalization.strip_salts
    x = feat.featurize(SALTED)
    np.testing.assert_array_equal(x[0], x[1])
    np.testing.assert_array_equal(x[2], x[3])


def test_finetuning_predict_and_featurizer_read_a_smiles_the_same_way(salt_stripping_model, tmp_path):  # fmt: skip
    """A SMILES written two ways gets one prediction, the one the head gives on the
    featurizer's embedding of it."""
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.folder import save_finetuned
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.serving.prediction import predict

    backbone = Backbone(checkpoint=salt_stripping_model)
    assert backbone.model_texts(SALTED) == ["CCO", "CCO", "O=C(O)c1ccccc1", "O=C(O)c1ccccc1"]
    tokenizer = backbone.tokenizer([])
    torch.manual_seed(0)
    model = ExLMForSequencePrediction(backbone.build(tokenizer, 0.0), 1, "regression", 0.0, "cls")
    meta = {"task_type": "regression", "n_outputs": 1, "pooling": "cls", "label_cols": ["y"],
            "target_mean": [0.0], "target_std": [1.0], "config": {}}  # fmt: skip
    folder = save_finetuned(model, tokenizer, tmp_path / "ft", meta, backbone.normalization)
    assert read_normalization(folder)[0].strip_salts  # the fine-tuned folder keeps it
    values = predict(folder, SALTED)["y"].to_numpy()
    assert values[0] == values[1] and values[2] == values[3]
    pooled = Featurizer.from_pretrained(folder, device="cpu").featurize(SALTED)
    with torch.no_grad():
        by_hand = model.eval().head(torch.from_numpy(pooled)).numpy()[:, 0]
    np.testing.assert_allclose(values, by_hand, atol=1e-5, rtol=0)


STEREO = ["C[C@H](N)C(=O)O", "C[C@@H](N)C(=O)O", "F/C=C/F", "F/C=C\\F", "[13CH3][C@@H](O)Cl"]


def test_stripping_stereo_keeps_isotopes_and_travels_with_the_folder(tmp_path):
    from smiexlm.data.normalize import normalize_smiles

    strip = NormalizeConfig(strip_stereo=True)
    assert [normalize_smiles(s, strip)[0] for s in STEREO] == [
        "CC(N)C(=O)O", "CC(N)C(=O)O", "FC=CF", "FC=CF", "[13CH3]C(O)Cl"
    ]  # fmt: skip
    as_written = NormalizeConfig(canonicalize=False, strip_stereo=True)
    assert normalize_smiles("OC(=O)[C@@H](C)N", as_written)[0] == "OC(=O)C(C)N"  # order kept
    assert normalize_smiles(STEREO[0], NormalizeConfig())[0] == STEREO[0]  # kept by default
    folder = tmp_path / "flat"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    (folder / "normalization.json").write_text(json.dumps({"strip_stereo": True}))
    feat = Featurizer.from_pretrained(folder, device="cpu")
    assert feat.normalization.strip_stereo and feat.normalization.canonicalize
    x = feat.featurize(STEREO[:4])
    np.testing.assert_array_equal(x[0], x[1])
    np.testing.assert_array_equal(x[2], x[3])
    kept = Featurizer.from_pretrained(device="cpu").featurize(STEREO[:2])
    assert not np.allclose(kept[0], kept[1])  # the shipped model reads the stereo tokens


def test_a_misspelt_normalisation_key_is_an_error_not_a_silent_default(tmp_path):
    folder = tmp_path / "typo"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    (folder / "normalization.json").write_text(json.dumps({"strip_sterEo": True}))
    with pytest.raises(DataError, match="unknown key.*'strip_sterEo'.*expected canonicalize"):
        read_normalization(folder)


def test_normalize_inputs_as_written_skips_rdkit():
    prepared = normalize_inputs(["OCC", "C1CC"], NormalizeConfig(), canonicalize=False)
    assert prepared.texts == ["OCC", "C1CC"] and prepared.n_changed == 0


def test_shipped_models_load_by_name_and_a_folder_of_that_name_wins(tmp_path, monkeypatch):
    from smiexlm.modelio.layout import model_folder, shipped_models
    from smiexlm.paths import ASSETS_DIR

    assert {"default", "exlm", "mlm", "maelm"} <= set(shipped_models())
    assert model_folder("exlm") == ASSETS_DIR / "twins" / "exlm"
    assert model_folder("default") == model_folder(None) == DEFAULT_MODEL_DIR
    assert load_pretrained("mlm").model.config.objective == "mlm"
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ASSETS_DIR / "twins" / "maelm", tmp_path / "mlm")
    assert model_folder("mlm") == Path("mlm")  # the user's folder, not the shipped MLM
    assert load_pretrained("mlm").model.config.objective == "maelm"
    with pytest.raises(DataError, match="'nope' does not exist.*shipped model.*exlm"):
        model_folder("nope")
