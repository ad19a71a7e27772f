"""Random SMILES: the same molecule, another spelling, fixed by the seed and the molecule; the
engine trains on a drawn spelling per epoch and averages over spellings at evaluation."""

from __future__ import annotations

import numpy as np
import torch
from rdkit import Chem

from smiexlm.data.augment import random_smiles
from smiexlm.finetuning import Examples, FitRun, LoopConfig, fit, predict, predict_views
from tests.unit.finetuning.test_finetuning import SMILES, _model_and_rows

DRUGS = ["CC(=O)Oc1ccccc1C(=O)O", "C[C@H](N)C(=O)O", "CN1CCC[C@H]1c1cccnc1", "[NH3+]CC([O-])=O",
         "F/C=C/Cl", "c1ccc2ccccc2c1", "C"]  # fmt: skip


def _canonical(text: str) -> str:
    return Chem.MolToSmiles(Chem.MolFromSmiles(text))


def test_random_smiles_are_the_same_molecules_spelled_otherwise():
    spellings = random_smiles(DRUGS, 8, seed=0)
    for text, variants in zip(DRUGS, spellings, strict=True):
        assert len(variants) == 8
        assert {_canonical(v) for v in variants} == {_canonical(text)}  # stereo and charges kept
    assert len(set(spellings[0])) > 4  # aspirin has many spellings
    assert spellings[-1] == ["C"] * 8


def test_random_smiles_depend_on_the_seed_and_the_molecule_only():
    alone = random_smiles(DRUGS[:1], 5, seed=3)[0]
    assert random_smiles(DRUGS[::-1], 5, seed=3)[-1] == alone
    assert random_smiles(DRUGS[:1], 5, seed=4)[0] != alone


def test_views_and_training_with_variants():
    torch.set_num_threads(1)
    model, rows = _model_and_rows()
    variants = [[r[:1] + r[1:][::-1]] * 2 for r in rows]  # any other ids will do here
    targets = torch.tensor([[float(len(s) % 2)] for s in SMILES])
    examples = Examples(rows, targets, variants=variants)
    assert examples.n_views == 3 and examples.view(0).rows == rows
    assert examples.view(np.array([1] + [0] * (len(rows) - 1))).rows[0] == variants[0][0]
    assert examples.subset(np.array([2, 0])).variants == [variants[2], variants[0]]
    views = predict_views(model, examples)
    assert views.shape == (3, len(rows), 1)
    np.testing.assert_array_equal(views[0], predict(model, Examples(rows)))
    config = LoopConfig(epochs=2, batch_size=4, lr=1e-3, device="cpu")
    result = fit(model, examples.subset(np.arange(16)), examples.subset(np.arange(16, 24)),
                 config, lambda logits: float(logits.mean()), FitRun(0))  # fmt: skip
    assert result.epochs_run == 2 and all(np.isfinite(h["valid"]) for h in result.history)
