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

:func:`exclusion_keys` builds the set from every MoleculeNet file under
``SMIEXLM_DATA/moleculenet/`` (read by the project's loaders; a file the registry does not
know is an error, not skipped) and caches it by the files' sha256.
"""

from __future__ import annotations

import gzip
import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from smiexlm.errors import DataError

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


def moleculenet_files() -> list[tuple[str, Path]]:
    """``(dataset name, file)`` of every MoleculeNet file under SMIEXLM_DATA; DataError for
    a file there that no registry entry names."""
    from smiexlm.moleculenet.registry import DATASETS
    from smiexlm.paths import data_dir

    folder = data_dir() / "moleculenet"
    if not folder.is_dir():
        raise DataError(f"{str(folder)!r} does not exist: expected the MoleculeNet folder")
    known = {spec.filename: name for name, spec in DATASETS.items()}
    found = sorted(p for p in folder.iterdir() if p.is_file() and ".csv" in p.name)
    unknown = [p.name for p in found if p.name not in known]
    if unknown:
        raise DataError(
            f"MoleculeNet folder {str(folder)!r} holds {unknown!r}: expected only files the "
            "registry names, so that every evaluation molecule is excluded"
        )
    return [(known[p.name], p) for p in found]


def exclusion_keys(progress: bool = False) -> frozenset[str]:
    """The keys of every molecule of every MoleculeNet file (cached by the files' sha256)."""
    from smiexlm.paths import cache_dir, keep_in_cache

    files = moleculenet_files()
    cached = cache_dir() / "widen" / f"exclusion-{_files_key(files)}.txt.gz"
    if cached.is_file():
        return frozenset(gzip.decompress(cached.read_bytes()).decode().split())
    keys = _compute_keys([name for name, _ in files], progress)
    text = "\n".join(sorted(keys)) + "\n"
    keep_in_cache(cached, lambda tmp: tmp.write_bytes(gzip.compress(text.encode(), mtime=0)))
    return frozenset(keys)


def _files_key(files: list[tuple[str, Path]]) -> str:
    """16 hex digits naming the key version and every file's name and sha256."""
    from smiexlm.paths import file_sha256

    digest = hashlib.sha256(KEY_VERSION.encode())
    for name, path in files:
        digest.update(f"{name}:{file_sha256(path)}\n".encode())
    return digest.hexdigest()[:16]


def _compute_keys(names: list[str], progress: bool) -> set[str]:
    from rdkit import Chem, RDLogger
    from tqdm import tqdm

    from smiexlm.moleculenet.loaders import load_task

    RDLogger.DisableLog("rdApp.*")
    keys: set[str] = set()
    for name in names:
        task = load_task(name, allow_download=False)
        for smiles in tqdm(task.smiles, desc=f"exclusion keys: {name}", disable=not progress):
            mol = Chem.MolFromSmiles(smiles)
            key = evaluation_key(mol) if mol is not None else None
            if key is not None:
                keys.add(key)
    return keys
