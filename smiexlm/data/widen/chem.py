"""What every widening step shares: its result, the seeded generator, the product check.

A step maps one RDKit molecule to a :class:`StepResult`: the molecules it made (not yet
checked) and the reasons it could not make more. :func:`finish` turns each made molecule
into the canonical SMILES written out, or into a reason it was dropped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from smiexlm.tokenizer.smiles import DEFAULT_VOCAB_PATH, split_smiles

# Reasons :func:`finish` gives for a made molecule that is not written.
FINISH_REASONS = ("not_sanitizable", "dummy_atom_left", "unparsable_output", "untokenizable")


@dataclass
class StepResult:
    """The molecules one step made from one input, and why it made no more.

    An empty result with no failure means the step had nothing to do (no site, no
    ionisable group); ``skipped`` then says why."""

    products: list[Any] = field(default_factory=list)  # RDKit Mol, unchecked
    failures: list[str] = field(default_factory=list)  # one reason per failed attempt
    skipped: str | None = None


def step_rng(seed: int, index: int, step: str) -> random.Random:
    """The generator of ``step`` on input molecule ``index``: fixed by the seed alone, so a
    part of the input gives the same products whichever run (or resumed run) makes it."""
    return random.Random(f"smiexlm-widen/{seed}/{index}/{step}")


@lru_cache(maxsize=4)
def vocabulary_tokens(path: str = str(DEFAULT_VOCAB_PATH)) -> frozenset[str]:
    """The tokens of a vocabulary file (default: the shipped one), special tokens excluded."""
    from smiexlm.tokenizer.smiles import SmilesTokenizer

    tokenizer = SmilesTokenizer.load(path)
    return frozenset(tokenizer.tokens[len(tokenizer.special_tokens) :])


def finish(mol: Any, tokens: frozenset[str]) -> tuple[str | None, Any, str | None]:
    """``(canonical SMILES, its parsed Mol, None)`` of a made molecule, or
    ``(None, None, reason)``.

    The molecule is sanitised (a copy), must hold no dummy atom, is written as canonical
    SMILES with stereo, must parse back, and every token must be in ``tokens`` (a product
    the model would read as ``[UNK]`` teaches it nothing)."""
    from rdkit import Chem

    mol = Chem.Mol(mol)
    try:
        mol.UpdatePropertyCache(strict=False)
        Chem.SanitizeMol(mol)
    except Exception:  # RDKit raises several sanitisation errors (valence, kekulisation)
        return None, None, "not_sanitizable"
    if mol.HasSubstructMatch(_dummy()):
        return None, None, "dummy_atom_left"
    smiles = Chem.MolToSmiles(mol)
    again = Chem.MolFromSmiles(smiles)
    if again is None:
        return None, None, "unparsable_output"
    smiles = Chem.MolToSmiles(again)
    if not set(split_smiles(smiles)) <= tokens:
        return None, None, "untokenizable"
    return smiles, again, None


@lru_cache(maxsize=1)
def _dummy() -> Any:
    from rdkit import Chem

    return Chem.MolFromSmarts("[#0]")


def heavy_atoms(mol: Any) -> int:
    """Atoms heavier than hydrogen (dummy atoms not counted)."""
    return sum(atom.GetAtomicNum() > 1 for atom in mol.GetAtoms())


def sample(rng: random.Random, items: list, n: int) -> list:
    """At most ``n`` of ``items`` in a seeded random order (all of them when fewer)."""
    return rng.sample(items, min(n, len(items)))
