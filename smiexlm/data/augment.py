"""Random SMILES: other spellings of the same molecule, for augmentation and test-time means.

A molecule has many valid SMILES; the canonical one is a single choice among them. A random
SMILES numbers the atoms in a random order and writes the molecule from that order
(``Chem.RenumberAtoms`` then ``MolToSmiles(canonical=False)``): the same graph, stereo and
charges, another string. The order comes from a NumPy generator seeded by ``seed`` and the
SMILES itself, so a molecule gets the same spellings alone or in any list, in any order
(RDKit's own ``doRandom`` draws from a global generator a caller cannot own).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def random_smiles(smiles: Sequence[str], n: int, seed: int) -> list[list[str]]:
    """``n`` random spellings of each SMILES (each must parse: the caller's inputs are
    normalised already); a one-atom molecule has one spelling, repeated."""
    from rdkit import Chem, rdBase

    from smiexlm.data.normalize import smiles_hashes

    out: list[list[str]] = []
    with rdBase.BlockLogs():
        for text, key in zip(smiles, smiles_hashes(list(smiles)), strict=True):
            rng = np.random.default_rng([int(seed), int(key)])
            mol = Chem.MolFromSmiles(text)
            if mol is None:
                raise ValueError(f"random_smiles: RDKit cannot parse {text!r}")
            atoms = mol.GetNumAtoms()
            spellings = []
            for _ in range(n):
                order = rng.permutation(atoms).tolist()
                spellings.append(Chem.MolToSmiles(Chem.RenumberAtoms(mol, order), canonical=False))
            out.append(spellings)
    return out
