"""Whitening of a model's embeddings: fitted on a corpus once, stored with the model.

The concept's maths live here (:class:`Whitening`,
:func:`fit_whitening`, the keys of a pooling's whitening), the model folder's
``whitening.safetensors`` in :mod:`smiexlm.modelio.whitening_file`, and fitting one on a corpus for a
model (``smiexlm whiten``) in :mod:`smiexlm.embedding.whitening_fit`.

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
nearest neighbour is of their own family, 9/21 with cls raw, 12/21 with cls whitened, 15/21
(level with ECFP4) with cls+mean+max whitened jointly, and 16/21 with the same of the last three
blocks, its default now; a leave-one-out
10-nearest-neighbour vote on BACE, BBBP, ClinTox and SIDER gains 0.2 with cls pooling and 1.2
with mean pooling (``benchmarks/neighbours.py``).

A model folder keeps the whitening of each pooling in ``whitening.safetensors`` (tensors
``{pooling}.mean`` (d,) and ``{pooling}.matrix`` (d, d), float32, with the corpus it was fitted
on in the metadata; read and written by :mod:`smiexlm.modelio.whitening_file`), fitted by
``smiexlm whiten`` (:func:`smiexlm.embedding.whitening_fit.whiten_model`); its ``embedding.json`` says whether
the featurizer whitens by default. A combined pooling such as
``cls+mean+max`` may have its own, fitted on the parts side by side (n·d wide): that one
also decorrelates the parts from each other, which whitening each part alone does not. A
combined pooling without its own is whitened part by part (:func:`pooling_whitening`). An
embedding of the last n blocks side by side has its own, stored as ``{pooling}@{n}``
(:func:`whitening_key`), fitted jointly on the n blocks.

>>> from smiexlm import Featurizer
>>> feat = Featurizer.from_pretrained()   # the shipped model: cls+mean+max of the last 3
>>> # blocks, whitened jointly; one block of one pooling, raw:
>>> feat.featurize(["CCO"]).shape, feat.featurize(["CCO"], "cls", -1, whiten=False).shape
((1, 1152), (1, 128))
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from smiexlm.errors import ConfigError, DataError
from smiexlm.model.pooling import block_indices, pooling_parts

DEFAULT_REL_TOL = 1e-3  # directions with spread below this fraction of the largest are dropped
# fewest directions a whitening may keep (half the width for one narrower than 16): fewer
# would serve embeddings that tell the molecules apart by almost nothing
MIN_DIRECTIONS = 8


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

    def __call__(self, x: np.ndarray, float32: bool = False) -> np.ndarray:
        """(n, d) float32. Each row is its own vector-matrix product, so a row comes out
        bitwise the same alone or in any batch. One (n, d) @ (d, d) product did not: its last
        float64 bits follow the kernel's blocking of n rows, and one row of 10,000 MOSES
        molecules then rounded to another float32 alone than in its batch. The product is in
        float64 (within float32 rounding of the exact value); ``float32=True`` sums in float32,
        2.2x as fast and off by up to 6e-5 on the shipped embedding (the int8 featurizer's
        choice: its products move values by 0.1)."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise DataError(f"whitening of width {self.dim}: got embeddings of shape {x.shape}")
        dtype = np.float32 if float32 else np.float64
        mean, matrix = self._operands[dtype]
        rows = np.matmul((x.astype(dtype) - mean)[:, None, :], matrix)  # (n, 1, d)
        return rows[:, 0].astype(np.float32, copy=False)

    @cached_property
    def _operands(self) -> dict[type, tuple[np.ndarray, np.ndarray]]:
        """The mean and matrix in float32 and in float64, converted once (the matrix of the
        shipped embedding is 1,152 wide: converting it took a sixth of a 2,000-row call)."""
        return {t: (self.mean.astype(t, copy=False), self.matrix.astype(t, copy=False))
                for t in (np.float32, np.float64)}  # fmt: skip


