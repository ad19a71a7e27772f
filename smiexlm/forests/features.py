"""The scaler of hybrid features: ECFP4 bits, RDKit 2D descriptors or both beside the pooled
embedding.

``--features ecfp4|rdkit2d|both`` computes the raw features
(:func:`smiexlm.chemistry.fingerprints.molecule_features`), and a :class:`FeatureScaler` fitted on the
**train split only** fills missing values with the train median, standardises each column
with the train mean and standard deviation (columns constant on train get std 1, so they stay
0) and clips to ±``clip`` so a bit seen once in training cannot dominate the head. The scaler
is saved with the fine-tuned model and applied at prediction time; the RF baseline scales its
descriptors with it too.

Fingerprints and descriptors are RDKit's, and RDKit changes them between releases: the scaler
records the version it was fitted with, and serving it elsewhere says so once per folder
(:meth:`FeatureScaler.from_dict` with ``where``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)
_WARNED: set[str] = set()  # folders already told that their RDKit differs


def features_version() -> str:
    """What decides the feature values: ``"RDKit 2026.09.1"``."""
    import rdkit

    return f"RDKit {rdkit.__version__}"


@dataclass
class FeatureScaler:
    """Train-split statistics of (N, F) raw features of ``kind``, saved with the model."""

    kind: str
    median: np.ndarray  # (F,)
    mean: np.ndarray  # (F,)
    std: np.ndarray  # (F,)
    clip: float = 5.0
    version: str | None = None  # features_version() at fit; None in folders saved before

    @classmethod
    def fit(cls, raw: np.ndarray, kind: str, clip: float = 5.0) -> FeatureScaler:
        """Statistics of ``raw`` (N_train, F); NaN = not computable."""
        with np.errstate(all="ignore"):
            median = np.nanmedian(raw, axis=0)
        median = np.where(np.isfinite(median), median, 0.0)
        filled = np.where(np.isnan(raw), median, raw)
        mean, std = filled.mean(axis=0), filled.std(axis=0)
        std = np.where(std > 1e-8, std, 1.0)
        return cls(kind, median.astype(np.float32), mean.astype(np.float32),
                   std.astype(np.float32), clip, features_version())  # fmt: skip

    def fill(self, raw: np.ndarray) -> np.ndarray:
        """(N, F) raw features with each missing value (NaN) the column's train median."""
        return np.where(np.isnan(raw), self.median, raw)

    def transform(self, raw: np.ndarray) -> np.ndarray:
        """(N, F) raw features -> (N, F) float32 filled, normalised, clipped."""
        z = (self.fill(raw) - self.mean) / self.std
        return np.clip(z, -self.clip, self.clip).astype(np.float32)

    def to_dict(self) -> dict:
        return {
            "kind": self.kind, "clip": self.clip, "median": self.median.tolist(),
            "mean": self.mean.tolist(), "std": self.std.tolist(),
        } | ({} if self.version is None else {"version": self.version})  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict, where: str | None = None) -> FeatureScaler:
        """The scaler of :meth:`to_dict`. ``where`` (the folder it serves) warns, once per
        folder, when it was fitted with another RDKit than this one."""
        arrays = {k: np.asarray(data[k], dtype=np.float32) for k in ("median", "mean", "std")}
        scaler = cls(data["kind"], clip=float(data["clip"]), version=data.get("version"), **arrays)
        now = features_version()
        if where is not None and scaler.version not in (None, now) and where not in _WARNED:
            _WARNED.add(where)
            log.warning("%s: its %s features were fitted with %s and are computed here with %s, "
                        "whose values may differ: install the first to serve them as trained",
                        where, scaler.kind, scaler.version, now)  # fmt: skip
        return scaler
