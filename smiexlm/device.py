"""``--device`` values (``auto`` = CUDA when available, ``cpu``, ``cuda``, ``cuda:N``) and the
mixed-precision policy that goes with a device."""

from __future__ import annotations

import contextlib
import functools
import re
from typing import TYPE_CHECKING, Literal

from smiexlm.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    import torch


DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


# The one precision setting of the package (pretraining, fine-tuning, GLUE): bf16 autocast
# where the device has native bf16 ("auto"), never ("fp32"), or always ("bf16").
Precision = Literal["auto", "fp32", "bf16"]
PRECISIONS: tuple[str, ...] = ("auto", "fp32", "bf16")
_LEGACY_PRECISION = {"off": "fp32"}  # fine-tuning's former ``amp="off"``


def parse_precision(value: str, field: str = "precision") -> Precision:
    """``value`` as a :data:`Precision` (``"off"``, fine-tuning's former name of fp32, is
    read as ``"fp32"``); ConfigError naming ``field`` otherwise."""
    value = _LEGACY_PRECISION.get(value, value)
    if value not in PRECISIONS:
        raise ConfigError(field, value, "'auto' (bf16 where the device has it), 'fp32' or 'bf16'")
    return value  # type: ignore[return-value]


def check_device_name(device: str) -> str:
    """``device`` when it is a ``--device`` value (checked without touching CUDA)."""
    if not isinstance(device, str) or not DEVICE_PATTERN.fullmatch(device):
        raise ConfigError("device", device, "'auto', 'cpu', 'cuda' or 'cuda:N'")
    return device


def resolve_device(device: str | torch.device, local_rank: int | None = None) -> torch.device:
    """The torch device for a ``--device`` value; a CUDA request without CUDA is an error.

    ``auto`` = CUDA when available, else CPU. A CUDA device without an index (``auto``,
    ``cuda``) is ``cuda:local_rank`` when ``local_rank`` is given (one GPU per process under
    torchrun); ``cuda:N`` is always GPU N."""
    import torch

    if isinstance(device, torch.device):
        return device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device_name(device)
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "'cpu' or 'auto': no CUDA device is available")
    if resolved.type == "cuda" and resolved.index is None and local_rank is not None:
        resolved = torch.device("cuda", local_rank)
    return resolved


NATIVE_BF16_ENV = "SMIEXLM_NATIVE_BF16"  # "0": treat the CPU as fp32-only; "1": as bf16-native


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True when the CPU has bf16 instructions (AVX512-BF16 or AMX), where bf16 matrix
    products beat fp32 ones. Elsewhere bf16 is emulated and slower than fp32, so the ``auto``
    precision stays fp32 there.

    ``SMIEXLM_NATIVE_BF16=0`` or ``=1`` overrides the probe, so that either precision path
    can be exercised on any CPU (CI runs the tests once each way)."""
    import os

    import torch

    forced = os.environ.get(NATIVE_BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise ConfigError(NATIVE_BF16_ENV, forced, "'0', '1' or unset (probe the CPU)")
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def uses_bf16(device: torch.device, precision: Precision) -> bool:
    """``auto`` = bf16 autocast on CUDA and on CPUs with native bf16, fp32 elsewhere."""
    if precision == "auto":
        return device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16())
    return precision == "bf16"


def resolved_precision(device: torch.device, precision: Precision) -> str:
    """What ``precision`` means on ``device``: ``"bf16"`` or ``"fp32"`` (see :func:`uses_bf16`)."""
    return "bf16" if uses_bf16(device, precision) else "fp32"


def autocast(device: torch.device, precision: Precision):
    """The bf16 autocast context for ``precision`` on ``device``, or a no-op one."""
    import torch

    if uses_bf16(device, precision):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
