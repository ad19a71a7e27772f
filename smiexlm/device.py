"""``--device`` values: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``."""

from __future__ import annotations

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
