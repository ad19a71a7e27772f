"""Whitening of a model's embeddings: fitted on a corpus once, stored with the model.

The pooled states of a small encoder share a few strong directions: every molecule has a
large component along them, so raw cosine similarities crowd together (0.3-0.94 for the
shipped model on the demo's 21 drugs) and the neighbour of a drug is decided by directions
that say little about it. Whitening removes the corpus mean and rescales each principal
direction of the corpus to unit variance::

    z = (x - mean) @ matrix,   matrix = V diag(1 / s)

with ``V`` the principal directions of the corpus embeddings and ``s`` their standard
deviations. Directions whose spread is below ``rel_tol`` times the largest are dropped (their
column is zero), never divided by a number near zero: the final LayerNorm leaves one direction
with no spread at all, and dividing by it would blow fp32 rounding up into the output. Cosine
similarity on ``z`` is then similarity in the corpus's own units.

What it buys the shipped model (``benchmarks/results/demo_pooling.md``): the demo's drugs whose
nearest neighbour is of their own family, 9/21 with cls raw, 12/21 with cls whitened and 15/21
(level with ECFP4) with cls+mean+max whitened jointly, its default now; a leave-one-out
10-nearest-neighbour vote on BACE, BBBP, ClinTox and SIDER gains 0.2 with cls pooling and 1.2
with mean pooling (``benchmarks/neighbours.py``).

A model folder keeps the whitening of each pooling in ``whitening.safetensors`` (tensors
``{pooling}.mean`` (d,) and ``{pooling}.matrix`` (d, d), float32, with the corpus it was fitted
on in the metadata), written by ``smiexlm whiten`` (:func:`whiten_model`); its
``embedding.json`` says whether the featurizer whitens by default. A combined pooling such as
``cls+mean+max`` may have its own, fitted on the parts side by side (n·d wide): that one
also decorrelates the parts from each other, which whitening each part alone does not. A
combined pooling without its own is whitened part by part (:func:`pooling_whitening`).

>>> from smiexlm import Featurizer
>>> feat = Featurizer.from_pretrained()   # the shipped model: cls+mean+max, whitened jointly
>>> feat.featurize(["CCO"]).shape, feat.featurize(["CCO"], pooling="cls", whiten=False).shape
((1, 384), (1, 128))
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.errors import ConfigError, DataError

WHITENING_NAME = "whitening.safetensors"
WHITENING_FORMAT = "smiexlm-whitening/1"
DEFAULT_REL_TOL = 1e-3  # directions with spread below this fraction of the largest are dropped
DEFAULT_CORPUS_ROWS = 20_000


@dataclass(frozen=True)
class Whitening:
    """``x -> (x - mean) @ matrix`` for (n, d) embeddings; NaN rows stay NaN."""

    mean: np.ndarray  # (d,) float32
    matrix: np.ndarray  # (d, d) float32; zero columns for the dropped directions

    def __post_init__(self) -> None:
        d = self.mean.shape[0] if self.mean.ndim == 1 else -1
        if d < 1 or self.matrix.shape != (d, d):
            raise DataError(
                f"whitening: expected mean (d,) and matrix (d, d), got {self.mean.shape} and "
                f"{self.matrix.shape}"
            )

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    @property
    def rank(self) -> int:
        """Directions kept (the others were dropped for lack of spread)."""
        return int(np.count_nonzero(np.abs(self.matrix).sum(0)))

    @classmethod
    def side_by_side(cls, parts: Sequence[Whitening]) -> Whitening:
        """The whitening of embeddings put side by side (a combined pooling such as
        ``cls+max``): each block whitened by its own, a block-diagonal matrix."""
        if len(parts) == 1:
            return parts[0]
        matrix = np.zeros((sum(w.dim for w in parts),) * 2, dtype=np.float32)
        start = 0
        for w in parts:
            matrix[start : start + w.dim, start : start + w.dim] = w.matrix
            start += w.dim
        return cls(np.concatenate([w.mean for w in parts]), matrix)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """(n, d) float32. Each row is its own float64 vector-matrix product, so a row comes
        out bitwise the same alone or in any batch. One (n, d) @ (d, d) product did not: its
        last float64 bits follow the kernel's blocking of n rows, and one row of 10,000 MOSES
        molecules then rounded to another float32 alone than in its batch."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise DataError(f"whitening of width {self.dim}: got embeddings of shape {x.shape}")
        centred = x.astype(np.float64) - self.mean.astype(np.float64)  # (n, d)
        rows = np.matmul(centred[:, None, :], self.matrix.astype(np.float64))  # (n, 1, d)
        return rows[:, 0].astype(np.float32)


