"""Pad a list of token-id rows into a torch batch (:mod:`smiexlm.tokenizer.padding`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from smiexlm.tokenizer.padding import pad_rows
from smiexlm.tokenizer.special import PAD_ID


def collate(rows: Sequence[Sequence[int] | np.ndarray], pad_id: int = PAD_ID):
    """``(input_ids, attention_mask)``: (B, T) torch.long padded with ``pad_id`` and (B, T)
    torch.bool, True = real token; T is the longest row."""
    import torch

    ids, mask = pad_rows(rows, pad_id)
    return torch.from_numpy(ids), torch.from_numpy(mask)
