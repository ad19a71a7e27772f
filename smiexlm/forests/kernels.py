"""Support-vector machines with a kernel on fingerprints, on an embedding, or on both: the
member that small potency sets are known to favour (kernel methods on ECFP4 beat most deep
models on a few hundred to a few thousand molecules), for regression (SVR) and for
classification (SVC, balanced class weights).

Kernels (:data:`KERNELS`), between molecules ``a`` and ``b``:

- ``tanimoto``: the Tanimoto similarity of their ECFP4 bits, |a & b| / |a | b|;
- ``rbf``: exp(-gamma |z_a - z_b|^2 / D) of a D-dimensional embedding ``z`` standardised on
  the training molecules (gamma of :data:`GAMMAS`);
- ``both``: the mean of the two, each in [0, 1].

Each label gets its own :class:`sklearn.svm.SVR` on the precomputed kernel, its values
standardised on the training molecules, or its own :class:`sklearn.svm.SVC` (scores: the
decision values, which a classification blend replaces by their quantiles). ``C`` (and
``gamma``) are chosen by cross-validation on the training molecules alone, in folds that keep
each Murcko scaffold whole (:func:`fit_kernel_member`): the lowest out-of-fold RMSE, or the
highest out-of-fold ROC-AUC averaged over the labels, as the test molecules of a scaffold
split are of scaffolds the training ones do not hold; the same folds give every training
molecule a score from a model that did not see it (out-of-fold), which a combination of
members is fitted on.

A fitted member is its support molecules' bits or embeddings, one dual coefficient per
support molecule and label, and the intercepts: :meth:`KernelMember.predict` is one kernel
matrix and one product, and :meth:`KernelMember.tensors` is what a model folder stores of it
(safetensors, no pickle), beside :meth:`KernelMember.record` (JSON).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from smiexlm.chemistry.fingerprints import bit_tanimoto as tanimoto
from smiexlm.errors import ConfigError, DataError, check_choice

KERNELS = ("tanimoto", "rbf", "both")
CS = (0.3, 1.0, 3.0, 10.0, 30.0)  # regression
CLASSIFY_CS = (0.1, 0.3, 1.0, 3.0, 10.0)
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
class KernelMember:
    """A fitted member (see the module docstring): ``support`` the support molecules'
    inputs, ``coef`` (S, T) their dual coefficients per label (0 where a molecule supports
    another label only), ``intercept`` (T,), in standardised units undone by ``y_mean`` and
    ``y_std`` (0 and 1 for classification); ``vector_mean`` and ``vector_scale`` standardise
    an embedding. ``cv_score``: the chosen setting's out-of-fold RMSE (labels' units) or
    ROC-AUC (mean over the labels); ``tried``: each setting's."""

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
    task_type: str = "regression"
    cv_score: float = float("nan")
    tried: dict[str, float] = field(default_factory=dict)  # "C=1,gamma=0.3" -> CV score

    @property
    def cv_metric(self) -> str:
        return "rmse" if self.task_type == "regression" else "roc_auc"

    def standardised(self, inputs: KernelInputs) -> KernelInputs:
        if inputs.vectors is None or self.vector_mean is None:
            return inputs
        return KernelInputs(inputs.bits, (inputs.vectors - self.vector_mean) / self.vector_scale)

    def predict(self, inputs: KernelInputs) -> np.ndarray:
        """(N, T) float64 values in the labels' units, or decision values (classification)."""
        inputs = self.standardised(inputs)
        out = np.empty((len(inputs), self.coef.shape[1]), dtype=np.float64)
        for start in range(0, len(inputs), CHUNK):
            rows = np.arange(start, min(start + CHUNK, len(inputs)))
            k = kernel_matrix(self.kernel, inputs.take(rows), self.support, self.gamma)
            out[rows] = k @ self.coef + self.intercept
        return out * self.y_std + self.y_mean

    def record(self) -> dict[str, Any]:
        """What JSON keeps of the member (its arrays: :meth:`tensors`)."""
        doc = {"kernel": self.kernel, "C": self.C, "gamma": self.gamma,
               f"cv_{self.cv_metric}": self.cv_score, "tried": self.tried,
               "n_support": int(len(self.coef))}  # fmt: skip
        return doc | ({} if self.task_type == "regression" else {"task_type": self.task_type})

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
                    where: str) -> KernelMember:  # fmt: skip
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
        task_type, cv, gamma, tried = _checked_settings(record, kind, where)
        return cls(kind, float(record["C"]), gamma, support, coef,
                   arrays["intercept"], arrays["y_mean"], arrays["y_std"],
                   arrays.get("vector_mean"), arrays.get("vector_scale"), task_type, cv,
                   dict(tried))  # fmt: skip


