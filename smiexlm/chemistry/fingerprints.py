"""Classical molecule features: Morgan bit fingerprints (ECFP4) and RDKit 2D descriptors.

The one place the package computes them: the RF baseline, the hybrid fine-tuning features
(``--features ecfp4|rdkit2d|both``), the descriptor targets of pretraining datasets
(``preprocess --descriptors rdkit2d``, :func:`compute_descriptors`) and the demo's Tanimoto
neighbours all call these functions. A data set's RDKit 2D descriptors can be kept on disk
(``cache=True``): they cost minutes (BACE half a minute, ToxCast about 2, MUV about 14 on one
core), and every fine-tuning run, resumed run, forest and probe of the set needs the same
matrix. How the values are scaled lives with their users:
:mod:`smiexlm.chemistry.descriptor_stats` for pretraining targets, :mod:`smiexlm.forests.features`
for the hybrid heads. RDKit is imported inside the functions so that importing this module
stays cheap.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from smiexlm.errors import ConfigError, InvalidSmilesError

log = logging.getLogger(__name__)

FeatureKind = Literal["ecfp4", "rdkit2d", "both"]  # both: the bits, then the descriptors
FEATURE_KINDS: tuple[str, ...] = ("ecfp4", "rdkit2d", "both")
# what a pretraining dataset can carry (mordred: an optional extra, smiexlm.chemistry.mordred2d)
DESCRIPTOR_KINDS: tuple[str, ...] = ("rdkit2d", "mordred")
# Descriptor values beyond ±this are NaN: Ipc reaches 1e40 (BBBP) to 1e227 (a long chain),
# past float32 and past what a mean and a standard deviation can be computed over.
DESCRIPTOR_LIMIT = 1e15
# Lists shorter than this are computed afresh even when a cache is asked for (seconds each)
CACHE_MIN_MOLECULES = 1000
# Part of a kept matrix's key: bump it when the rules that make the values change
CACHE_FORMAT = "smiexlm-rdkit2d/1"


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
    smiles: Sequence[str], unparsable: Literal["raise", "nan"] = "raise", cache: bool = False
) -> np.ndarray:
    """(N, D) float64: every descriptor of ``rdkit.Chem.Descriptors.descList`` (D ≈ 210).

    Values RDKit cannot compute come back NaN (the normaliser fills them with the train
    median); infinities and values beyond ±:data:`DESCRIPTOR_LIMIT` are turned into NaN too,
    and how many is logged. A SMILES RDKit cannot parse raises InvalidSmilesError, or with
    ``unparsable="nan"`` gets a row of NaN.

    With ``cache``, a list of :data:`CACHE_MIN_MOLECULES` or more is kept under
    ``cache_dir()/descriptors/`` (``SMIEXLM_CACHE``), keyed by the SMILES in their order,
    ``unparsable``, the RDKit version and the descriptor list, and read back bit for bit the
    next time; a kept file that cannot be read is computed again. For whole data sets, not for
    a corpus's chunks or a screen's batches, which would fill the disk with matrices never
    asked for twice.
    """
    if unparsable not in ("raise", "nan"):
        raise ConfigError("unparsable", unparsable, '"raise" or "nan"')
    path = _kept_path(smiles, unparsable) if cache and len(smiles) >= CACHE_MIN_MOLECULES else None
    if path is not None and (kept := _read_kept(path, len(smiles))) is not None:
        return kept
    out = _computed_rdkit2d(smiles, unparsable)
    if path is not None:
        from smiexlm.paths import keep_in_cache

        keep_in_cache(path, lambda tmp: np.save(tmp, out, allow_pickle=False))
    return out


def _kept_path(smiles: Sequence[str], unparsable: str) -> Path:
    from smiexlm.paths import cache_dir

    head = [CACHE_FORMAT, descriptor_version("rdkit2d"), repr(DESCRIPTOR_LIMIT), unparsable]
    key = hashlib.sha256("\n".join([*head, *smiles]).encode()).hexdigest()[:32]
    return cache_dir() / "descriptors" / f"rdkit2d-{key}.npy"


def _read_kept(path: Path, n: int) -> np.ndarray | None:
    """The kept (n, D) float64 matrix at ``path``; None when there is none or it is damaged."""
    if not path.is_file():
        return None
    try:
        kept = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        log.warning("rdkit2d: kept descriptors %s unreadable (%s); computing them again",
                    path, error)  # fmt: skip
        return None
    expected = (n, len(descriptor_names("rdkit2d")))
    if kept.dtype != np.float64 or kept.shape != expected:
        log.warning("rdkit2d: kept descriptors %s are %s %s, expected %s float64; computing "
                    "them again", path, kept.shape, kept.dtype, expected)  # fmt: skip
        return None
    log.info("rdkit2d: descriptors of %d molecules read from %s", n, path)
    return kept


def _computed_rdkit2d(smiles: Sequence[str], unparsable: str) -> np.ndarray:
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
    """The column names of ``kind`` (RDKit's ``Descriptors.descList`` order for rdkit2d,
    the calculator's for mordred)."""
    check_descriptor_kind(kind)
    if kind == "mordred":
        from smiexlm.chemistry.mordred2d import mordred_names

        return mordred_names()
    from rdkit.Chem import Descriptors

    return [name for name, _ in Descriptors.descList]


def descriptor_version(kind: str) -> str:
    """What decides the columns and values: ``"rdkit2d: RDKit 2026.09.1, 217 descriptors"``
    (for mordred, the mordredcommunity version beside RDKit's)."""
    import rdkit

    library = f"RDKit {rdkit.__version__}"
    if kind == "mordred":
        from smiexlm.chemistry.mordred2d import mordred_version

        library = f"{mordred_version()}, {library}"
    return f"{kind}: {library}, {len(descriptor_names(kind))} descriptors"


def compute_descriptors(smiles: Sequence[str], kind: str) -> np.ndarray:
    """(n, D) float32 descriptors of ``smiles``; NaN where a value cannot be computed, and a
    row of NaN for a SMILES RDKit cannot parse (where :func:`rdkit2d_descriptors` raises by
    default)."""
    check_descriptor_kind(kind)
    if kind == "mordred":
        from smiexlm.chemistry.mordred2d import mordred_descriptors

        mols = (_parse(text) for text in smiles)  # one at a time, as for RDKit's own
        return mordred_descriptors(mols, len(smiles), DESCRIPTOR_LIMIT).astype(np.float32)
    return rdkit2d_descriptors(smiles, unparsable="nan").astype(np.float32)


def molecule_features(smiles: Sequence[str], kind: str, cache: bool = False) -> np.ndarray:
    """(N, F) float32 raw features of ``kind`` (``ecfp4``, ``rdkit2d`` or ``both``: the 2048
    bits then the descriptors), NaN = not computable. ``cache``: a data set's descriptors are
    kept on disk (:func:`rdkit2d_descriptors`); the bits take seconds and are not."""
    if kind == "ecfp4":
        return morgan_fingerprints(smiles).astype(np.float32)
    if kind == "rdkit2d":
        return rdkit2d_descriptors(smiles, cache=cache).astype(np.float32)
    if kind == "both":
        parts = (molecule_features(smiles, "ecfp4"), molecule_features(smiles, "rdkit2d", cache))
        return np.hstack(parts)
    raise ConfigError("features", kind, f"one of {', '.join(FEATURE_KINDS)}")


def tanimoto_matrix(smiles: Sequence[str], radius: int = 2, n_bits: int = 2048) -> np.ndarray:
    """(n, n) Tanimoto similarities of Morgan (ECFP4 by default) bit fingerprints."""
    from rdkit import DataStructs

    generator = morgan_generator(radius, n_bits)
    fps = [generator.GetFingerprint(mol) for mol in _mols(smiles)]
    return np.array([DataStructs.BulkTanimotoSimilarity(fp, fps) for fp in fps])


ECFP4_BITS = 2048  # ECFP4: Morgan radius 2 in 2,048 bits


def ecfp4_packed(smiles: Sequence[str]) -> np.ndarray:
    """(n, 32) uint64 packed ECFP4 bits; a row of zeros where RDKit cannot parse the SMILES."""
    from rdkit import Chem, rdBase

    generator = morgan_generator(2, ECFP4_BITS)
    bits = np.zeros((len(smiles), ECFP4_BITS), dtype=np.uint8)
    with rdBase.BlockLogs():
        for i, text in enumerate(smiles):
            mol = Chem.MolFromSmiles(text) if isinstance(text, str) and text else None
            if mol is not None:
                bits[i] = generator.GetFingerprintAsNumPy(mol)
    packed = np.packbits(bits, axis=1)  # (n, 256) uint8
    return np.ascontiguousarray(packed).view(np.uint64)  # (n, 32)


def bit_tanimoto(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(Na, Nb) float64 Tanimoto similarities of 0/1 bit rows (ECFP4 bits, say), |a & b| /
    |a | b| by one matrix product; 0 between two empty rows."""
    x, y = a.astype(np.float32), b.astype(np.float32)  # counts below 2**24: exact
    common = (x @ y.T).astype(np.float64)
    union = x.sum(axis=1)[:, None] + y.sum(axis=1)[None, :] - common
    return np.divide(common, union, out=np.zeros_like(common), where=union > 0)
