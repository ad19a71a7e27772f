"""A model folder's ``whitening.safetensors``: written, read back and checked.

The file holds, for each pooling it whitens, tensors ``{pooling}.mean`` (d,) and
``{pooling}.matrix`` (d, d) float32 (n·d wide for a combined pooling fitted jointly; names
``{pooling}@{n}``, n times as wide, for the last n blocks side by side), with the
corpus it was fitted on in its metadata; its sha256 is recorded in the folder's
``checksums.json``. The maths is :mod:`smiexlm.whitening`; fitting one on a corpus is
``smiexlm whiten`` (:mod:`smiexlm.embedding.whitening_fit`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.atomic import write_bytes_atomic
from smiexlm.errors import ConfigError, DataError
from smiexlm.model.pooling import pooling_parts
from smiexlm.modelio.integrity import read_checksums, record_checksums, verify_checksum
from smiexlm.modelio.layout import WHITENING_NAME
from smiexlm.whitening import Whitening, parse_whitening_key

WHITENING_FORMAT = "smiexlm-whitening/1"


def save_whitening(
    folder: str | Path, whitenings: Mapping[str, Whitening], source: Mapping[str, Any]
) -> Path:
    """Write ``whitening.safetensors`` (one whitening per pooling) and record its sha256 in the
    folder's ``checksums.json``; a model folder without one (written before they existed) is
    left without, unverified as before: a record of this file alone would fail its weights."""
    from safetensors.numpy import save

    tensors = {}
    for pooling, w in whitenings.items():
        tensors[f"{pooling}.mean"] = np.ascontiguousarray(w.mean, dtype=np.float32)
        tensors[f"{pooling}.matrix"] = np.ascontiguousarray(w.matrix, dtype=np.float32)
    metadata = {"format": WHITENING_FORMAT, "source": json.dumps(dict(source), sort_keys=True)}
    folder = Path(folder)
    path = write_bytes_atomic(folder / WHITENING_NAME, save(tensors, metadata))
    weights = [p for p in folder.glob("*.safetensors") if p.name != WHITENING_NAME]
    if read_checksums(folder) is not None or not weights:
        record_checksums(folder, WHITENING_NAME)
    return path


def load_whitening(folder: str | Path, dim: int) -> dict[str, Whitening] | None:
    """The whitenings of a model folder by pooling (None without ``whitening.safetensors``),
    checked against its recorded sha256 and the model's width ``dim``."""
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load

    path = Path(folder) / WHITENING_NAME
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
            parts, layers = parse_whitening_key(pooling)
        except ConfigError:
            raise DataError(f"{str(path)!r}: tensor names start with {pooling!r}, not a "
                            "pooling (cls, mean, max, or several joined by '+', then '@n' for "
                            "the last n blocks)") from None  # fmt: skip
        width = dim * len(pooling_parts(parts)) * layers
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


def whitening_source(folder: str | Path) -> dict[str, Any]:
    """What a folder's whitening was fitted on (the metadata ``smiexlm whiten`` wrote)."""
    from safetensors import safe_open

    with safe_open(str(Path(folder) / WHITENING_NAME), "np") as handle:
        return json.loads((handle.metadata() or {}).get("source", "{}"))
