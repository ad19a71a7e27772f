"""Rotary position embeddings (RoPE), 1D and 2D.

Rotation pairs are interleaved: pair p rotates dimensions (2p, 2p + 1) of a head by the angle
``position * theta ** (-p / n_pairs)``. The 2D form (ExLM §4, method notes §2.2) gives the first
half of the pairs (the first half of the head dimension) to the sequence coordinate i and the
second half to the clone coordinate c, so that q·k depends only on (i_q − i_k, c_q − c_k).

Angles are computed once per forward pass as ``(cos, sin)`` of shape (B, 1, L, D/2) and shared
by every layer.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _inverse_frequencies(n_pairs: int, theta: float, device: torch.device) -> Tensor:
    exponent = torch.arange(n_pairs, device=device, dtype=torch.float32) / n_pairs
    return theta ** (-exponent)  # (n_pairs,)


def rope_angles(positions: Tensor, head_dim: int, theta: float = 10000.0) -> tuple[Tensor, Tensor]:
    """1D rotary angles for integer ``positions`` (B, L) -> cos, sin of shape (B, 1, L, D/2)."""
    inv = _inverse_frequencies(head_dim // 2, theta, positions.device)
    angles = positions.to(torch.float32)[..., None] * inv  # (B, L, D/2)
    return angles.cos()[:, None], angles.sin()[:, None]


def rope_angles_2d(
    seq_positions: Tensor, clone_positions: Tensor, head_dim: int, theta: float = 10000.0
) -> tuple[Tensor, Tensor]:
    """2D rotary angles: first D/4 pairs follow ``seq_positions``, the rest ``clone_positions``.

    Both position tensors are (B, L) integers; returns cos, sin of shape (B, 1, L, D/2).
    """
    inv = _inverse_frequencies(head_dim // 4, theta, seq_positions.device)  # (D/4,)
    seq = seq_positions.to(torch.float32)[..., None] * inv  # (B, L, D/4)
    clone = clone_positions.to(torch.float32)[..., None] * inv  # (B, L, D/4)
    angles = torch.cat([seq, clone], dim=-1)  # (B, L, D/2)
    return angles.cos()[:, None], angles.sin()[:, None]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate interleaved pairs of ``x`` (B, H, L, D) by angles given as cos/sin (B, 1, L, D/2).

    Each pair is a complex number multiplied by cos + i·sin, in float32 for lower precisions
    (float64 stays float64; one vectorised product instead of four strided ones), then cast
    back to ``x``'s dtype.
    """
    work = torch.promote_types(x.dtype, torch.float32)
    pairs = torch.view_as_complex(x.to(work).unflatten(-1, (-1, 2)))  # (B, H, L, D/2)
    rotated = pairs * torch.complex(cos.to(work), sin.to(work))
    return torch.view_as_real(rotated).flatten(-2).to(x.dtype)  # (B, H, L, D)
