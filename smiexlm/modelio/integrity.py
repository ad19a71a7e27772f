"""Checks of weight files before their tensors are trusted.

- ``checksums.json`` in a model folder records the sha256 of each weight file in it::

      {"format": "smiexlm-checksums/1", "sha256": {"model.safetensors": "<64 hex digits>"}}

  ``save_pretrained`` writes it (and so do ``smiexlm export``, training checkpoints and
  fine-tuned folders, which add ``head.safetensors`` and their record ``finetune.json``).
  Loading recomputes each digest, so weights overwritten in place (same size, intact header)
  fail instead of giving NaN. A folder without ``checksums.json`` (written before it
  existed) loads unverified, and says so on stderr once per folder and process; so does a
  ``finetune.json`` its record leaves out (saved before the record covered it), silently.
- :func:`read_header` reads a safetensors header alone (names, dtypes, shapes): a config can
  be checked against the weights before any model is allocated; :func:`load_tensors` reads
  every tensor, a truncated or foreign file failing with the file's name.
- :func:`check_finite`: loaded weights must hold no NaN or infinite value, digest or not.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from pathlib import Path

import torch

from smiexlm.atomic import write_text_atomic
from smiexlm.errors import DataError
from smiexlm.modelio.layout import CHECKSUMS_NAME
from smiexlm.paths import file_sha256, read_json_file

CHECKSUMS_FORMAT = "smiexlm-checksums/1"
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}  # fmt: skip
_SHA256 = re.compile(r"[0-9a-f]{64}")
_UNVERIFIED: set[Path] = set()  # folders without a record this process has warned about
logger = logging.getLogger(__name__)

Header = dict[str, tuple[str, tuple[int, ...]]]  # tensor name -> (dtype, shape)


def unreadable(path: Path, reason: str) -> DataError:
    return DataError(
        f"{str(path)!r} is not a readable safetensors file ({reason}): the file is truncated "
        "or corrupted"
    )


# ------------------------------------------------------------------ safetensors header
def read_header(path: Path) -> Header:
    """Names, dtypes and shapes of a safetensors file, reading its header only.

    The header must describe the file exactly: each tensor's byte range fits its dtype and
    shape, and the ranges end where the file ends (so a truncated file is caught here)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            n = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
            if not 0 < n <= min(MAX_HEADER_BYTES, size - 8):
                raise unreadable(path, f"header length {n} in a file of {size} bytes")
            doc = json.loads(handle.read(n).decode("utf-8"))
    except FileNotFoundError:
        raise DataError(f"{str(path)!r} does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise unreadable(path, "header is not JSON") from None
    if not isinstance(doc, dict):
        raise unreadable(path, "header is not a JSON object")
    doc.pop("__metadata__", None)
    header, end = {}, 0
    for name, entry in doc.items():
        header[name] = _entry(path, name, entry)
        end = max(end, entry["data_offsets"][1])
    if end != size - 8 - n:
        raise unreadable(path, f"tensor data ends at byte {end} of {size - 8 - n}")
    return header


def _entry(path: Path, name: str, entry: object) -> tuple[str, tuple[int, ...]]:
    """(dtype, shape) of one header entry whose byte range matches its dtype and shape."""
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]  # type: ignore[index]
        ints = [*shape, begin, end]
        if dtype not in _DTYPE_BYTES or not all(type(v) is int and v >= 0 for v in ints):
            raise ValueError
    except (TypeError, KeyError, ValueError):
        raise unreadable(path, f"bad header entry for tensor {name!r}") from None
    if end - begin != _DTYPE_BYTES[dtype] * _numel(shape):
        raise unreadable(path, f"tensor {name!r} {dtype} {tuple(shape)} spans {end - begin} bytes")
    return dtype, tuple(shape)


