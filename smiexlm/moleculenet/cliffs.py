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

from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd

from smiexlm.chemistry.fingerprints import bit_tanimoto
from smiexlm.errors import ConfigError, DataError

SIMILARITY = 0.9  # the least similarity by one of the measures
GAP = 1.0  # log units: tenfold
MEASURES = ("ecfp4", "scaffold", "smiles")
#: rows compared with the whole table at a time: 256 x N values a measure, so that a table of
#: 50,000 molecules needs some 100 MB, never its N x N matrices (20 GB each)
BLOCK = 256


def _bits(mols: list, scaffold: bool) -> np.ndarray:
    """ECFP4 bits of each molecule, or of its generic Murcko scaffold (``scaffold``); zeros
    where there is none (a SMILES RDKit cannot parse, a scaffold of a molecule without a
    ring, or one RDKit cannot make generic, such as a spirophosphorane's), which is similar
    to nothing."""
    from rdkit.Chem.Scaffolds import MurckoScaffold

    from smiexlm.chemistry.fingerprints import morgan_generator

    generator = morgan_generator()
    out = np.zeros((len(mols), 2048), dtype=np.uint8)
    for i, mol in enumerate(mols):
        if mol is not None and scaffold:
            try:
                mol = MurckoScaffold.MakeScaffoldGeneric(MurckoScaffold.GetScaffoldForMol(mol))
            except (ValueError, RuntimeError):  # RDKit's valence and sanitisation errors
                mol = None
        if mol is not None and mol.GetNumAtoms():
            out[i] = generator.GetFingerprintAsNumPy(mol)
    return out


class Similarities:
    """The three measures of the module docstring for a table, computed a block of rows at a
    time against all of it (:meth:`rows`): what they read is made once, the canonical
    SMILES and the two kinds of bits. A SMILES RDKit cannot parse is similar to nothing."""

    def __init__(self, smiles: Sequence[str]):
        from rdkit import Chem

        from smiexlm.chemistry.fingerprints import _parse

        mols = [_parse(str(s).strip()) for s in smiles]
        self.canonical = [Chem.MolToSmiles(m) if m is not None else "" for m in mols]
        self.parsed = np.array([m is not None for m in mols], dtype=bool)
        self.ecfp4, self.scaffold = _bits(mols, False), _bits(mols, True)

    def __len__(self) -> int:
        return len(self.canonical)

    def rows(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Each measure's (len(rows), N) similarities of ``rows`` to every molecule."""
        from rapidfuzz.distance import Levenshtein
        from rapidfuzz.process import cdist

        edit = cdist([self.canonical[r] for r in rows], self.canonical,
                     scorer=Levenshtein.normalized_similarity, dtype=np.float32, workers=1)  # fmt: skip
        edit = np.where(self.parsed[rows, None] & self.parsed[None, :], edit, 0.0)
        return {"ecfp4": bit_tanimoto(self.ecfp4[rows], self.ecfp4),
                "scaffold": bit_tanimoto(self.scaffold[rows], self.scaffold),
                "smiles": edit.astype(np.float32)}  # fmt: skip

    def near(self, similarity: float, measures: Sequence[str] = MEASURES,
             rows: np.ndarray | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, dict]]:  # fmt: skip
        """For each block of ``rows`` (all by default): the rows, (len, N) bool of the pairs
        similar by any of ``measures`` (never a molecule with itself) and every measure."""
        rows = np.arange(len(self)) if rows is None else np.asarray(rows, dtype=np.int64)
        for start in range(0, len(rows), BLOCK):
            block = rows[start : start + BLOCK]
            sims = self.rows(block)
            near = np.zeros((len(block), len(self)), dtype=bool)
            for name in measures:
                near |= sims[name] >= similarity
            near[np.arange(len(block)), block] = False
            yield block, near, sims


