"""Applicability domain: how far a molecule lies from the molecules a model was trained on.

Two measures of nearness to the training molecules, both exact (every training molecule is
compared; a training set of MoleculeNet's size is small enough):

- **Tanimoto** similarity of ECFP4 (radius 2, 2,048 bits), the packed fingerprints of
  ``smiexlm search`` (:func:`smiexlm.chemistry.fingerprints.ecfp4_packed`); the bit intersections come from one
  matrix product per block of queries, exact in float32 (counts stay below 2**24);
- **cosine** similarity of the fine-tuned model's own pooled embedding (the features its head
  reads), unit length.

For each molecule: the similarity of its nearest training molecule and the mean over its
``k`` nearest. :class:`DomainBounds` holds what the validation molecules had, each against the
same training molecules: a molecule whose nearest similarity (either kind) is below the
:data:`DEFAULT_QUANTILE` (5 %) quantile of theirs lies outside the range the validation score
speaks for. The bound is a quantile, not the lowest: the lowest is a single molecule's, and a
large validation split's least similar molecule can lie far out (bounds at the lowest left
2 to 28 test molecules of 339 to 2,574 outside, with a smaller error than inside on three
sets of nine).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from smiexlm.errors import ConfigError

DEFAULT_K = 5  # neighbours averaged for the mean_* columns
#: the share of validation molecules a domain bound leaves outside by default: measured on
#: nine MoleculeNet sets (benchmarks/results/trust/domain/), the test molecules outside bounds
#: at this quantile had the larger error on all nine, outside the lowest on six
DEFAULT_QUANTILE = 0.05
QUERY_BLOCK = 256  # queries per matrix product: 256 x 75,000 float32 is 77 MB


def check_quantile(quantile: float) -> None:
    """ConfigError unless ``quantile`` is a number in [0, 0.5]: the share of validation
    molecules a domain bound may leave outside (0: the lowest of them)."""
    if (
        isinstance(quantile, bool)
        or not isinstance(quantile, (int, float))
        or not 0 <= quantile <= 0.5
    ):
        raise ConfigError("--domain-quantile", quantile, "a share in [0, 0.5] of the validation "
                          "molecules left outside the domain (0: the least similar of them)")  # fmt: skip


def unpack_ecfp4(packed: np.ndarray) -> np.ndarray:
    """(n, 2048) float32 bits from (n, 32) uint64 or (n, 256) uint8 packed fingerprints."""
    packed = np.ascontiguousarray(packed)
    as_bytes = packed.view(np.uint8).reshape(len(packed), packed.shape[1] * packed.itemsize)
    return np.unpackbits(as_bytes, axis=1).astype(np.float32)


def _top_k(similarity: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(nearest, mean of the k nearest) per row of a (q, n) similarity block."""
    k = min(k, similarity.shape[1])
    top = -np.partition(-similarity, k - 1, axis=1)[:, :k]
    return top.max(axis=1), top.mean(axis=1)


def _blocks(n_queries: int, measure, k: int) -> tuple[np.ndarray, np.ndarray]:
    nearest = np.empty(n_queries, dtype=np.float64)
    mean = np.empty(n_queries, dtype=np.float64)
    for start in range(0, n_queries, QUERY_BLOCK):
        stop = min(start + QUERY_BLOCK, n_queries)
        nearest[start:stop], mean[start:stop] = _top_k(measure(start, stop), k)
    return nearest, mean


def tanimoto_neighbours(
    queries: np.ndarray, library: np.ndarray, k: int = DEFAULT_K
) -> tuple[np.ndarray, np.ndarray]:
    """(nearest, mean of the ``k`` nearest) ECFP4 Tanimoto similarity of each query to the
    library; both packed fingerprints (:func:`unpack_ecfp4`). A query or library fingerprint
    with no bit set (an unparsable molecule) has similarity 0 to everything; NaN when the
    library is empty."""
    _check_k(k)
    if len(library) == 0:
        return np.full(len(queries), np.nan), np.full(len(queries), np.nan)
    lib = unpack_ecfp4(library)  # (n, 2048)
    lib_bits = lib.sum(axis=1)
    qry = unpack_ecfp4(queries)
    qry_bits = qry.sum(axis=1)

    def measure(start: int, stop: int) -> np.ndarray:
        inter = qry[start:stop] @ lib.T  # (q, n) shared bits, exact
        return tanimoto_from_counts(inter, qry_bits[start:stop, None], lib_bits[None, :])

    return _blocks(len(queries), measure, k)


def tanimoto_from_counts(
    shared: np.ndarray, bits_a: np.ndarray | float, bits_b: np.ndarray | float
) -> np.ndarray:
    """Tanimoto similarity from the shared bit count and each side's bit count (broadcast);
    0 where neither side has a bit set."""
    union = bits_a + bits_b - shared
    return np.divide(shared, union, out=np.zeros_like(shared), where=union > 0)


def cosine_neighbours(
    queries: np.ndarray, library: np.ndarray, k: int = DEFAULT_K
) -> tuple[np.ndarray, np.ndarray]:
    """(nearest, mean of the ``k`` nearest) cosine similarity of each query embedding (q, d)
    to the library's (n, d); rows are made unit length here (a zero row stays zero).

    A molecule's figures do not depend on the queries beside it: the products are taken in
    float64 and rounded to float32 (a float32 product differs in its last bit with the
    batch's shape), and kept within [-1, 1]."""
    _check_k(k)
    if len(library) == 0:
        return np.full(len(queries), np.nan), np.full(len(queries), np.nan)
    lib, qry = unit_rows(library).astype(np.float64), unit_rows(queries)

    def measure(start: int, stop: int) -> np.ndarray:
        product = qry[start:stop].astype(np.float64) @ lib.T
        return np.clip(product, -1.0, 1.0).astype(np.float32).astype(np.float64)

    return _blocks(len(queries), measure, k)


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, float32; a zero row stays zero."""
    x = np.asarray(x, dtype=np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norm, out=np.zeros_like(x), where=norm > 0)


def _check_k(k: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ConfigError("k", k, "a positive number of neighbours")


@dataclass(frozen=True)
class DomainBounds:
    """Per measure, the nearest-neighbour similarity below which a molecule is outside the
    domain: the ``quantile`` q of the validation molecules' (a share q of them falls outside;
    0: the lowest any had). NaN: no validation molecule, so no bound."""

    tanimoto: float
    cosine: float

    @classmethod
    def of(cls, valid_tanimoto: np.ndarray, valid_cosine: np.ndarray,
           quantile: float = DEFAULT_QUANTILE) -> DomainBounds:  # fmt: skip
        check_quantile(quantile)

        def low(values: np.ndarray) -> float:
            values = np.asarray(values, dtype=np.float64)
            values = values[np.isfinite(values)]
            return float(np.quantile(values, quantile)) if len(values) else float("nan")

        return cls(low(valid_tanimoto), low(valid_cosine))

    def inside(self, tanimoto: np.ndarray, cosine: np.ndarray | None) -> np.ndarray:
        """True where the nearest similarities are within the validation range (a measure
        without a bound, or without values, does not decide)."""
        ok = np.ones(len(tanimoto), dtype=bool)
        if np.isfinite(self.tanimoto):
            ok &= np.asarray(tanimoto) >= self.tanimoto
        if cosine is not None and np.isfinite(self.cosine):
            ok &= np.asarray(cosine) >= self.cosine
        return ok
