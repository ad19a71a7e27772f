"""Pad a list of token-id arrays into a batch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def collate(arrays: Sequence[np.ndarray], pad_id: int = 0):
    """``(input_ids, attention_mask)``: (B, T) torch.long padded with ``pad_id`` and (B, T)
    torch.bool, True = real token; T is the longest item."""
    import torch

    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    width = int(lengths.max()) if len(arrays) else 0
    mask = np.arange(width)[None, :] < lengths[:, None]  # (B, T)
    ids = np.full((len(arrays), width), pad_id, dtype=np.int64)
    if len(arrays):
        ids[mask] = np.concatenate([np.asarray(a, dtype=np.int64) for a in arrays])
    return torch.from_numpy(ids), torch.from_numpy(mask)
