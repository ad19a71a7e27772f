"""The scaler of hybrid features: ECFP4 bits, RDKit 2D descriptors or both beside the pooled
embedding.

``--features ecfp4|rdkit2d|both`` computes the raw features
(:func:`smiexlm.fingerprints.molecule_features`), and a :class:`FeatureScaler` fitted on the
**train split only** fills missing values with the train median, standardises each column
with the train mean and standard deviation (columns constant on train get std 1, so they stay
0) and clips to ±``clip`` so a bit seen once in training cannot dominate the head. The scaler
is saved with the fine-tuned model and applied at prediction time; the RF baseline scales its
descriptors with it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class FeatureScaler:
    """Train-split statistics of (N, F) raw features of ``kind``, saved with the model."""

    kind: str
    median: np.ndarray  # (F,)
    mean: np.ndarray  # (F,)
    std: np.ndarray  # (F,)
    clip: float = 5.0

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
                   std.astype(np.float32), clip)  # fmt: skip

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
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> FeatureScaler:
        arrays = {k: np.asarray(data[k], dtype=np.float32) for k in ("median", "mean", "std")}
        return cls(data["kind"], clip=float(data["clip"]), **arrays)
