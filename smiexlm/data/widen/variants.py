"""Other ways of writing the same compound: tautomers and stereoisomers.

Tautomers come from RDKit's ``TautomerEnumerator`` (at most ``max_tautomers`` enumerated, of
which a seeded sample is kept); stereoisomers from ``EnumerateStereoisomers``, assigning only
the centres and double bonds the input leaves open (a seeded random sample of at most
``max_isomers``; no 3D embedding check). The input itself is never among the products.
"""

from __future__ import annotations

import random
from typing import Any

from smiexlm.data.widen.chem import StepResult, sample


def tautomer_step(mol: Any, rng: random.Random, n: int, max_tautomers: int = 8) -> StepResult:
    """Up to ``n`` tautomers of ``mol`` other than itself."""
    from rdkit import Chem
    from rdkit.Chem.MolStandardize import rdMolStandardize

    enumerator = rdMolStandardize.TautomerEnumerator()
    enumerator.SetMaxTautomers(max_tautomers)
    enumerator.SetMaxTransforms(4 * max_tautomers)  # bounds the work on large molecules
    enumerator.SetRemoveBondStereo(False)
    enumerator.SetRemoveSp3Stereo(False)
    try:
        found = enumerator.Enumerate(mol)
    except Exception:  # RDKit raises on some unusual valence states
        return StepResult(failures=["enumeration_error"])
    own = Chem.MolToSmiles(mol)
    others = sorted(s for s in found.smiles if s != own)
    if not others:
        return StepResult(skipped="no_tautomer")
    return StepResult(products=[Chem.MolFromSmiles(s) for s in sample(rng, others, n)])


def stereo_step(mol: Any, rng: random.Random, n: int, max_isomers: int = 32) -> StepResult:
    """Up to ``n`` stereoisomers of ``mol`` with its unassigned stereo elements set."""
    from rdkit import Chem
    from rdkit.Chem.EnumerateStereoisomers import (
        EnumerateStereoisomers,
        StereoEnumerationOptions,
    )

    options = StereoEnumerationOptions(
        onlyUnassigned=True,
        maxIsomers=max_isomers,
        unique=True,
        tryEmbedding=False,
        rand=rng.getrandbits(31),
    )
    own = Chem.MolToSmiles(mol)
    isomers = {Chem.MolToSmiles(m) for m in EnumerateStereoisomers(mol, options=options)}
    isomers.discard(own)
    if not isomers:
        return StepResult(skipped="no_stereo_element")
    return StepResult(products=[Chem.MolFromSmiles(s) for s in sample(rng, sorted(isomers), n)])