def fit_whitening(x: np.ndarray, rel_tol: float = DEFAULT_REL_TOL) -> Whitening:
    """The whitening of (n, d) embeddings ``x`` (float64 arithmetic; rows with NaN ignored)."""
    if not 0.0 <= rel_tol < 1.0:
        raise ConfigError("rel_tol", rel_tol, "a number in [0, 1)")
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise DataError(f"fit_whitening: expected (n, d) embeddings, got shape {x.shape}")
    x = x[np.isfinite(x).all(axis=1)]
    n, d = x.shape
    if n <= d:
        raise DataError(
            f"fit_whitening: {n} usable embeddings of width {d}: expected more rows than "
            "columns (a corpus of thousands of molecules)"
        )
    mean = x.mean(axis=0)
    _, sv, vt = np.linalg.svd(x - mean, full_matrices=False)
    spread = sv / np.sqrt(n - 1)  # standard deviation along each principal direction
    keep = spread > rel_tol * spread[0]
    matrix = np.where(keep, vt.T / np.where(keep, spread, 1.0), 0.0)
    return Whitening(mean.astype(np.float32), matrix.astype(np.float32))


def can_whiten(stored: Collection[str], pooling: str) -> bool:
    """Whether whitenings stored for the poolings ``stored`` whiten ``pooling``: its own, or
    (a combined pooling) one for each part."""
    from smiexlm.model.pooling import pooling_parts

    return pooling in stored or set(pooling_parts(pooling)) <= set(stored)


def pooling_whitening(whitenings: Mapping[str, Whitening], pooling: str) -> Whitening | None:
    """The whitening of ``pooling`` from a folder's whitenings by pooling: its own when stored,
    else (a combined pooling) each part by its own; None when a part has none."""
    from smiexlm.model.pooling import pooling_parts

    if not can_whiten(whitenings, pooling):
        return None
    if pooling in whitenings:
        return whitenings[pooling]
    return Whitening.side_by_side([whitenings[part] for part in pooling_parts(pooling)])


# ---------------------------------------------------------------------- in a model folder
def save_whitening(
    directory: str | Path, whitenings: Mapping[str, Whitening], source: Mapping[str, Any]
) -> Path:
    """Write ``whitening.safetensors`` (one whitening per pooling) and record its sha256 in the
    folder's ``checksums.json``; a model folder without one (written before they existed) is
    left without, unverified as before: a record of this file alone would fail its weights."""
    from safetensors.numpy import save

    from smiexlm.model.integrity import read_checksums, record_checksums
    from smiexlm.paths import write_bytes_atomic

    tensors = {}
    for pooling, w in whitenings.items():
        tensors[f"{pooling}.mean"] = np.ascontiguousarray(w.mean, dtype=np.float32)
        tensors[f"{pooling}.matrix"] = np.ascontiguousarray(w.matrix, dtype=np.float32)
    metadata = {"format": WHITENING_FORMAT, "source": json.dumps(dict(source), sort_keys=True)}
    directory = Path(directory)
    path = write_bytes_atomic(directory / WHITENING_NAME, save(tensors, metadata))
    weights = [p for p in directory.glob("*.safetensors") if p.name != WHITENING_NAME]
    if read_checksums(directory) is not None or not weights:
        record_checksums(directory, WHITENING_NAME)
    return path