def apart(a: np.ndarray, b: np.ndarray, gap: float) -> np.ndarray:
    """Whether values differ by more than ``gap``, decided on the difference rounded to 9
    decimals (8.3 - 7.3 is 1.0000000000000009 in floating point, and no cliff at a gap of 1);
    NaN is never apart, a difference past the float range (inf) always."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.round(np.abs(a - b), 9) > gap


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
    found: list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]] = []
    for block, near, sims in Similarities(smiles).near(similarity, measures):
        hit = near & apart(y[block, None], y[None, :], gap)
        hit &= np.arange(len(y))[None, :] > block[:, None]  # each pair once, i < j
        r, j = np.nonzero(hit)
        found.append((block[r], j, {name: sims[name][r, j] for name in MEASURES}))
    i = np.concatenate([f[0] for f in found]) if found else np.zeros(0, dtype=np.int64)
    j = np.concatenate([f[1] for f in found]) if found else np.zeros(0, dtype=np.int64)
    sim = {name: np.concatenate([f[2][name] for f in found]) if found else np.zeros(0)
           for name in MEASURES}  # fmt: skip
    with np.errstate(over="ignore"):  # a gap past the float range (1e308 and -1e308) is inf
        gaps = np.abs(y[i] - y[j])
        gaps = np.where(gaps < 1e290, np.round(gaps, 9), gaps)  # 10.21, not 10.2099999999999
    pairs = pd.DataFrame({
        "i": i, "j": j, "smiles_i": np.asarray(smiles, dtype=object)[i],
        "smiles_j": np.asarray(smiles, dtype=object)[j], "value_i": y[i], "value_j": y[j],
        "gap": gaps, **{name: np.round(sim[name], 4) for name in MEASURES},
    })  # fmt: skip
    reached = {name: sim[name] >= similarity for name in measures}
    pairs["by"] = ["+".join(m for m in measures if reached[m][k]) for k in range(len(i))]
    pairs["same_molecule"] = sim["smiles"] == 1.0
    return pairs.sort_values(["gap", "i", "j"], ascending=[False, True, True], ignore_index=True)


def cliff_molecules(
    smiles: Sequence[str], values: np.ndarray, similarity: float = SIMILARITY,
    gap: float = GAP, rows: np.ndarray | None = None,
) -> np.ndarray:  # fmt: skip
    """(len(rows), T) bool (``rows``: all by default): whether each of ``rows`` is a cliff
    molecule, with any molecule of the table, of each label column of ``values`` ((N,) or
    (N, T); NaN = missing)."""
    _check(similarity, gap)
    y = np.asarray(values, dtype=np.float64)
    y = y[:, None] if y.ndim == 1 else y
    parts = []
    for block, near, _ in Similarities(smiles).near(similarity, rows=rows):
        parts.append(np.stack([(near & apart(y[block, t, None], y[None, :, t], gap)).any(axis=1)
                               for t in range(y.shape[1])], axis=1))  # fmt: skip
    return np.concatenate(parts) if parts else np.zeros((0, y.shape[1]), dtype=bool)


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


_KNOWN: dict[tuple, np.ndarray] = {}  # (table sha256, N, rows, similarity, gap) -> molecules


def task_cliffs(task, rows: np.ndarray | None = None, similarity: float = SIMILARITY,
                gap: float = GAP) -> np.ndarray:  # fmt: skip
    """:func:`cliff_molecules` of ``rows`` (all by default: a split's test rows, say) of a
    :class:`~smiexlm.moleculenet.task.MoleculeTask`'s SMILES and labels, computed once per
    table in a process (each seed of a run reads it)."""
    import hashlib

    picked = None if rows is None else np.asarray(rows, dtype=np.int64)
    which = None if picked is None else hashlib.sha256(picked.tobytes()).hexdigest()
    key = (task.sha256, len(task.smiles), which, similarity, gap)
    if task.sha256 is None or key not in _KNOWN:
        found = cliff_molecules(task.smiles, task.labels, similarity, gap, picked)
        if task.sha256 is None:
            return found
        _KNOWN[key] = found
    return _KNOWN[key]
