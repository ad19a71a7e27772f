"""Support-vector regression with a kernel on fingerprints, on an embedding, or on both: the
member that small potency sets are known to favour (kernel methods on ECFP4 beat most deep
models on a few hundred to a few thousand molecules).

Kernels (:data:`KERNELS`), between molecules ``a`` and ``b``:

- ``tanimoto``: the Tanimoto similarity of their ECFP4 bits, |a & b| / |a | b|;
- ``rbf``: exp(-gamma |z_a - z_b|^2 / D) of a D-dimensional embedding ``z`` standardised on
  the training molecules (gamma of :data:`GAMMAS`);
- ``both``: the mean of the two, each in [0, 1].

The values are standardised on the training molecules (per label) and each label gets its
own :class:`sklearn.svm.SVR` on the precomputed kernel. ``C`` (and ``gamma``) are chosen by
cross-validation on the training molecules alone, in folds that keep each Murcko scaffold
whole (:func:`fit_kernel_svr`), as the test molecules of a scaffold split are of scaffolds
the training ones do not hold; the same folds give every training molecule a prediction from
a model that did not see it (out-of-fold), which a combination of members is fitted on.

A fitted member is its support molecules' bits or embeddings, one dual coefficient per
support molecule and label, and the intercepts: :meth:`KernelSVR.predict` is one kernel
matrix and one product, and :meth:`KernelSVR.tensors` is what a model folder stores of it
(safetensors, no pickle), beside :meth:`KernelSVR.record` (JSON).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from smiexlm.chemistry.fingerprints import bit_tanimoto as tanimoto
from smiexlm.errors import ConfigError, DataError

KERNELS = ("tanimoto", "rbf", "both")
CS = (0.3, 1.0, 3.0, 10.0, 30.0)
GAMMAS = (0.1, 0.3, 1.0)  # times 1 / D
EPSILON = 0.1  # the SVR's tube, in standard deviations of the training values
FOLDS = 5
CHUNK = 4096  # molecules per kernel block when predicting


@dataclass
class KernelInputs:
    """What the kernels read of N molecules: ECFP4 bits (N, 2048) and an embedding (N, D);
    each may be None where the kernel does not read it."""

    bits: np.ndarray | None = None
    vectors: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.bits if self.bits is not None else self.vectors)  # type: ignore[arg-type]

    def take(self, rows: np.ndarray) -> KernelInputs:
        return KernelInputs(None if self.bits is None else self.bits[rows],
                            None if self.vectors is None else self.vectors[rows])  # fmt: skip


def rbf(a: np.ndarray, b: np.ndarray, gamma: float) -> np.ndarray:
    """(Na, Nb) float64 exp(-gamma |a - b|^2 / D) of standardised rows."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    squared = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T
    return np.exp(-gamma * np.maximum(squared, 0.0) / a.shape[1])


def kernel_matrix(kind: str, a: KernelInputs, b: KernelInputs, gamma: float | None) -> np.ndarray:
    """The (Na, Nb) kernel ``kind`` between two sets of (already standardised) inputs."""
    if kind == "tanimoto":
        return tanimoto(a.bits, b.bits)  # type: ignore[arg-type]
    if kind == "rbf":
        return rbf(a.vectors, b.vectors, gamma)  # type: ignore[arg-type]
    return 0.5 * (tanimoto(a.bits, b.bits) + rbf(a.vectors, b.vectors, gamma))  # type: ignore[arg-type]


