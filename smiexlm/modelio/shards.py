"""Sharded safetensors: a tensor dict split into files of at most N MiB, plus a JSON index.

A sharded set ``STEM`` in a folder is

* ``STEM-00001-of-00003.safetensors`` … — each at most ``max_shard_mib`` MiB on disk, the
  tensors in name order, a tensor never split across files;
* ``STEM.safetensors.index.json`` — the Hugging Face index layout::

      {"metadata": {"format": "smiexlm-shards/1", "total_size": 41234567,
                    "max_shard_bytes": 16777216, "sha256": {"STEM-00001-of-00003.safetensors": …},
                    …caller's metadata…},
       "weight_map": {"encoder.layers.0.attn.qkv.weight": "STEM-00001-of-00003.safetensors", …}}

A model folder whose weights are sharded holds the set ``model`` instead of
``model.safetensors`` (:mod:`smiexlm.modelio.weights` writes and reads either). No pickle: the
shards are safetensors and the index is JSON. Loading checks that every shard is present and
unchanged (sha256) and that the shards hold exactly the tensors the index lists.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from smiexlm.atomic import write_text_atomic
from smiexlm.errors import ConfigError, DataError
from smiexlm.modelio.integrity import load_tensors
from smiexlm.paths import file_sha256, read_json_file

FORMAT = "smiexlm-shards/1"
MODEL_STEM = "model"
INDEX_SUFFIX = ".safetensors.index.json"
MIB = 1 << 20
# safetensors header bytes per tensor beyond its name: dtype, shape, offsets, JSON punctuation
_HEADER_PER_TENSOR = 96
_HEADER_FIXED = 8 + 64


def index_name(stem: str = MODEL_STEM) -> str:
    return stem + INDEX_SUFFIX


def shard_name(stem: str, number: int, count: int) -> str:
    """``model-00002-of-00003.safetensors`` for shard 2 of 3 (numbered from 1)."""
    return f"{stem}-{number:05d}-of-{count:05d}.safetensors"


def is_sharded(folder: Path | str, stem: str = MODEL_STEM) -> bool:
    """True when ``folder`` holds the index of a sharded set ``stem``."""
    return (Path(folder) / index_name(stem)).is_file()


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def plan_shards(tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> list[list[str]]:
    """Tensor names per shard, by first fit in name order: each tensor goes to the first shard
    with room for it, so the shards are few and nearly full.

    The estimate counts each tensor's bytes plus its share of the safetensors header, so a
    written shard stays under ``max_shard_bytes``. A tensor larger than the limit on its own
    raises ConfigError naming it."""
    shards: list[tuple[list[str], list[int]]] = []  # (names, [bytes used])
    for name in sorted(tensors):
        cost = _nbytes(tensors[name]) + _HEADER_PER_TENSOR + len(name.encode())
        if _HEADER_FIXED + cost > max_shard_bytes:
            raise ConfigError(
                "max_shard_mib",
                round(max_shard_bytes / MIB, 3),
                f"at least {math.ceil(100 * (_HEADER_FIXED + cost) / MIB) / 100} MiB: tensor {name!r} "
                f"{tuple(tensors[name].shape)} alone takes {_nbytes(tensors[name]):,} bytes",
            )
        for names, used in shards:
            if used[0] + cost <= max_shard_bytes:
                names.append(name)
                used[0] += cost
                break
        else:
            shards.append(([name], [_HEADER_FIXED + cost]))
    return [names for names, _ in shards]


def save_sharded(
    tensors: dict[str, torch.Tensor],
    folder: Path | str,
    max_shard_mib: float = 16.0,
    stem: str = MODEL_STEM,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``tensors`` as shards of at most ``max_shard_mib`` MiB and the index; returns the
    index path. ``metadata`` (JSON-able) is stored in the index beside the shard checksums.

    Old shards of the same stem in ``folder`` are removed first, so a re-sharded set never
    mixes with a previous one."""
    from safetensors.torch import save_file

    if not max_shard_mib > 0:
        raise ConfigError("max_shard_mib", max_shard_mib, "a positive number of MiB")
    if not tensors:
        raise ConfigError("tensors", "{}", "at least one tensor to save")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    limit = int(max_shard_mib * MIB)
    cpu = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    plan = plan_shards(cpu, limit)
    for old in folder.glob(f"{stem}-*-of-*.safetensors"):
        old.unlink()
    weight_map: dict[str, str] = {}
    checksums: dict[str, str] = {}
    for number, names in enumerate(plan, start=1):
        filename = shard_name(stem, number, len(plan))
        path = folder / filename
        save_file({n: cpu[n] for n in names}, str(path), metadata={"format": "pt"})
        size = path.stat().st_size
        if size > limit:  # the header estimate is generous; this guards the promise anyway
            raise DataError(
                f"shard {filename!r} has {size:,} bytes, over the {limit:,}-byte limit "
                f"(max_shard_mib={max_shard_mib})"
            )
        checksums[filename] = file_sha256(path)
        weight_map.update(dict.fromkeys(names, filename))
    meta = {
        "format": FORMAT,
        "total_size": sum(_nbytes(t) for t in cpu.values()),
        "max_shard_bytes": limit,
        "sha256": checksums,
        **(metadata or {}),
    }
    index = folder / index_name(stem)
    write_text_atomic(index, json.dumps({"metadata": meta, "weight_map": weight_map}, indent=1))
    return index


def read_index(index_path: Path | str) -> tuple[dict[str, Any], dict[str, str]]:
    """``(metadata, weight_map)`` of an index file, checked for shape."""
    path, doc = read_json_file(index_path, "shard index")
    meta, weight_map = doc.get("metadata", {}), doc.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise DataError(f"shard index {str(path)!r}: expected a non-empty 'weight_map' object")
    if not isinstance(meta, dict):
        raise DataError(f"shard index {str(path)!r}: 'metadata' must be an object")
    return meta, weight_map


def load_sharded(index_path: Path | str, verify: bool = True) -> dict[str, torch.Tensor]:
    """Every tensor of a sharded set, on CPU. ``index_path`` is the index file or a folder
    holding ``model.safetensors.index.json``.

    A missing or changed shard (sha256, when ``verify``), a tensor the index lists but its
    shard lacks, or a tensor no index entry names raises DataError naming the file."""
    index_path = Path(index_path)
    if index_path.is_dir():
        index_path = index_path / index_name()
    meta, weight_map = read_index(index_path)
    folder = index_path.parent
    checksums = meta.get("sha256", {}) if verify else {}
    out: dict[str, torch.Tensor] = {}
    for filename in sorted(set(weight_map.values())):
        path = folder / filename
        if Path(filename).name != filename or not path.is_file():
            raise DataError(
                f"shard {filename!r} named by {index_path.name} is missing from "
                f"{str(folder)!r}: the sharded checkpoint is incomplete"
            )
        expected = checksums.get(filename)
        if expected is not None and file_sha256(path) != expected:
            raise DataError(
                f"shard {str(path)!r} has changed since it was written (sha256 differs from "
                f"{index_path.name}): the file is truncated or corrupted"
            )
        loaded = load_tensors(path)
        listed = {n for n, f in weight_map.items() if f == filename}
        if set(loaded) != listed:
            missing, extra = sorted(listed - set(loaded)), sorted(set(loaded) - listed)
            raise DataError(
                f"shard {str(path)!r} does not match {index_path.name}: missing tensors "
                f"{missing[:5]}, unlisted tensors {extra[:5]}"
            )
        out.update(loaded)
    return out
