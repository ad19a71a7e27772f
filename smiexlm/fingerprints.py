"""Classical molecule features: Morgan bit fingerprints (ECFP4) and RDKit 2D descriptors.

The one place the package computes them: the RF baseline, the hybrid fine-tuning features
(``--features ecfp4|rdkit2d|both``), the descriptor targets of pretraining datasets
(``preprocess --descriptors rdkit2d``, :func:`compute_descriptors`) and the demo's Tanimoto
neighbours all call these functions. How the values are scaled lives with their users:
:mod:`smiexlm.descriptor_stats` for pretraining targets, :mod:`smiexlm.moleculenet.features`
for the hybrid heads. RDKit is imported inside the functions so that importing this module
stays cheap.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Sequence
from typing import Literal

import numpy as np

from smiexlm.errors import ConfigError, InvalidSmilesError

log = logging.getLogger(__name__)

FeatureKind = Literal["ecfp4", "rdkit2d", "both"]  # both: the bits, then the descriptors
FEATURE_KINDS: tuple[str, ...] = ("ecfp4", "rdkit2d", "both")
DESCRIPTOR_KINDS: tuple[str, ...] = ("rdkit2d",)  # what a pretraining dataset can carry
# Descriptor values beyond ±this are NaN: Ipc reaches 1e40 (BBBP) to 1e227 (a long chain),
# past float32 and past what a mean and a standard deviation can be computed over.
DESCRIPTOR_LIMIT = 1e15


def _parse(smiles: str):
    """The RDKit molecule of ``smiles``, or None (RDKit's own messages silenced)."""
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    return Chem.MolFromSmiles(smiles)


def _mols(smiles: Sequence[str]) -> list:
    mols = []
    for s in smiles:
        mol = _parse(s)
        if mol is None:
            raise InvalidSmilesError(s, reason="RDKit cannot parse it")
        mols.append(mol)
    return mols


def morgan_generator(radius: int = 2, n_bits: int = 2048):
    """RDKit's Morgan generator (radius 2, 2048 bits = ECFP4)."""
    from rdkit.Chem import rdFingerprintGenerator

    return rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=n_bits)


def morgan_fingerprints(smiles: Sequence[str], radius: int = 2, n_bits: int = 2048) -> np.ndarray:
    """(N, n_bits) uint8 bit vectors; raises InvalidSmilesError for an unparsable SMILES."""
    generator = morgan_generator(radius, n_bits)
    out = np.zeros((len(smiles), n_bits), dtype=np.uint8)
    for i, mol in enumerate(_mols(smiles)):
        out[i] = generator.GetFingerprintAsNumPy(mol)
    return out


def _rdkit2d_functions() -> list:
    """``Descriptors.descList``'s functions, in its order. Its four EState
    extremes each recompute the molecule's EState indices; the first caches them on the
    molecule, so all four are asked to read that cache (``force=False``): the same values,
    6-8 % less time for the 217 descriptors of a MOSES molecule. Each molecule is parsed
    afresh, so no cache is stale."""
    from rdkit.Chem import Descriptors
    from rdkit.Chem.EState import EState

    extremes = {EState.MaxEStateIndex, EState.MinEStateIndex, EState.MaxAbsEStateIndex,
                EState.MinAbsEStateIndex}  # fmt: skip
    return [functools.partial(fn, force=False) if fn in extremes else fn
            for _, fn in Descriptors.descList]  # fmt: skip