@dataclass
class KernelSVR:
    """A fitted member (see the module docstring): ``support`` the support molecules'
    inputs, ``coef`` (S, T) their dual coefficients per label (0 where a molecule supports
    another label only), ``intercept`` (T,), in standardised units undone by ``y_mean`` and
    ``y_std``; ``vector_mean`` and ``vector_scale`` standardise an embedding."""

    kernel: str
    C: float
    gamma: float | None
    support: KernelInputs
    coef: np.ndarray
    intercept: np.ndarray
    y_mean: np.ndarray
    y_std: np.ndarray
    vector_mean: np.ndarray | None = None
    vector_scale: np.ndarray | None = None
    cv_rmse: float = float("nan")  # the chosen setting's out-of-fold RMSE (labels' units)
    tried: dict[str, float] = field(default_factory=dict)  # "C=1,gamma=0.3" -> CV RMSE

    def standardised(self, inputs: KernelInputs) -> KernelInputs:
        if inputs.vectors is None or self.vector_mean is None:
            return inputs
        return KernelInputs(inputs.bits, (inputs.vectors - self.vector_mean) / self.vector_scale)

    def predict(self, inputs: KernelInputs) -> np.ndarray:
        """(N, T) float64 values in the labels' units."""
        inputs = self.standardised(inputs)
        out = np.empty((len(inputs), self.coef.shape[1]), dtype=np.float64)
        for start in range(0, len(inputs), CHUNK):
            rows = np.arange(start, min(start + CHUNK, len(inputs)))
            k = kernel_matrix(self.kernel, inputs.take(rows), self.support, self.gamma)
            out[rows] = k @ self.coef + self.intercept
        return out * self.y_std + self.y_mean

    def record(self) -> dict[str, Any]:
        """What JSON keeps of the member (its arrays: :meth:`tensors`)."""
        return {"kernel": self.kernel, "C": self.C, "gamma": self.gamma,
                "cv_rmse": self.cv_rmse, "tried": self.tried,
                "n_support": int(len(self.coef))}  # fmt: skip

    def tensors(self) -> dict[str, np.ndarray]:
        arrays = {"coef": self.coef, "intercept": self.intercept, "y_mean": self.y_mean,
                  "y_std": self.y_std}  # fmt: skip
        if self.support.bits is not None:
            arrays["bits"] = np.ascontiguousarray(self.support.bits, dtype=np.uint8)
        if self.support.vectors is not None:
            arrays |= {"vectors": self.support.vectors, "vector_mean": self.vector_mean,
                       "vector_scale": self.vector_scale}  # fmt: skip
        return {k: np.ascontiguousarray(v) for k, v in arrays.items()}

    @classmethod
    def from_stored(cls, record: dict[str, Any], arrays: dict[str, np.ndarray],
                    where: str) -> KernelSVR:  # fmt: skip
        """The member of :meth:`record` and :meth:`tensors`; DataError naming ``where`` for
        a kernel, an array or a shape that is not a member's."""
        kind = record.get("kernel")
        needs = {"coef", "intercept", "y_mean", "y_std"}
        needs |= {"bits"} if kind in ("tanimoto", "both") else set()
        needs |= {"vectors", "vector_mean", "vector_scale"} if kind in ("rbf", "both") else set()
        if kind not in KERNELS or not needs <= set(arrays):
            raise DataError(f"{where}: expected a kernel member (kernel one of {KERNELS}) with "
                            f"the arrays {sorted(needs)}; found kernel {kind!r} and "
                            f"{sorted(arrays)}")  # fmt: skip
        support = KernelInputs(arrays.get("bits"), arrays.get("vectors"))
        coef = arrays["coef"]
        if (
            coef.ndim != 2
            or len(support) != len(coef)
            or arrays["intercept"].shape != coef.shape[1:]
        ):
            raise DataError(f"{where}: {len(support)} support molecules and coefficients of "
                            f"shape {coef.shape}: expected one row of coefficients each")  # fmt: skip
        return cls(kind, float(record["C"]), record.get("gamma"), support, coef,
                   arrays["intercept"], arrays["y_mean"], arrays["y_std"],
                   arrays.get("vector_mean"), arrays.get("vector_scale"),
                   float(record.get("cv_rmse", float("nan"))), dict(record.get("tried", {})))  # fmt: skip


