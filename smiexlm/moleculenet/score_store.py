"""A compact copy of a cell's per-molecule scores, so that committed results stay light.

A finished cell ``<root>/<set>/seed<k>/`` keeps its scores in ``predictions.npz`` (float32,
regenerable, not committed). :func:`compact` writes beside it ``predictions.parquet``: one
Parquet row per (part, molecule), the scores as float16, the nearest training similarities
beside them where the cell kept them. Probabilities are kept by their distance to the nearer
end (``p`` below one half, ``-(1 - p)`` from it), so that float16's relative precision serves
both tails: a network's confident scores near 1 stay apart, as ranks need them. Bootstraps, blends and coverage scripts read a cell
through :func:`~smiexlm.moleculenet.runs.read_predictions`, which falls back to this copy
when the cell's own file is absent. Float16 moves a test ROC-AUC by at most about 1e-4 on the
committed cells; the cell's ``result.json`` keeps the exact figure.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from smiexlm.atomic import atomic_paths
from smiexlm.errors import DataError

STORE_NAME = "predictions.parquet"
PARTS = ("valid", "test")
NEARNESS = ("tanimoto", "cosine")


def compact(root: Path, skip: Iterable[str] = ()) -> int:
    """Write the compact copy of every cell ``root/<set>/seed<k>/predictions.npz`` (sets in
    ``skip`` left out) beside it; the number of cells. DataError when there is none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    skip = set(skip)
    files = [p for p in sorted(Path(root).glob("*/seed*/predictions.npz"))
             if p.parent.parent.name not in skip]  # fmt: skip
    if not files:
        raise DataError(f"{str(root)!r}: no <set>/seed<k>/predictions.npz to compact")
    for path in files:
        with atomic_paths(path.parent / STORE_NAME) as (tmp,):
            pq.write_table(_cell_table(pa, path), tmp, compression="zstd", compression_level=19)
    return len(files)


def encoding_of(scores: np.ndarray) -> str:
    """ "tails" for probabilities (every finite score in [0, 1]), "values" otherwise."""
    finite = scores[np.isfinite(scores)]
    return "values" if finite.size and (finite.min() < 0.0 or finite.max() > 1.0) else "tails"


def encode(scores: np.ndarray, encoding: str) -> np.ndarray:
    """float16 codes of ``scores``: as they are ("values"), or by their signed distance to
    the nearer end ("tails": ``p`` below one half, ``-(1 - p)`` from it)."""
    if encoding == "tails":
        scores = np.where(scores < 0.5, scores, -(1.0 - scores))
    return scores.astype(np.float16)


def decode(codes: np.ndarray, encoding: str) -> np.ndarray:
    """float32 scores from :func:`encode`'s codes."""
    codes = codes.astype(np.float64)
    if encoding == "tails":
        codes = np.where(np.signbit(codes), 1.0 + codes, codes)
    return codes.astype(np.float32)


def _cell_table(pa, path: Path):
    with np.load(path) as kept:
        arrays = {key: kept[key] for key in kept.files}
    encoding = encoding_of(np.concatenate([arrays[p].ravel() for p in PARTS]))
    columns: dict[str, list] = {"part": [], "row": [], "scores": [], **{k: [] for k in NEARNESS}}
    for part in PARTS:
        scores = encode(arrays[part], encoding)
        n = len(scores)
        columns["part"].append(pa.array([part] * n, pa.string()))
        columns["row"].append(pa.array(arrays[f"{part}_rows"].astype(np.int32)))
        offsets = np.arange(0, scores.size + 1, scores.shape[1], dtype=np.int32)
        columns["scores"].append(pa.ListArray.from_arrays(offsets, pa.array(scores.ravel())))
        for key in NEARNESS:
            near = arrays.get(f"{part}_{key}")
            columns[key].append(pa.nulls(n, pa.float16()) if near is None
                                else pa.array(near.astype(np.float16)))  # fmt: skip
    table = {k: pa.concat_arrays(v) for k, v in columns.items()}
    table["part"] = table["part"].dictionary_encode()
    return pa.table(table, metadata={"scores": encoding})


def read(folder: Path) -> dict[str, np.ndarray] | None:
    """The cell ``folder``'s arrays as ``predictions.npz`` holds them (scores as float32,
    similarities as float64) from its compact copy; None when it has none."""
    import pyarrow.parquet as pq

    path = Path(folder) / STORE_NAME
    if not path.is_file():
        return None
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:
        raise DataError(f"{str(path)!r}: not a readable score file ({err})") from err
    encoding = (table.schema.metadata or {}).get(b"scores", b"values").decode()
    arrays: dict[str, np.ndarray] = {}
    parts = np.asarray(table.column("part").to_pylist())
    for part in PARTS:
        chosen = table.filter(parts == part)
        scores = chosen.column("scores").combine_chunks()
        width = len(scores[0]) if len(scores) else 0
        arrays[f"{part}_rows"] = chosen.column("row").to_numpy().astype(np.int64)
        codes = scores.flatten().to_numpy(zero_copy_only=False)
        arrays[part] = decode(codes, encoding).reshape(len(chosen), width)
        for key in NEARNESS:
            column = chosen.column(key)
            if column.null_count == 0:
                arrays[f"{part}_{key}"] = column.to_numpy().astype(np.float64)
    return arrays