def _numel(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file; a truncated or foreign file raises DataError."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except FileNotFoundError:
        raise DataError(f"{str(path)!r} does not exist") from None
    except (SafetensorError, OSError, ValueError) as err:
        raise unreadable(path, str(err)) from None


# ------------------------------------------------------------------ sha256 records
def read_checksums(folder: Path) -> dict[str, str] | None:
    """File name -> sha256 recorded in ``folder``; None when it records none."""
    path = Path(folder) / CHECKSUMS_NAME
    if not path.is_file():
        return None
    path, doc = read_json_file(path, "checksums file", CHECKSUMS_FORMAT)
    digests = doc.get("sha256")
    if not isinstance(digests, dict) or not all(
        isinstance(v, str) and _SHA256.fullmatch(v) for v in digests.values()
    ):
        raise DataError(
            f"checksums file {str(path)!r}: expected 'sha256' to map file names to 64 "
            "lower-case hex digits"
        )
    return digests


def record_checksums(folder: Path, *names: str) -> Path:
    """Record the sha256 of ``folder/<name>`` for each name, keeping other records."""
    folder = Path(folder)
    digests = read_checksums(folder) or {}
    digests.update({name: file_sha256(folder / name) for name in names})
    doc = {"format": CHECKSUMS_FORMAT, "sha256": dict(sorted(digests.items()))}
    return write_text_atomic(folder / CHECKSUMS_NAME, json.dumps(doc, indent=1) + "\n")


def weights_file(folder: Path) -> Path:
    """The file that names a model folder's weights: ``model.safetensors``, or the index of
    sharded ones (which records each shard's sha256, checked when they load)."""
    from smiexlm.modelio.layout import WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    folder = Path(folder)
    index = folder / WEIGHTS_INDEX_NAME
    return (
        index
        if index.is_file() and not (folder / WEIGHTS_NAME).is_file()
        else folder / WEIGHTS_NAME
    )


def weights_sha256(folder: Path) -> str:
    """The sha256 of a model folder's weights (:func:`weights_file`), as its
    ``checksums.json`` records it (hashed where it records none): what names the weights a
    result, a state or a pickle came from."""
    path = weights_file(folder)
    recorded = (read_checksums(Path(folder)) or {}).get(path.name)
    return recorded or file_sha256(path)


def verify_checksum(path: Path, required: bool = True) -> bool:
    """True when ``path`` matches the sha256 its folder records; False when the folder records
    none (and warns, once per folder), or, unless ``required``, none for this file. A
    different digest, or a record that leaves a ``required`` file out, raises DataError."""
    path = Path(path)
    digests = read_checksums(path.parent)
    if digests is None:
        _warn_unverified(path.parent)
        return False
    expected = digests.get(path.name)
    if expected is None and not required:
        return False
    if expected is None:
        raise DataError(
            f"{str(path.parent / CHECKSUMS_NAME)!r} records no sha256 for {path.name}: "
            "expected one for every weight file of the folder"
        )
    actual = file_sha256(path)
    if actual != expected:
        raise DataError(
            f"{str(path)!r} does not match the sha256 recorded in {CHECKSUMS_NAME} (file "
            f"{actual[:12]}…, recorded {expected[:12]}…): the file is truncated or corrupted"
        )
    return True


def _warn_unverified(folder: Path) -> None:
    """Say once per folder and process that its weights load without a recorded sha256."""
    key = folder.resolve()
    if key in _UNVERIFIED:
        return
    _UNVERIFIED.add(key)
    logger.warning(
        "unverified model folder %r: no %s, so its weight files are not checked against a "
        "recorded sha256 (a damaged file that still parses would go unnoticed)",
        str(folder), CHECKSUMS_NAME,
    )  # fmt: skip


# ------------------------------------------------------------------ values
def check_finite(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """DataError naming the first floating tensor of ``path`` with a NaN or infinite value."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point():
            bad = int((~torch.isfinite(tensor)).sum())
            if bad:
                raise DataError(
                    f"{str(path)!r} tensor {name!r} has {bad:,} NaN or infinite values of "
                    f"{tensor.numel():,}: the weights are corrupted (or come from a diverged run)"
                )