def fit_whitening(x: np.ndarray, rel_tol: float = DEFAULT_REL_TOL) -> Whitening:
    """The whitening of (n, d) embeddings ``x`` (float64 arithmetic; rows with NaN ignored).
    DataError when it would keep fewer than :data:`MIN_DIRECTIONS` directions (half of ``d``
    when that is fewer): a corpus of one molecule repeated, or of a handful."""
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
    floor = min(MIN_DIRECTIONS, d // 2)
    if int(keep.sum()) < floor:
        distinct = len(np.unique(x, axis=0))
        raise DataError(
            f"fit_whitening: the {n:,} embeddings ({distinct:,} distinct) span {int(keep.sum())} "
            f"of their {d} directions: expected at least {floor} (a corpus of many different "
            "molecules)"
        )
    matrix = np.where(keep, vt.T / np.where(keep, spread, 1.0), 0.0)
    return Whitening(mean.astype(np.float32), matrix.astype(np.float32))


def whitening_key(pooling: str, layers: int = 1) -> str:
    """The name a whitening is stored under: its pooling, and ``@n`` when it whitens the last
    n blocks side by side (``cls+mean+max@3``)."""
    pooling_parts(pooling)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ConfigError("layers", layers, "a positive number of last blocks")
    return pooling if layers == 1 else f"{pooling}@{layers}"


def parse_whitening_key(key: str) -> tuple[str, int]:
    """(pooling, layers) of a stored whitening's name (:func:`whitening_key`); ConfigError
    for a name that is not one."""
    pooling, _, layers = key.partition("@")
    if layers and not (layers.isdigit() and int(layers) > 1 and layers[0] != "0"):
        raise ConfigError("whitening name", key, "a pooling, or a pooling and '@n' (n > 1)")
    pooling_parts(pooling, "whitening name")
    return pooling, int(layers or 1)


def can_whiten(stored: Collection[str], pooling: str, layers: int = 1) -> bool:
    """Whether whitenings stored under the names ``stored`` whiten ``pooling`` of the last
    ``layers`` blocks: its own, or (one block, a combined pooling) one for each part."""
    if layers > 1:
        return whitening_key(pooling, layers) in stored
    return pooling in stored or set(pooling_parts(pooling)) <= set(stored)


def pooling_whitening(
    whitenings: Mapping[str, Whitening], pooling: str, layers: int = 1
) -> Whitening | None:
    """The whitening of ``pooling`` of the last ``layers`` blocks from a folder's whitenings
    (:func:`whitening_key`): its own when stored, else (one block, a combined pooling) each
    part by its own; None when there is none."""
    if not can_whiten(whitenings, pooling, layers):
        return None
    key = whitening_key(pooling, layers)
    if key in whitenings:
        return whitenings[key]
    return Whitening.side_by_side([whitenings[part] for part in pooling_parts(pooling)])


def served_whitening(whitenings: Mapping[str, Whitening], pooling: str, layer: int | Sequence[int],
                     n_layers: int, whiten: bool | None, default: bool) -> Whitening | None:  # fmt: skip
    """The whitening a featurize call applies to ``pooling`` of the blocks ``layer`` of a model
    of ``n_layers``, or None: ``whiten`` True (ConfigError unless the blocks are the last few in
    order and a whitening of them is stored), False, or None for the model's ``default`` where
    such a whitening is stored."""
    blocks = block_indices(layer, n_layers)
    last = blocks == tuple(range(n_layers - 1, n_layers - 1 - len(blocks), -1))
    whitening = pooling_whitening(whitenings, pooling, len(blocks)) if last else None
    if whiten is None:
        whiten = default and whitening is not None
    if not whiten:
        return None
    if whiten is not True:
        raise ConfigError("whiten", whiten, "True, False or None")
    if not last:
        raise ConfigError("layer", layer, "the last block or the last few in order, such as "
                          "(-1, -2), with whiten=True (the whitenings are fitted on those)")  # fmt: skip
    if whitening is None:
        raise ConfigError("whiten", whiten, f"False: the model stores no whitening for {pooling} "
                          f"pooling of the last {len(blocks)} block(s) (`smiexlm whiten` fits one)")  # fmt: skip
    return whitening