def rdkit2d_descriptors(
    smiles: Sequence[str], unparsable: Literal["raise", "nan"] = "raise"
) -> np.ndarray:
    """(N, D) float64: every descriptor of ``rdkit.Chem.Descriptors.descList`` (D ≈ 210).

    Values RDKit cannot compute come back NaN (the normaliser fills them with the train
    median); infinities and values beyond ±:data:`DESCRIPTOR_LIMIT` are turned into NaN too,
    and how many is logged. A SMILES RDKit cannot parse raises InvalidSmilesError, or with
    ``unparsable="nan"`` gets a row of NaN.
    """
    if unparsable not in ("raise", "nan"):
        raise ConfigError("unparsable", unparsable, '"raise" or "nan"')
    functions = _rdkit2d_functions()
    out = np.full((len(smiles), len(functions)), np.nan)
    for i, text in enumerate(smiles):
        # parsed one at a time: holding a chunk's molecules cost up to a fifth more time
        if (mol := _parse(text)) is None:
            if unparsable == "raise":
                raise InvalidSmilesError(text, reason="RDKit cannot parse it")
            continue
        for j, fn in enumerate(functions):
            with contextlib.suppress(ValueError, ZeroDivisionError, OverflowError, RuntimeError):
                out[i, j] = float(fn(mol))
    with np.errstate(invalid="ignore"):
        huge = ~np.isnan(out) & ~(np.abs(out) <= DESCRIPTOR_LIMIT)  # inf included
    if huge.any():
        names = descriptor_names("rdkit2d")
        columns = ", ".join(names[j] for j in np.flatnonzero(huge.any(axis=0)))
        log.warning("rdkit2d: %d descriptor values beyond ±%.0e (%s) set to NaN, filled like "
                    "missing ones", int(huge.sum()), DESCRIPTOR_LIMIT, columns)  # fmt: skip
        out[huge] = np.nan
    return out


def check_descriptor_kind(kind: str | None) -> None:
    """ConfigError unless ``kind`` is None (no descriptors) or one of DESCRIPTOR_KINDS."""
    if kind is not None and kind not in DESCRIPTOR_KINDS:
        raise ConfigError("descriptors", kind, f"None or one of {DESCRIPTOR_KINDS}")


def descriptor_names(kind: str) -> list[str]:
    """The column names of ``kind`` (RDKit's ``Descriptors.descList`` order for rdkit2d)."""
    check_descriptor_kind(kind)
    from rdkit.Chem import Descriptors

    return [name for name, _ in Descriptors.descList]


def descriptor_version(kind: str) -> str:
    """What decides the columns and values: ``"rdkit2d: RDKit 2026.09.1, 217 descriptors"``."""
    import rdkit

    return f"{kind}: RDKit {rdkit.__version__}, {len(descriptor_names(kind))} descriptors"


def compute_descriptors(smiles: Sequence[str], kind: str) -> np.ndarray:
    """(n, D) float32 descriptors of ``smiles``; NaN where a value cannot be computed, and a
    row of NaN for a SMILES RDKit cannot parse (where :func:`rdkit2d_descriptors` raises by
    default)."""
    check_descriptor_kind(kind)
    return rdkit2d_descriptors(smiles, unparsable="nan").astype(np.float32)


def molecule_features(smiles: Sequence[str], kind: str) -> np.ndarray:
    """(N, F) float32 raw features of ``kind`` (``ecfp4``, ``rdkit2d`` or ``both``: the 2048
    bits then the descriptors), NaN = not computable."""
    if kind == "ecfp4":
        return morgan_fingerprints(smiles).astype(np.float32)
    if kind == "rdkit2d":
        return rdkit2d_descriptors(smiles).astype(np.float32)
    if kind == "both":
        return np.hstack([molecule_features(smiles, "ecfp4"), molecule_features(smiles, "rdkit2d")])
    raise ConfigError("features", kind, f"one of {', '.join(FEATURE_KINDS)}")


def tanimoto_matrix(smiles: Sequence[str], radius: int = 2, n_bits: int = 2048) -> np.ndarray:
    """(n, n) Tanimoto similarities of Morgan (ECFP4 by default) bit fingerprints."""
    from rdkit import DataStructs

    generator = morgan_generator(radius, n_bits)
    fps = [generator.GetFingerprint(mol) for mol in _mols(smiles)]
    return np.array([DataStructs.BulkTanimotoSimilarity(fp, fps) for fp in fps])
