"""Mordred's 2D descriptors as MTR targets: values against RDKit's own where the two libraries
compute the same quantity, NaN rows, the missing extra in one line, and a dataset built with
``--descriptors mordred`` pretrained, exported and read back."""

from __future__ import annotations

import gzip
import itertools
import sys

import numpy as np
import pytest
import torch

from smiexlm.chemistry import mordred2d
from smiexlm.chemistry.descriptor_stats import DescriptorStats
from smiexlm.chemistry.fingerprints import compute_descriptors, descriptor_names
from smiexlm.data.descriptors import DescriptorTable
from smiexlm.data.pipeline import PreprocessConfig, preprocess
from smiexlm.data.shards import read_manifest
from smiexlm.errors import ConfigError
from smiexlm.model.model import ExLMModel
from smiexlm.pretraining.config import load_config
from smiexlm.tokenizer import SmilesTokenizer
from tests.conftest import require_file
from tests.unit.pretraining.test_training_support import FAST, MICRO_MODEL

SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "C1CCC2(CC1)OCCO2", "O=C(O)c1ccccc1Cl"]


def test_values_agree_with_rdkits_where_both_compute_the_same_quantity():
    from rdkit import Chem
    from rdkit.Chem import Crippen, Descriptors, rdMolDescriptors

    values = compute_descriptors(SMILES, "mordred").astype(np.float64)
    names = descriptor_names("mordred")
    assert values.shape == (len(SMILES), len(names)) and len(names) > 1500
    column = {name: values[:, j] for j, name in enumerate(names)}
    mols = [Chem.MolFromSmiles(s) for s in SMILES]
    references = {
        "SLogP": [Crippen.MolLogP(m) for m in mols],
        "MW": [Descriptors.ExactMolWt(m) for m in mols],
        "nHeavyAtom": [m.GetNumHeavyAtoms() for m in mols],
        "nRing": [rdMolDescriptors.CalcNumRings(m) for m in mols],
        "nHBDon": [rdMolDescriptors.CalcNumHBD(m) for m in mols],
        "TopoPSA(NO)": [rdMolDescriptors.CalcTPSA(m) for m in mols],
    }
    for name, reference in references.items():
        np.testing.assert_allclose(column[name], reference, rtol=1e-5, err_msg=name)


def test_an_unparsable_smiles_is_a_row_of_nan_and_a_missing_value_is_nan():
    values = compute_descriptors(["CCO", "C1CC", "[He]"], "mordred")
    assert values.dtype == np.float32
    assert np.isnan(values[1]).all() and not np.isnan(values[0]).all()
    assert np.isnan(values[2]).any()  # a lone atom: Mordred's Missing/Error results
    assert np.isfinite(values[~np.isnan(values)]).all()


def test_without_the_extra_the_kind_names_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "mordred", None)  # import mordred raises ImportError
    mordred2d._calculator.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"'mordred'.*pip install 'smiexlm\[mordred\]'"):
            compute_descriptors(["CCO"], "mordred")
    finally:
        mordred2d._calculator.cache_clear()


def test_a_mordred_dataset_pretrains_exports_and_predicts_its_descriptors(shared_data, tmp_path):
    from smiexlm.pretraining.export import export_run
    from smiexlm.pretraining.trainer import pretrain

    source = require_file(shared_data, "pretrain/moses_test.smi.gz")
    with gzip.open(source, "rt") as handle:
        smiles = [line.strip() for line in itertools.islice(handle, 60)]
    raw = tmp_path / "mols.smi"
    raw.write_text("\n".join(smiles) + "\n")
    vocab = SmilesTokenizer.build(smiles).save(tmp_path / "vocab.json")
    config = PreprocessConfig(valid_fraction=0.1, descriptors="mordred")
    preprocess([raw], tmp_path / "ds", config, vocab=vocab, progress=False)

    stats = DescriptorStats.load(tmp_path / "ds" / "descriptors.json")
    assert stats.kind == "mordred" and stats.names == descriptor_names("mordred")
    assert stats.version.startswith("mordred: mordredcommunity ")
    table = DescriptorTable(tmp_path / "ds", "train", read_manifest(tmp_path / "ds"))
    assert table[0].shape == (len(stats.names),) and np.isfinite(table[0]).mean() > 0.5

    steps = ["max_steps=4", "total_steps=4", "valid_every=4", "save_every=4"]
    run = tmp_path / "run"
    train = load_config("mol_tiny_mtr", [*MICRO_MODEL, *FAST, 'precision="fp32"', *steps])
    pretrain(train, tmp_path / "ds", run)
    export_run(run, tmp_path / "model", dataset=tmp_path / "ds")
    model = ExLMModel.from_pretrained(tmp_path / "model")
    assert model.config.n_descriptors == len(stats.names)
    card = (tmp_path / "model" / "MODEL_CARD.md").read_text()
    assert f"of {len(stats.names):,} mordred descriptors" in card
    tokenizer = SmilesTokenizer.load(tmp_path / "model" / "vocab.json")
    batch = tokenizer.encode_batch(["CCO", "c1ccccc1O"])
    values = model.predict_descriptors(batch.input_ids, batch.attention_mask)
    assert values.shape == (2, len(stats.names)) and torch.isfinite(values).all()
