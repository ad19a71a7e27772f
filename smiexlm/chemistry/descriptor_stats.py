"""Robust normalisation of descriptor targets: per-descriptor median and scaled IQR, clipped.

``z = clip((x - median) / s, -clip, clip)`` with ``s = IQR / 1.349`` (the IQR of a standard
normal, so ``s`` is the standard deviation for Gaussian data and z reads as a standard score).
Statistics are fitted on the train split of a dataset only, stored with it as
``descriptors.json`` and copied into every model folder trained on it, so that a model's
predictions are turned back into descriptor units with the same numbers.

Why median/IQR rather than mean/std or a quantile transform. RDKit descriptors are heavy
tailed (``Ipc`` spans 15 orders of magnitude, ``BertzCT`` and the ``fr_*`` counts have long
right tails): a mean and a standard deviation are dominated by a handful of molecules, while
the median and the IQR are not. A quantile transform would be more robust still, but it is
non-linear: it needs a table of quantiles per descriptor, flattens the tails into the same
value, and its inverse is only piecewise linear. The median/IQR map is affine, so
denormalising a prediction is one multiply-add and stays exact, and clipping at ±``clip``
bounds what an outlier can add to the loss.

A descriptor whose IQR is 0 (a fragment count that is 0 for most molecules) uses the standard
deviation of its finite values instead; a constant one uses 1. A descriptor without a finite
training value gets centre 0 and scale 1. Missing values (NaN) stay NaN: losses mask them.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.atomic import write_text_atomic
from smiexlm.errors import ConfigError, DataError
from smiexlm.paths import read_json_file

STATS_NAME = "descriptors.json"
STATS_FORMAT = "smiexlm-descriptor-stats/1"
IQR_TO_SIGMA = 1.3489795003921634  # IQR of the standard normal distribution
DEFAULT_CLIP = 5.0  # normalised values beyond ±5 "sigma" are clipped


@dataclass
class DescriptorStats:
    """Per-descriptor ``center`` (median) and ``scale`` (> 0) of a dataset's train split."""

    kind: str  # "rdkit2d"
    names: list[str]  # (D,) descriptor names, in column order
    center: np.ndarray  # (D,) float64
    scale: np.ndarray  # (D,) float64, > 0
    clip: float = DEFAULT_CLIP
    n_fit: int = 0  # train molecules the statistics were fitted on
    n_finite: list[int] = field(default_factory=list)  # (D,) finite values per descriptor
    version: str = ""  # what computed the descriptors, e.g. "RDKit 2026.09.1"

    def __post_init__(self) -> None:
        self.names = [str(n) for n in self.names]
        self.center = np.asarray(self.center, dtype=np.float64)
        self.scale = np.asarray(self.scale, dtype=np.float64)
        d = len(self.names)
        if self.center.shape != (d,) or self.scale.shape != (d,):
            raise ConfigError(
                "center/scale", (self.center.shape, self.scale.shape), f"two ({d},) vectors"
            )
        if not (np.isfinite(self.center).all() and np.isfinite(self.scale).all()):
            raise ConfigError("center/scale", "non-finite values", "finite numbers")
        if (self.scale <= 0).any():
            raise ConfigError("scale", float(self.scale.min()), "positive numbers")
        if not (isinstance(self.clip, (int, float)) and self.clip > 0):
            raise ConfigError("clip", self.clip, "a positive number")

    @property
    def n_descriptors(self) -> int:
        return len(self.names)

    def normalize(self, values: np.ndarray) -> np.ndarray:
        """(..., D) raw values -> (..., D) float32 normalised and clipped; NaN (and inf) -> NaN."""
        x = np.asarray(values, dtype=np.float64)
        if x.shape[-1:] != (self.n_descriptors,):
            raise DataError(
                f"descriptor values of shape {x.shape}: expected (..., {self.n_descriptors})"
            )
        x = np.where(np.isfinite(x), x, np.nan)  # an infinity is missing, not clipped
        z = np.clip((x - self.center) / self.scale, -self.clip, self.clip)  # NaN passes
        return z.astype(np.float32)

    def denormalize(self, z: Any) -> Any:
        """Normalised values (numpy or torch, (..., D)) -> descriptor units (same kind)."""
        if hasattr(z, "new_tensor"):  # a torch tensor: stay on its device and dtype
            return z * z.new_tensor(self.scale) + z.new_tensor(self.center)
        return np.asarray(z, dtype=np.float64) * self.scale + self.center

    # ------------------------------------------------------------ (de)serialise
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": STATS_FORMAT,
            "method": "median/IQR, clipped",
            "kind": self.kind,
            "version": self.version,
            "clip": float(self.clip),
            "n_fit": int(self.n_fit),
            "names": list(self.names),
            "center": [float(v) for v in self.center],
            "scale": [float(v) for v in self.scale],
            "n_finite": [int(v) for v in self.n_finite],
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> DescriptorStats:
        keys = ("kind", "names", "center", "scale", "clip", "n_fit", "n_finite", "version")
        return cls(**{k: doc[k] for k in keys if k in doc})

    def save(self, path: str | Path) -> Path:
        return write_text_atomic(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> DescriptorStats:
        """Read ``descriptors.json``; a malformed file raises DataError naming it."""
        path, doc = read_json_file(path, "descriptor statistics", STATS_FORMAT)
        try:
            return cls.from_dict(doc)
        except (ConfigError, KeyError, TypeError, ValueError) as err:
            raise DataError(f"descriptor statistics {str(path)!r}: {err}") from None


def fit_descriptor_stats(
    parts: Sequence[np.ndarray],
    kind: str,
    names: Sequence[str],
    version: str = "",
    clip: float = DEFAULT_CLIP,
    block: int = 16,
) -> DescriptorStats:
    """Fit on the rows of ``parts`` ((n_i, D) arrays, e.g. memory-mapped shards).

    Exact statistics (numpy's linear-interpolation percentiles) computed ``block`` columns
    at a time, so memory stays at ``N × block`` float64 values for N rows."""
    d = len(names)
    center, scale = np.zeros(d), np.ones(d)
    n_finite = np.zeros(d, dtype=np.int64)
    n_rows = sum(len(p) for p in parts)
    for start in range(0, d, block):
        stop = min(start + block, d)
        if n_rows == 0:
            break
        x = np.concatenate([np.asarray(p[:, start:stop], dtype=np.float64) for p in parts])
        x[~np.isfinite(x)] = np.nan  # (N, b)
        n_finite[start:stop] = np.isfinite(x).sum(axis=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
            q25, q50, q75 = np.nanpercentile(x, [25, 50, 75], axis=0)
            std = np.nanstd(x, axis=0)
        s = (q75 - q25) / IQR_TO_SIGMA
        s = np.where(s > 0, s, std)
        s = np.where(np.isfinite(s) & (s > 0), s, 1.0)
        center[start:stop] = np.where(np.isfinite(q50), q50, 0.0)
        scale[start:stop] = s
    return DescriptorStats(
        kind=kind,
        names=list(names),
        center=center,
        scale=scale,
        clip=clip,
        n_fit=n_rows,
        n_finite=n_finite.tolist(),
        version=version,
    )


def load_model_descriptor_stats(directory: Path, n_descriptors: int) -> DescriptorStats | None:
    """A model folder's ``descriptors.json`` (None when absent), checked against its head."""
    path = Path(directory) / STATS_NAME
    if not path.is_file():
        return None
    stats = DescriptorStats.load(path)
    if n_descriptors and stats.n_descriptors != n_descriptors:
        raise DataError(
            f"{str(path)!r} describes {stats.n_descriptors} descriptors but the model's "
            f"config says n_descriptors={n_descriptors}: the file does not belong to this model"
        )
    return stats


def load_dataset_stats(folder: str | Path) -> DescriptorStats:
    """A dataset folder's ``descriptors.json``, the statistics fitted on its train split."""
    path = Path(folder) / STATS_NAME
    if not path.is_file():
        raise DataError(
            f"dataset {str(folder)!r} has no {STATS_NAME}: rebuild it with "
            "`smiexlm preprocess ... --descriptors rdkit2d`"
        )
    return DescriptorStats.load(path)