def _checked_settings(record: dict[str, Any], kind: str, where: str) -> tuple:
    """(task_type, cv score, gamma, tried) of a stored member's ``record``; DataError naming
    ``where`` and the field for a value fitting never records."""
    task_type = record.get("task_type", "regression")
    cv = record.get("cv_rmse" if task_type == "regression" else "cv_roc_auc")
    gamma, tried = record.get("gamma"), record.get("tried", {})
    positive = "a number above 0"
    for name, value, ok, expected in (
        ("C", record.get("C"), _positive(record.get("C")), positive),
        ("gamma", gamma, gamma is None if kind == "tanimoto" else _positive(gamma),
         "none" if kind == "tanimoto" else positive),
        ("task_type", task_type, task_type in ("regression", "classification"),
         "regression or classification"),
        ("its cv score", cv, cv is None or _number(cv), "a number"),
        ("tried", tried, isinstance(tried, dict), "a table"),
    ):  # fmt: skip
        if not ok:
            raise DataError(f"{where}: {name} = {value!r}: expected {expected}")
    return task_type, float("nan") if cv is None else float(cv), gamma, tried


def _number(value: Any) -> bool:
    return type(value) in (int, float)


def _positive(value: Any) -> bool:
    return _number(value) and math.isfinite(value) and value > 0