def load_whitening(directory: str | Path, dim: int) -> dict[str, Whitening] | None:
    """The whitenings of a model folder by pooling (None without ``whitening.safetensors``),
    checked against its recorded sha256 and the model's width ``dim``."""
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load

    from smiexlm.model.integrity import verify_checksum
    from smiexlm.model.pooling import pooling_parts

    path = Path(directory) / WHITENING_NAME
    if not path.is_file():
        return None
    verify_checksum(path)  # raises on a digest that differs from the folder's record
    try:
        tensors = load(path.read_bytes())
        with safe_open(str(path), "np") as handle:
            found = (handle.metadata() or {}).get("format")
    except SafetensorError as err:
        raise DataError(f"{str(path)!r} is not a readable safetensors file: {err}") from None
    if found != WHITENING_FORMAT:
        raise DataError(f"{str(path)!r}: format {found!r}, expected {WHITENING_FORMAT!r} "
                        "(written by `smiexlm whiten`)")  # fmt: skip
    out = {}
    for pooling in sorted({key.rsplit(".", 1)[0] for key in tensors}):
        try:
            width = dim * len(pooling_parts(pooling))
        except ConfigError:
            raise DataError(f"{str(path)!r}: tensor names start with {pooling!r}, not a "
                            "pooling (cls, mean, max, or several joined by '+')") from None  # fmt: skip
        mean, matrix = tensors.get(f"{pooling}.mean"), tensors.get(f"{pooling}.matrix")
        if mean is None or matrix is None or mean.shape != (width,) or matrix.shape != (width,) * 2:
            raise DataError(
                f"{str(path)!r}: expected '{pooling}.mean' of shape ({width},) and "
                f"'{pooling}.matrix' of shape ({width}, {width}) for a model of width {dim}"
            )
        if not (np.isfinite(mean).all() and np.isfinite(matrix).all()):
            raise DataError(f"{str(path)!r}: the {pooling} whitening has non-finite values")
        out[pooling] = Whitening(mean.astype(np.float32), matrix.astype(np.float32))
    if not out:
        raise DataError(f"{str(path)!r} holds no whitening: expected '<pooling>.mean' and "
                        "'<pooling>.matrix' tensors")  # fmt: skip
    return out


def whitening_poolings(directory: str | Path) -> list[str]:
    """The poolings a model folder stores a whitening of their own for (none without the
    file); a combined pooling whose parts are all here can be whitened too
    (:func:`pooling_whitening`)."""
    from safetensors import safe_open

    path = Path(directory) / WHITENING_NAME
    if not path.is_file():
        return []
    with safe_open(str(path), "np") as handle:
        return sorted({key.split(".")[0] for key in handle.keys()})  # noqa: SIM118 (not iterable)


def whitening_source(directory: str | Path) -> dict[str, Any]:
    """What a folder's whitening was fitted on (the metadata ``smiexlm whiten`` wrote)."""
    from safetensors import safe_open

    with safe_open(str(Path(directory) / WHITENING_NAME), "np") as handle:
        return json.loads((handle.metadata() or {}).get("source", "{}"))


