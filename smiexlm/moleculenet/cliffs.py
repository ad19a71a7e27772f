"""Activity cliffs: near-identical molecules whose values differ more than tenfold.

A pair of molecules forms a cliff when they are similar by any one of three measures and their
values differ by more than ``gap`` (1 log unit by default: tenfold in a pKi or pIC50), the
definition of MoleculeACE (van Tilborg, Alenicheva and Grisoni, 2022):

- ``ecfp4``: the Tanimoto similarity of their ECFP4 bits (radius 2, 2,048 bits);
- ``scaffold``: the Tanimoto similarity of the ECFP4 bits of their generic Murcko scaffolds
  (every atom carbon, every bond single: the same core with other substituents);
- ``smiles``: their canonical SMILES' edit similarity, 1 - Levenshtein distance / the longer
  length (one substituent moved or swapped);

each at least ``similarity`` (0.9). The scaffold measure sees every molecule of one ring as
the same core (the generic scaffold of a benzene and of a cyclopropane ester is a bare ring,
whose ECFP4 bits do not tell its size), so on a table of small one-ring molecules it pairs
most of them; ``measures`` leaves it out where a chemist would rather not (the shipped
reports keep MoleculeACE's three). A *cliff molecule* is one that belongs to such a pair
with any molecule of the table; the RMSE over the test molecules that are cliff molecules
(:func:`cliff_rmse`) is where a model that only interpolates between neighbours fails, and
what a chemist most needs predicted right. The measures are computed over the whole table,
so a test molecule counts when its cliff partner sits in the training rows too.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from smiexlm.chemistry.fingerprints import bit_tanimoto
from smiexlm.errors import ConfigError, DataError

SIMILARITY = 0.9  # the least similarity by one of the measures
GAP = 1.0  # log units: tenfold
MEASURES = ("ecfp4", "scaffold", "smiles")


def _bits(mols: list, scaffold: bool) -> np.ndarray:
    """ECFP4 bits of each molecule, or of its generic Murcko scaffold (``scaffold``); zeros
    where there is none (a SMILES RDKit cannot parse, a scaffold of a molecule without a
    ring), which is similar to nothing."""
    from rdkit.Chem.Scaffolds import MurckoScaffold

    from smiexlm.chemistry.fingerprints import morgan_generator

    generator = morgan_generator()
    out = np.zeros((len(mols), 2048), dtype=np.uint8)
    for i, mol in enumerate(mols):
        if mol is not None and scaffold:
            mol = MurckoScaffold.MakeScaffoldGeneric(MurckoScaffold.GetScaffoldForMol(mol))
        if mol is not None and mol.GetNumAtoms():
            out[i] = generator.GetFingerprintAsNumPy(mol)
    return out


def similarities(smiles: Sequence[str]) -> dict[str, np.ndarray]:
    """The three (N, N) similarity matrices of the module docstring. A SMILES that
    RDKit cannot parse is similar to no other molecule."""
    from rapidfuzz.distance import Levenshtein
    from rapidfuzz.process import cdist
    from rdkit import Chem

    from smiexlm.chemistry.fingerprints import _parse

    mols = [_parse(str(s).strip()) for s in smiles]
    canonical = [Chem.MolToSmiles(m) if m is not None else "" for m in mols]
    edit = cdist(canonical, canonical, scorer=Levenshtein.normalized_similarity,
                 dtype=np.float32, workers=1)  # fmt: skip
    parsed = np.array([m is not None for m in mols])
    edit = np.where(parsed[:, None] & parsed[None, :], edit, 0.0).astype(np.float32)
    ecfp4, scaffold = _bits(mols, False), _bits(mols, True)
    return {"ecfp4": bit_tanimoto(ecfp4, ecfp4), "scaffold": bit_tanimoto(scaffold, scaffold),
            "smiles": edit}  # fmt: skip


def _near(smiles: Sequence[str], similarity: float,
          measures: Sequence[str] = MEASURES) -> tuple[np.ndarray, dict[str, np.ndarray]]:  # fmt: skip
    """(N, N) bool: the pairs similar by any of ``measures`` (never a molecule with itself),
    and every measure."""
    sims = similarities(smiles)
    near = np.zeros((len(smiles), len(smiles)), dtype=bool)
    for name in measures:
        near |= sims[name] >= similarity
    np.fill_diagonal(near, False)
    return near, sims


def _check(similarity: float, gap: float, measures: Sequence[str] = MEASURES) -> None:
    if isinstance(measures, str) or not measures or not set(measures) <= set(MEASURES):
        raise ConfigError("measures", measures, f"some of {', '.join(MEASURES)}")
    if not isinstance(similarity, (int, float)) or not 0 < similarity <= 1:
        raise ConfigError("similarity", similarity, "a finite number in (0, 1]")
    if not isinstance(gap, (int, float)) or not 0 < gap < np.inf:
        raise ConfigError("gap", gap, "a positive number of the values' units (1: tenfold "
                          "in a log unit)")  # fmt: skip


def cliff_pairs(
    smiles: Sequence[str], values: Sequence[float], similarity: float = SIMILARITY,
    gap: float = GAP, measures: Sequence[str] = MEASURES,
) -> pd.DataFrame:  # fmt: skip
    """Every cliff of the table (see the module docstring) by ``measures``, one row a pair
    ``i < j``: their row numbers, SMILES and values, the gap between the values, each
    measure's similarity, ``by`` (the measures that reach ``similarity``) and
    ``same_molecule`` (one molecule measured twice: its canonical SMILES twice); largest gap
    first. Rows whose value is NaN take part in no pair."""
    _check(similarity, gap, measures)
    y = np.asarray(values, dtype=np.float64)
    if y.ndim != 1 or len(y) != len(smiles):
        raise DataError(f"values: {y.shape} for {len(smiles)} SMILES; expected one value each")
    near, sims = _near(smiles, similarity, measures)
    with np.errstate(over="ignore"):  # a gap past the float range (1e308 and -1e308) is inf
        apart = np.abs(y[:, None] - y[None, :]) > gap  # NaN compares False: never a pair
        i, j = np.nonzero(np.triu(near & apart, k=1))
        gaps = np.abs(y[i] - y[j])
        gaps = np.where(gaps < 1e290, np.round(gaps, 9), gaps)  # 10.21, not 10.2099999999999
    pairs = pd.DataFrame({
        "i": i, "j": j, "smiles_i": np.asarray(smiles, dtype=object)[i],
        "smiles_j": np.asarray(smiles, dtype=object)[j], "value_i": y[i], "value_j": y[j],
        "gap": gaps, **{name: np.round(sims[name][i, j], 4) for name in MEASURES},
    })  # fmt: skip
    reached = {name: sims[name][i, j] >= similarity for name in measures}
    pairs["by"] = ["+".join(m for m in measures if reached[m][k]) for k in range(len(i))]
    pairs["same_molecule"] = sims["smiles"][i, j] == 1.0
    return pairs.sort_values(["gap", "i", "j"], ascending=[False, True, True], ignore_index=True)


def cliff_molecules(
    smiles: Sequence[str], values: np.ndarray, similarity: float = SIMILARITY, gap: float = GAP
) -> np.ndarray:
    """(N, T) bool: whether each molecule is a cliff molecule of each label column of
    ``values`` ((N,) or (N, T); NaN = missing), the similarities computed once."""
    _check(similarity, gap)
    y = np.asarray(values, dtype=np.float64)
    y = y[:, None] if y.ndim == 1 else y
    near, _ = _near(smiles, similarity)
    out = np.zeros(y.shape, dtype=bool)
    for t in range(y.shape[1]):
        with np.errstate(over="ignore"):  # a gap past the float range is inf, a cliff
            apart = np.abs(y[:, t, None] - y[None, :, t]) > gap
        out[:, t] = (near & apart).any(axis=1)
    return out


def cliff_rmse(y_true: np.ndarray, y_pred: np.ndarray, cliffs: np.ndarray) -> tuple[float, int]:
    """The RMSE over the molecules ``cliffs`` marks ((N, T) bool, labelled entries only),
    the mean over label columns that have any, and how many (molecule, label) entries it
    covers; (NaN, 0) where none is a cliff molecule (or there is no molecule)."""
    if len(cliffs) == 0:
        return float("nan"), 0
    y = np.asarray(y_true, dtype=np.float64).reshape(len(cliffs), -1)
    p = np.asarray(y_pred, dtype=np.float64).reshape(len(cliffs), -1)
    per, count = [], 0
    for t in range(y.shape[1]):
        keep = cliffs[:, t] & ~np.isnan(y[:, t])
        if keep.any():
            per.append(float(np.sqrt(np.mean((y[keep, t] - p[keep, t]) ** 2))))
            count += int(keep.sum())
    return (float(np.mean(per)) if per else float("nan")), count


_KNOWN: dict[tuple, np.ndarray] = {}  # (table sha256, N, similarity, gap) -> cliff molecules


def task_cliffs(task, similarity: float = SIMILARITY, gap: float = GAP) -> np.ndarray:
    """:func:`cliff_molecules` of a :class:`~smiexlm.moleculenet.task.MoleculeTask`'s SMILES
    and labels, computed once per table in a process (each seed of a run reads it)."""
    key = (task.sha256, len(task.smiles), similarity, gap)
    if task.sha256 is None or key not in _KNOWN:
        found = cliff_molecules(task.smiles, task.labels, similarity, gap)
        if task.sha256 is None:
            return found
        _KNOWN[key] = found
    return _KNOWN[key]
