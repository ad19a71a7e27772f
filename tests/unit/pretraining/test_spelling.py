"""Random SMILES in pre-training and continued pre-training from a model folder.

``RandomSpellings`` against RDKit (the same molecule, another string, fixed by seed, epoch and
row), its fallbacks and refusals; a ``spelling = "random"`` MTR run that trains on other ids than
a canonical one and resumes bit for bit; ``init`` copying a folder's weights, refusing another
architecture by name, and a run started from an exported model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rdkit import Chem

from smiexlm.errors import ConfigError
from smiexlm.model.model import ExLMModel
from smiexlm.pretraining.config import TrainConfig, load_config
from smiexlm.pretraining.spelling import RandomSpellings
from smiexlm.pretraining.warm_start import load_initial_weights
from smiexlm.tokenizer import SmilesTokenizer
from smiexlm.tokenizer.text import TextTokenizer
from tests.unit.pretraining.test_mtr import MICRO, _records, _train, dataset  # noqa: F401

DRUGS = ["CC(=O)Oc1ccccc1C(=O)O", "C[C@H](N)C(=O)O", "CN1CCC[C@H]1c1cccnc1", "[NH3+]CC([O-])=O",
         "F/C=C/Cl", "c1ccc2ccccc2c1", "C"]  # fmt: skip


def _canonical(text: str) -> str:
    return Chem.MolToSmiles(Chem.MolFromSmiles(text))


def _split(tokenizer, smiles):
    return [np.asarray(tokenizer.encode(_canonical(s)), dtype=np.uint16) for s in smiles]


def test_each_epoch_writes_each_molecule_afresh_and_keeps_its_descriptors():
    tokenizer = SmilesTokenizer()
    rows = _split(tokenizer, DRUGS)
    items = [(ids, np.full(3, float(i), dtype=np.float32)) for i, ids in enumerate(rows)]
    spelled = {e: RandomSpellings(items, tokenizer, seed=1, epoch=e, max_positions=512)
               for e in range(6)}  # fmt: skip
    for i, text in enumerate(DRUGS):
        views = [spelled[e][i] for e in range(6)]
        assert all(np.array_equal(desc, items[i][1]) for _, desc in views)  # the row stays
        texts = [tokenizer.decode(ids) for ids, _ in views]
        assert {_canonical(t) for t in texts} == {_canonical(text)}  # stereo and charges kept
        assert all(ids.dtype == np.uint16 and ids[0] == 1 and ids[-1] == 2 for ids, _ in views)
    aspirin = {tokenizer.decode(spelled[e][0][0]) for e in range(6)}
    assert len(aspirin) >= 4 and _canonical(DRUGS[0]) in {_canonical(t) for t in aspirin}
    assert tokenizer.decode(spelled[0][6][0]) == "C"  # one atom: one spelling
    again = RandomSpellings(items, tokenizer, seed=1, epoch=3, max_positions=512)
    assert all(np.array_equal(again[i][0], spelled[3][i][0]) for i in (2, 0))  # in any order
    other = RandomSpellings(items, tokenizer, seed=2, epoch=3, max_positions=512)
    assert any(not np.array_equal(other[i][0], spelled[3][i][0]) for i in range(6))


def test_a_spelling_too_long_for_the_model_stays_canonical():
    tokenizer = SmilesTokenizer()
    rows = _split(tokenizer, DRUGS[:1])
    short = RandomSpellings(rows, tokenizer, seed=0, epoch=0, max_positions=len(rows[0]))
    for epoch in range(8):  # most random spellings of aspirin are longer than its canonical one
        short.epoch = epoch
        assert len(short[0]) <= len(rows[0])
    assert short.fallbacks >= 1


def test_random_spelling_is_refused_for_text_and_unknown_words():
    with pytest.raises(ConfigError, match="spelling"):
        TrainConfig(spelling="shuffled")
    with pytest.raises(ConfigError, match="init"):
        TrainConfig(init="  ")
    text = TextTokenizer.build(["a few words of text"], vocab_size=40)
    with pytest.raises(ConfigError, match="a SMILES dataset"):
        RandomSpellings([], text, seed=0, epoch=0, max_positions=64)


def test_random_spelling_trains_on_other_ids_and_resumes_bit_for_bit(dataset, tmp_path):  # noqa: F811
    steps = ["max_steps=6", "total_steps=6", "valid_every=3", "save_every=3"]
    canonical = _train(dataset, tmp_path / "canonical", "mol_tiny_mtr", *steps)
    full = _train(dataset, tmp_path / "full", "mol_tiny_mtr", *steps, 'spelling="random"')
    half = tmp_path / "half"
    _train(dataset, half, "mol_tiny_mtr", *steps, 'spelling="random"', max_steps=3)
    resumed = _train(dataset, half, "mol_tiny_mtr", *steps, 'spelling="random"', resume=True)
    a, b = full.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    random_losses = [r["loss"] for r in _records(tmp_path / "full")]
    assert random_losses == [r["loss"] for r in _records(half)]
    assert random_losses != [r["loss"] for r in _records(tmp_path / "canonical")]
    # validation reads the canonical spellings: the same molecules, another model
    assert canonical.last_valid_loss != full.last_valid_loss
    from smiexlm.pretraining.export import export_run

    export_run(tmp_path / "full", tmp_path / "model", dataset=dataset)
    card = (tmp_path / "model" / "MODEL_CARD.md").read_text()
    assert "| spelling | a fresh random SMILES of each molecule each time it comes round |" in card
    assert "| start | random weights |" in card
    changed = ["max_steps=6", "total_steps=6", "valid_every=3", "save_every=3"]  # spelling alone
    with pytest.raises(Exception, match="spelling"):  # fixed for a whole run
        _train(dataset, half, "mol_tiny_mtr", *changed, resume=True)


def test_init_copies_a_folder_and_names_what_differs(dataset, tmp_path):  # noqa: F811
    from smiexlm.pretraining.export import export_run

    steps = ["max_steps=4", "total_steps=4", "valid_every=4", "save_every=4"]
    _train(dataset, tmp_path / "first", "mol_tiny_mtr", *steps)
    folder = tmp_path / "model"
    export_run(tmp_path / "first", folder, dataset=dataset)
    source = ExLMModel.from_pretrained(folder)

    fresh = ExLMModel(source.config)
    load_initial_weights(fresh, str(folder), source.descriptor_stats)
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in fresh.state_dict().items())
    wider = ExLMModel(source.config.__class__(**{**source.config.__dict__, "d_ff": 128}))
    with pytest.raises(ConfigError, match="d_ff = 64 there, 128 here"):
        load_initial_weights(wider, str(folder))

    # a run from the folder's weights: its first loss is the trained model's, not a new one's
    second = _train(dataset, tmp_path / "second", "mol_tiny_mtr", *steps, f'init="{folder}"')
    scratch = _records(tmp_path / "first")[0]["loss"]
    warm = _records(tmp_path / "second")[0]["loss"]
    assert warm < scratch and second.step == 4
    assert f'init = "{folder}"' in (tmp_path / "second" / "config.resolved.toml").read_text()
    export_run(tmp_path / "second", tmp_path / "warm", dataset=dataset)
    card = (tmp_path / "warm" / "MODEL_CARD.md").read_text()
    assert f"| start | the weights of `{folder}` (continued pre-training) |" in card
    assert "| spelling | each molecule as the dataset stores it |" in card
    bigger = [*steps, f'init="{folder}"', "model.d_model=64"]
    with pytest.raises(ConfigError, match="d_model = 32 there, 64 here"):
        _train(dataset, tmp_path / "third", "mol_tiny_mtr", *bigger)
    assert MICRO["d_model"] == 32 and load_config("mol_tiny_mtr").init is None
