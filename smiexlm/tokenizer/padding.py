"""Token-id rows to a padded (B, T) matrix: the one padder of the package.

Every path that turns rows of ids into model input pads here: the tokenizers'
``encode_batch``, the pretraining and fine-tuning batches (:func:`smiexlm.data.collate`), the
featurizer and the ONNX runtime. Rows are right-padded with PAD to the longest row; the mask
is True on real tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from smiexlm.tokenizer.special import PAD_ID


def pad_flat(flat: np.ndarray, lengths: np.ndarray, pad_id: int = PAD_ID) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(B, T) int64 ids and (B, T) bool mask of rows given end to end in ``flat`` with their
    ``lengths``; T is the longest row (0 for no rows)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    width = int(lengths.max()) if len(lengths) else 0
    mask = np.arange(width)[None, :] < lengths[:, None]  # (B, T) True = real token
    ids = np.full((len(lengths), width), pad_id, dtype=np.int64)
    ids[mask] = flat
    return ids, mask


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int = PAD_ID) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(B, T) int64 ids and (B, T) bool mask of id rows (lists or arrays)."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    if len(rows) and isinstance(rows[0], np.ndarray):
        flat = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows])
    else:
        flat = np.fromiter((t for r in rows for t in r), dtype=np.int64, count=int(lengths.sum()))
    return pad_flat(flat, lengths, pad_id)