def _folds(groups: np.ndarray, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Scaffold-whole folds of ``n`` training molecules (plain folds where too few
    scaffolds)."""
    from sklearn.model_selection import GroupKFold, KFold

    splits = min(FOLDS, len(np.unique(groups)))
    if splits >= 2:
        return list(GroupKFold(n_splits=splits).split(np.zeros(n), groups=groups))
    return list(KFold(n_splits=min(FOLDS, n), shuffle=True, random_state=0).split(np.zeros(n)))


def _fit_labels(k_fit: np.ndarray, y: np.ndarray, C: float) -> tuple[np.ndarray, np.ndarray]:
    """Dual coefficients (n, T) and intercepts (T,) of one SVR a label, on a precomputed
    kernel between the ``n`` molecules; a label's missing values take no part."""
    from sklearn.svm import SVR

    coef, intercept = np.zeros(y.shape), np.zeros(y.shape[1])
    for t in range(y.shape[1]):
        rows = np.flatnonzero(~np.isnan(y[:, t]))
        svr = SVR(kernel="precomputed", C=C, epsilon=EPSILON).fit(k_fit[np.ix_(rows, rows)],
                                                                  y[rows, t])  # fmt: skip
        coef[rows[svr.support_], t] = svr.dual_coef_[0]
        intercept[t] = svr.intercept_[0]
    return coef, intercept


def fit_kernel_svr(
    kind: str, inputs: KernelInputs, y: np.ndarray, groups: np.ndarray
) -> tuple[KernelSVR, np.ndarray]:
    """The member of kernel ``kind`` fitted on all of ``inputs`` and ``y`` ((N, T), NaN =
    missing), ``C`` and ``gamma`` those of the lowest out-of-fold RMSE in scaffold-whole folds
    (``groups``: one scaffold id a molecule); and its (N, T) out-of-fold predictions."""
    if kind not in KERNELS:
        raise ConfigError("kernel", kind, f"one of {', '.join(KERNELS)}")
    inputs = KernelInputs(
        inputs.bits if kind != "rbf" else None, inputs.vectors if kind != "tanimoto" else None
    )  # what it reads
    if (kind != "rbf" and inputs.bits is None) or (kind != "tanimoto" and inputs.vectors is None):
        raise ConfigError("kernel", kind, "inputs with the bits and the embedding it reads")
    y = np.asarray(y, np.float64).reshape(len(inputs), -1)
    y_mean, y_std = np.nanmean(y, axis=0), np.nanstd(y, axis=0) + 1e-12
    scaled = (y - y_mean) / y_std
    vector_mean = vector_scale = None
    if inputs.vectors is not None:
        vector_mean = inputs.vectors.mean(axis=0)
        vector_scale = inputs.vectors.std(axis=0) + 1e-6
    probe = KernelSVR(kind, 1.0, None, inputs, np.zeros((0, 1)), np.zeros(1), y_mean, y_std,
                      vector_mean, vector_scale)  # fmt: skip
    inputs = probe.standardised(inputs)
    folds = _folds(np.asarray(groups), len(inputs))
    best, tried = None, {}
    for gamma in (None,) if kind == "tanimoto" else GAMMAS:
        k = kernel_matrix(kind, inputs, inputs, gamma)
        for C in CS:
            oof = np.full(y.shape, np.nan)
            for fit_rows, held in folds:
                coef, b = _fit_labels(k[np.ix_(fit_rows, fit_rows)], scaled[fit_rows], C)
                oof[held] = k[np.ix_(held, fit_rows)] @ coef + b
            oof = oof * y_std + y_mean
            rmse = float(np.sqrt(np.nanmean((oof - y) ** 2)))
            tried[f"C={C:g}" + ("" if gamma is None else f",gamma={gamma:g}")] = round(rmse, 5)
            if best is None or rmse < best[0]:
                best = (rmse, C, gamma, k, oof)
    rmse, C, gamma, k, oof = best  # type: ignore[misc]
    coef, intercept = _fit_labels(k, scaled, C)
    keep = np.flatnonzero(np.abs(coef).sum(axis=1) > 0)
    member = KernelSVR(kind, C, gamma, inputs.take(keep), coef[keep], intercept, y_mean, y_std,
                       vector_mean, vector_scale, rmse, tried)  # fmt: skip
    return member, oof
