"""``--device`` values (``auto`` = CUDA when available, ``cpu``, ``cuda``, ``cuda:N``) and the
mixed-precision policy that goes with a device."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Literal

import torch

from smiexlm.errors import ConfigError


def resolve_device(device: str | torch.device) -> torch.device:
    """The torch device for a ``--device`` value; a CUDA request without CUDA is an error."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ConfigError("device", device, "'auto', 'cpu', 'cuda' or 'cuda:N'") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", device, "'cpu' or 'auto': no CUDA device is available")
    return resolved


#: CPU feature flags (Linux /proc/cpuinfo) of native bf16 matrix units
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.cache
def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True when the CPU reports AVX512-BF16 or AMX-BF16. Elsewhere bf16 is emulated and
    slower than fp32, so the ``auto`` precision stays fp32 there."""
    try:
        flags = set(cpuinfo.read_text(errors="replace").split())
    except OSError:
        return False
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def uses_bf16(device: torch.device, precision: Literal["auto", "fp32", "bf16"]) -> bool:
    """``auto`` = bf16 autocast on CUDA and on CPUs with native bf16, fp32 elsewhere."""
    if precision == "auto":
        return device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16())
    return precision == "bf16"


def autocast(device: torch.device, precision: Literal["auto", "fp32", "bf16"]):
    """The bf16 autocast context for ``precision`` on ``device``, or a no-op one."""
    if uses_bf16(device, precision):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