def _folds(groups: np.ndarray, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Scaffold-whole folds of ``n`` training molecules (plain folds where too few
    scaffolds)."""
    from sklearn.model_selection import GroupKFold, KFold

    splits = min(FOLDS, len(np.unique(groups)))
    if splits >= 2:
        return list(GroupKFold(n_splits=splits).split(np.zeros(n), groups=groups))
    return list(KFold(n_splits=min(FOLDS, n), shuffle=True, random_state=0).split(np.zeros(n)))


def _fit_labels(k_fit: np.ndarray, y: np.ndarray, C: float,
                task_type: str) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Dual coefficients (n, T) and intercepts (T,) of one SVR (or balanced SVC) a label, on a
    precomputed kernel between the ``n`` molecules; a label's missing values take no part, a
    regression label none of them holds (in a fold of a sparse table) scores NaN, and a
    classification label of one class among them scores that class's sign everywhere."""
    from sklearn.svm import SVC, SVR

    coef, intercept = np.zeros(y.shape), np.zeros(y.shape[1])
    for t in range(y.shape[1]):
        rows = np.flatnonzero(~np.isnan(y[:, t]))
        if task_type == "regression" and not len(rows):  # a sparse label's fold: no value
            intercept[t] = np.nan
            continue
        if task_type == "classification" and len(np.unique(y[rows, t])) < 2:
            intercept[t] = 1.0 if len(rows) and y[rows[0], t] > 0.5 else -1.0
            continue
        machine = (SVR(kernel="precomputed", C=C, epsilon=EPSILON) if task_type == "regression"
                   else SVC(kernel="precomputed", C=C, class_weight="balanced"))  # fmt: skip
        machine.fit(k_fit[np.ix_(rows, rows)], y[rows, t])
        coef[rows[machine.support_], t] = machine.dual_coef_[0]
        intercept[t] = machine.intercept_[0]
    return coef, intercept


def _cv_score(y: np.ndarray, oof: np.ndarray, task_type: str) -> float:
    """Out-of-fold RMSE over the labelled cells, or ROC-AUC averaged over the labels that hold
    both classes."""
    if task_type == "regression":
        return float(np.sqrt(np.nanmean((oof - y) ** 2)))
    from smiexlm.moleculenet.metrics import multitask_roc_auc

    return multitask_roc_auc(y, oof).mean


def fit_kernel_member(
    kind: str, inputs: KernelInputs, y: np.ndarray, groups: np.ndarray,
    task_type: str = "regression",
) -> tuple[KernelMember, np.ndarray]:  # fmt: skip
    """The member of kernel ``kind`` fitted on all of ``inputs`` and ``y`` ((N, T), NaN =
    missing; 0/1 for classification), ``C`` and ``gamma`` those of the best out-of-fold
    score in scaffold-whole folds (``groups``: one scaffold id a molecule); and its (N, T)
    out-of-fold predictions."""
    if kind not in KERNELS:
        raise ConfigError("kernel", kind, f"one of {', '.join(KERNELS)}")
    check_choice("task_type", task_type, ("regression", "classification"))
    inputs = KernelInputs(
        inputs.bits if kind != "rbf" else None, inputs.vectors if kind != "tanimoto" else None
    )  # what it reads
    if (kind != "rbf" and inputs.bits is None) or (kind != "tanimoto" and inputs.vectors is None):
        raise ConfigError("kernel", kind, "inputs with the bits and the embedding it reads")
    y = np.asarray(y, np.float64).reshape(len(inputs), -1)
    regression = task_type == "regression"
    y_mean = np.nanmean(y, axis=0) if regression else np.zeros(y.shape[1])
    y_std = np.nanstd(y, axis=0) + 1e-12 if regression else np.ones(y.shape[1])
    scaled = (y - y_mean) / y_std
    vector_mean = vector_scale = None
    if inputs.vectors is not None:
        vector_mean = inputs.vectors.mean(axis=0)
        vector_scale = inputs.vectors.std(axis=0) + 1e-6
    probe = KernelMember(kind, 1.0, None, inputs, np.zeros((0, 1)), np.zeros(1), y_mean, y_std,
                         vector_mean, vector_scale)  # fmt: skip
    inputs = probe.standardised(inputs)
    folds = _folds(np.asarray(groups), len(inputs))
    sign = 1.0 if regression else -1.0  # the lower sign * score, the better
    best, tried = None, {}
    for gamma in (None,) if kind == "tanimoto" else GAMMAS:
        k = kernel_matrix(kind, inputs, inputs, gamma)
        for C in CS if regression else CLASSIFY_CS:
            oof = np.full(y.shape, np.nan)
            for fit_rows, held in folds:
                coef, b = _fit_labels(k[np.ix_(fit_rows, fit_rows)], scaled[fit_rows], C,
                                      task_type)  # fmt: skip
                oof[held] = k[np.ix_(held, fit_rows)] @ coef + b
            oof = oof * y_std + y_mean
            score = _cv_score(y, oof, task_type)
            tried[f"C={C:g}" + ("" if gamma is None else f",gamma={gamma:g}")] = round(score, 5)
            if best is None or sign * score < sign * best[0]:
                best = (score, C, gamma, k, oof)
    score, C, gamma, k, oof = best  # type: ignore[misc]
    coef, intercept = _fit_labels(k, scaled, C, task_type)
    keep = np.flatnonzero(np.abs(coef).sum(axis=1) > 0)
    member = KernelMember(kind, C, gamma, inputs.take(keep), coef[keep], intercept, y_mean,
                          y_std, vector_mean, vector_scale, task_type, score, tried)  # fmt: skip
    return member, oof
