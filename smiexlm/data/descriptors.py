"""Descriptor targets beside the token shards (``smiexlm preprocess --descriptors rdkit2d``).

Workers compute every RDKit 2D descriptor of each kept molecule's final SMILES with
:func:`smiexlm.chemistry.fingerprints.compute_descriptors`, the package's one descriptor code. A value
RDKit cannot compute, an infinity or a value beyond ±``DESCRIPTOR_LIMIT`` is stored as NaN
(masked by the losses), never dropped; a SMILES RDKit cannot parse (possible with
``--no-canonicalize``) gets a row of NaN. NaN values are counted per split and descriptor in
``manifest.json``.

Storage. ``{split}-NNNNN.desc`` holds the (n, D) float32 rows of the token shard of the same
name, row i = molecule i, in NumPy's ``.npy`` layout (a short text header with dtype and
shape, then the raw little-endian rows): ``np.load(path, mmap_mode="r")`` maps it without
pickle. float32 because values reach ``DESCRIPTOR_LIMIT`` = 1e15, past float16. The file is
written with its token shard (to a temporary name, renamed, before the ``.idx``) and
committed by the same ``progress.json`` update, so resume drops or keeps both together.

When every shard is written, robust normalisation statistics are fitted on the train split
(:mod:`smiexlm.chemistry.descriptor_stats`) and saved as ``descriptors.json`` in the dataset folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from smiexlm.chemistry.descriptor_stats import STATS_NAME, fit_descriptor_stats
from smiexlm.chemistry.fingerprints import descriptor_names, descriptor_version
from smiexlm.data.shards import locate_row
from smiexlm.errors import DataError
from smiexlm.paths import file_sha256

DESC_SUFFIX = "desc"
DESC_DTYPE = "<f4"


def count_nan(counts: dict[str, list[int]], split: str, values: np.ndarray) -> None:
    """Add the NaN values per descriptor of ``values`` (n, D) to ``counts[split]``."""
    per_column = np.isnan(values).sum(axis=0)
    previous = counts.get(split) or [0] * values.shape[1]
    counts[split] = [int(a) + int(b) for a, b in zip(previous, per_column, strict=True)]


def open_descriptor_shard(folder: Path, shard: dict, n_descriptors: int) -> np.ndarray:
    """The (n, D) float32 rows of one shard, memory-mapped, after checking the file against
    the manifest entry (shape, dtype and sha256 when recorded)."""
    path = Path(folder) / f"{shard['name']}.{DESC_SUFFIX}"
    if not path.is_file():
        raise DataError(
            f"descriptor shard {str(path)!r} is missing: the dataset was built without "
            "--descriptors or is incomplete"
        )
    expected = shard.get("sha256", {}).get(DESC_SUFFIX)
    if expected is not None and (digest := file_sha256(path)) != expected:
        raise DataError(
            f"descriptor shard {str(path)!r} has sha256 {digest[:16]}…: the manifest records "
            f"{expected[:16]}…; the file was changed or corrupted"
        )
    shape = (shard["molecules"], n_descriptors)
    try:
        rows = np.load(path, mmap_mode="r", allow_pickle=False) if shape[0] else None
    except (ValueError, OSError) as err:
        raise DataError(f"descriptor shard {str(path)!r} is not a .npy array: {err}") from None
    if rows is None:
        return np.zeros(shape, dtype=DESC_DTYPE)
    if rows.shape != shape or rows.dtype != np.dtype(DESC_DTYPE) or rows.ndim != 2:
        raise DataError(
            f"descriptor shard {str(path)!r} holds {rows.dtype} {rows.shape}: expected float32 "
            f"{shape} (the token shard's molecules × the manifest's descriptors)"
        )
    return rows


class DescriptorTable:
    """The descriptor rows of one split, aligned with ``TokenDataset(folder, split)``:
    ``table[i]`` is the (D,) float32 raw descriptor row of molecule i (NaN = missing)."""

    def __init__(self, folder: str | Path, split: str, manifest: dict) -> None:
        section = manifest.get("descriptors")
        if not isinstance(section, dict) or not section.get("names"):
            raise DataError(
                f"dataset {str(folder)!r} has no descriptor targets: rebuild it with "
                "`smiexlm preprocess ... --descriptors rdkit2d`"
            )
        self.names: list[str] = list(section["names"])
        shards = manifest["splits"][split]["shards"]
        self._rows = [open_descriptor_shard(Path(folder), s, len(self.names)) for s in shards]
        counts = np.array([len(r) for r in self._rows], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])  # (n_shards + 1,)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index: int) -> np.ndarray:
        shard, local = locate_row(self._starts, index)
        return np.array(self._rows[shard][local])


def finish_descriptors(
    out: Path, kind: str, shards: dict[str, list[dict]], nan_counts: dict[str, list[int]]
) -> dict:
    """Fit the statistics on the train shards, write ``descriptors.json``; the manifest's
    ``descriptors`` section (names, NaN counts per split and descriptor, where the stats are)."""
    names = descriptor_names(kind)
    train = [open_descriptor_shard(out, s, len(names)) for s in shards.get("train", [])]
    version = descriptor_version(kind)
    stats = fit_descriptor_stats(train, kind, names, version=version)
    stats.save(out / STATS_NAME)
    nan = {
        split: {n: c for n, c in zip(names, counts, strict=True) if c}
        for split, counts in sorted(nan_counts.items())
    }
    return {
        "kind": kind,
        "version": version,
        "dtype": "float32",
        "count": len(names),
        "names": names,
        "stats": STATS_NAME,
        "nan": nan,  # split -> descriptor -> NaN values (descriptors left out have none)
    }