def whiten_model(
    model: str | Path,
    corpus: str | Path,
    rows: int = DEFAULT_CORPUS_ROWS,
    default: bool = True,
    rel_tol: float = DEFAULT_REL_TOL,
    device: str = "auto",
    progress: bool = True,
    pooling: str | None = None,
    out: str | Path | None = None,
) -> dict[str, Any]:
    """Fit the whitening of every pooling of ``model`` (a model folder) on the first ``rows``
    SMILES of ``corpus`` (any file ``smiexlm preprocess`` reads), store it, and make it the
    featurizer's default when ``default``. ``pooling`` (such as ``cls+mean+max``) also fits
    that combination jointly and, with ``default``, makes it the folder's pooling; a combined
    pooling already in ``embedding.json`` is fitted jointly too.

    Without ``out`` the whitening is stored in ``model`` itself, which a shipped model refuses
    (they are read-only); with ``out`` (a new or empty folder) a full copy of the folder is
    written there with the new whitening and its checksums, and ``model`` is left untouched.
    Returns what was recorded."""
    from smiexlm.analysis.inputs import read_smiles
    from smiexlm.featurizer import Featurizer
    from smiexlm.model.pooling import POOLINGS, pooling_parts
    from smiexlm.model.pretrained import model_folder, read_embedding
    from smiexlm.paths import file_sha256

    if not isinstance(rows, int) or rows < 1:
        raise ConfigError("rows", rows, "a positive number of corpus molecules")
    folder = model_folder(model)
    target = _whitening_target(folder, out)  # before the corpus is embedded
    own = read_embedding(folder).pooling
    chosen = own if pooling is None else pooling
    pooling_parts(chosen)  # a bad name fails before the corpus is embedded
    smiles = read_smiles(Path(corpus), rows)
    feat = Featurizer.from_pretrained(folder, device=device)
    every = feat.featurize(smiles, pooling="+".join(POOLINGS), whiten=False, errors="nan",
                           progress=progress)  # fmt: skip
    d = feat.model.config.d_model
    raw = {p: every[:, i * d : (i + 1) * d] for i, p in enumerate(POOLINGS)}  # one pass
    whitenings = {}
    for spec in dict.fromkeys([*POOLINGS, own, chosen]):
        whitenings[spec] = fit_whitening(np.hstack([raw[p] for p in pooling_parts(spec)]), rel_tol)
    n_used = len(smiles) - feat.last_report.n_failed
    source = {"corpus": Path(corpus).name, "corpus_sha256": file_sha256(Path(corpus)),
              "rows": n_used, "rel_tol": rel_tol,
              "rank": {spec: w.rank for spec, w in whitenings.items()}}  # fmt: skip
    settings = (chosen if default else own, default)
    if target is None:
        _store(folder, whitenings, source, *settings)
    else:
        _store_copy(folder, target, whitenings, source, *settings)
    return source | {"folder": str(target or folder), "default": default, "pooling": chosen}


def _whitening_target(folder: Path, out: str | Path | None) -> Path | None:
    """Where ``smiexlm whiten`` may write: ``out`` (a new or empty folder outside the package),
    or None for ``folder`` itself, unless it is a shipped model."""
    from smiexlm.model.pretrained import is_shipped
    from smiexlm.paths import check_output

    if out is None:
        if is_shipped(folder):
            raise DataError(f"model {str(folder)!r} is shipped with smiexlm and is read-only: "
                            "pass --out DIR to write a whitened copy of it there")  # fmt: skip
        return None
    target = check_output(out, "--out", kind="folder")
    if is_shipped(target):
        raise DataError(f"--out {str(target)!r} is inside the package's shipped models, which "
                        "are read-only: expected a folder of your own")  # fmt: skip
    if target.is_dir() and any(target.iterdir()):
        raise DataError(f"--out {str(target)!r} is a folder with files in it: expected a new "
                        f"or empty folder for the whitened copy of {str(folder)!r}")  # fmt: skip
    return target


def _store(folder: Path, whitenings, source, pooling: str, default: bool) -> None:
    from smiexlm.model.pretrained import write_embedding

    save_whitening(folder, whitenings, source)
    write_embedding(folder, pooling, whiten=default)


def _store_copy(folder: Path, target: Path, whitenings, source, pooling: str, default: bool):
    """A full copy of ``folder`` in ``target`` with the new whitening; it appears complete
    or not at all."""
    import shutil

    from smiexlm.paths import atomic_dir

    with atomic_dir(target) as tmp:
        shutil.copytree(folder, tmp, dirs_exist_ok=True)
        _store(tmp, whitenings, source, pooling, default)
