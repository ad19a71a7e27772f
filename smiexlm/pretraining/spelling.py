"""Random SMILES in pre-training: each training molecule in a fresh spelling every time it
comes round (``spelling = "random"``).

A dataset stores each molecule once, as the token ids of its canonical SMILES. With random
spelling a training item is decoded to that SMILES, written again by RDKit's random writer
(``MolToRandomSmilesVect``: a random first atom and branch order) and encoded. Its seed is
made of the run's seed, the epoch and the row, so a resumed run, any number of processes and
any number of loader workers see the same spellings. Every stored SMILES went through RDKit
when the corpus was built, so it is parsed here without sanitising: about 0.26 ms of one core
per molecule with the decoding and encoding. A descriptor row belongs to the molecule,
so it stays as it is. Validation reads the canonical spellings, so that its loss compares with
a canonical run's.

A spelling falls back to the canonical one when the vocabulary cannot write it (an unknown
token) or it is longer than the model's positions. The token budget of a micro-batch is counted
on the canonical lengths; a random spelling is often a few tokens longer (more ring-closure
digits and branches): on 5,000 MOSES molecules 5.7 % more tokens, at most 26 % more for one
molecule, so a micro-batch holds about that much more.
"""

from __future__ import annotations

import numpy as np

from smiexlm.errors import ConfigError
from smiexlm.tokenizer.special import UNK_ID


class RandomSpellings:
    """A training split whose items are written in a random SMILES of the epoch: the same
    items as ``dataset`` (ids, or ``(ids, descriptor row)``) with other ids (the epoch's
    batches are planned on the stored lengths). ``fallbacks`` counts the items kept
    canonical in this process."""

    def __init__(self, dataset, tokenizer, seed: int, epoch: int, max_positions: int):
        from smiexlm.tokenizer.smiles import SmilesTokenizer

        if not isinstance(tokenizer, SmilesTokenizer):
            raise ConfigError("spelling", "random", "a SMILES dataset (this one is text)")
        self.dataset, self.tokenizer = dataset, tokenizer
        self.seed, self.epoch, self.max_positions = seed, epoch, max_positions
        self.fallbacks = 0

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        item = self.dataset[index]
        if isinstance(item, tuple):  # (ids, descriptor row)
            return self.respell(item[0], index), *item[1:]
        return self.respell(item, index)

    def respell(self, ids: np.ndarray, index: int) -> np.ndarray:
        """The ids of a random SMILES of the molecule ``ids`` spell (the canonical ids back
        when it cannot be written)."""
        from rdkit import Chem, rdBase

        with rdBase.BlockLogs():  # RDKit wrote the stored SMILES: no sanitising needed
            mol = Chem.MolFromSmiles(self.tokenizer.decode(ids), sanitize=False)
        if mol is None or mol.GetNumAtoms() < 2:  # one atom: one spelling
            self.fallbacks += mol is None
            return ids
        mol.UpdatePropertyCache(strict=False)
        seed = hash((self.seed, self.epoch, int(index))) & 0x7FFFFFFF  # ints hash the same anywhere
        new = self.tokenizer.encode(Chem.MolToRandomSmilesVect(mol, 1, randomSeed=seed)[0])
        if len(new) > self.max_positions or UNK_ID in new:
            self.fallbacks += 1
            return ids
        return np.asarray(new, dtype=np.asarray(ids).dtype)


def training_items(data, spelling: str, seed: int, epoch: int, max_positions: int):
    """The training split as an epoch reads it: as stored, or in random spellings."""
    if spelling == "canonical":
        return data.train
    return RandomSpellings(data.train, data.tokenizer, seed, epoch, max_positions)
