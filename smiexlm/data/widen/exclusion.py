"""Never an evaluation molecule in pretraining: the key and the set of MoleculeNet keys.

The key of a molecule (:func:`evaluation_key`) is the first block of the InChIKey of its
neutralised parent: counter-ions of the salts step and RDKit's list of salts and solvents
removed, the largest remaining component (organic preferred) kept, charges neutralised.
The first InChIKey block hashes the InChI main layer (formula, connections, mobile
hydrogens), so the key ignores stereo, isotopes, charge and protonation, and the tautomers
InChI treats as one. A canonical SMILES of the neutralised largest component would miss
those tautomers, and a tautomer of a test molecule is as much a leak as the molecule.
Its cost is about 1 ms a molecule; the price of a 14-letter hash is a rare false match,
which only drops a product.

:func:`exclusion_keys` builds the set from the evaluation sets it is given
(:class:`EvaluationSet`: a name, its file's sha256 and how to read its SMILES; the MoleculeNet
ones come from :func:`smiexlm.moleculenet.loaders.evaluation_sets`, so that this corpus layer
does not reach up to the evaluation layer) and caches it by the files' sha256.
"""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

KEY_VERSION = "inchikey14-neutral-parent/1"


@lru_cache(maxsize=1)
def _standardizers() -> tuple[Any, Any, Any, frozenset[str]]:
    from rdkit import Chem
    from rdkit.Chem.MolStandardize import rdMolStandardize

    from smiexlm.data.widen.charges import COUNTER_IONS

    uncharger = rdMolStandardize.Uncharger()
    ions = frozenset(
        Chem.MolToSmiles(uncharger.uncharge(Chem.MolFromSmiles(smiles)))
        for _, smiles, _, _ in COUNTER_IONS
    )
    remover = rdMolStandardize.FragmentRemover()
    chooser = rdMolStandardize.LargestFragmentChooser(preferOrganic=True)
    return uncharger, remover, chooser, ions


def parent(mol: Any) -> Any:
    """The neutralised parent of ``mol`` (see the module doc)."""
    from rdkit import Chem

    uncharger, remover, chooser, ions = _standardizers()
    if len(Chem.GetMolFrags(mol)) == 1:
        return uncharger.uncharge(mol)
    parts = [uncharger.uncharge(p) for p in Chem.GetMolFrags(mol, asMols=True)]
    kept = [p for p in parts if Chem.MolToSmiles(p) not in ions] or parts
    joined = kept[0]
    for part in kept[1:]:
        joined = Chem.CombineMols(joined, part)
    if len(kept) > 1:
        joined = remover.remove(joined) if joined.GetNumAtoms() else joined
        joined = chooser.choose(joined)
    return uncharger.uncharge(joined)


def evaluation_key(mol: Any) -> str | None:
    """The stereo-, charge- and salt-insensitive key of ``mol``; None when InChI fails."""
    from rdkit import Chem

    try:
        key = Chem.MolToInchiKey(parent(mol))
    except Exception:  # InChI rejects some exotic valences
        return None
    return key[:14] if key else None


@dataclass(frozen=True)
class EvaluationSet:
    """One evaluation table whose molecules pretraining never holds."""

    name: str
    sha256: str  # of its file: the cached keys are named by every set's
    smiles: Callable[[], Sequence[str]]  # read only when the keys are not cached


def exclusion_keys(sets: Sequence[EvaluationSet], progress: bool = False) -> frozenset[str]:
    """The keys of every molecule of ``sets`` (cached by their names and sha256)."""
    from smiexlm.paths import cache_dir, keep_in_cache

    cached = cache_dir() / "widen" / f"exclusion-{_sets_key(sets)}.txt.gz"
    if cached.is_file():
        return frozenset(gzip.decompress(cached.read_bytes()).decode().split())
    keys = _compute_keys(sets, progress)
    text = "\n".join(sorted(keys)) + "\n"
    keep_in_cache(cached, lambda tmp: tmp.write_bytes(gzip.compress(text.encode(), mtime=0)))
    return frozenset(keys)


def _sets_key(sets: Sequence[EvaluationSet]) -> str:
    """16 hex digits naming the key version and every set's name and sha256."""
    digest = hashlib.sha256(KEY_VERSION.encode())
    for s in sets:
        digest.update(f"{s.name}:{s.sha256}\n".encode())
    return digest.hexdigest()[:16]


def _compute_keys(sets: Sequence[EvaluationSet], progress: bool) -> set[str]:
    from rdkit import Chem, RDLogger
    from tqdm import tqdm

    RDLogger.DisableLog("rdApp.*")
    keys: set[str] = set()
    for one in sets:
        for smiles in tqdm(one.smiles(), desc=f"exclusion keys: {one.name}", disable=not progress):
            mol = Chem.MolFromSmiles(smiles)
            key = evaluation_key(mol) if mol is not None else None
            if key is not None:
                keys.add(key)
    return keys
