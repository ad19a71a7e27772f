"""Inference of a fine-tuning model: outputs in input order from length-sorted batches.

:func:`to_scores` turns a head's outputs into scores (probabilities, or values in the
labels' units); :func:`predict` is what validation, the test split, ``smiexlm predict`` and the frozen
encoder's cached features run; :func:`predict_views` runs it once per spelling of the inputs
(test-time augmentation).
"""

from __future__ import annotations

import contextlib
from typing import Literal

import numpy as np
import torch
from torch import nn

from smiexlm.device import Precision, autocast, uses_bf16
from smiexlm.finetuning.batches import Examples, iterate, sorted_batches
from smiexlm.model.encoder import batch_invariant

EVAL_MAX_TOKENS = 4096  # padded positions per evaluation batch


def to_scores(logits: np.ndarray, task_type: str, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Probabilities (sigmoid) of a classification head; values in the labels' units of a
    regression head trained on standardised targets."""
    if task_type == "classification":
        return 1.0 / (1.0 + np.exp(-logits))
    if not logits.size:  # no molecule: (0, T), whatever width an empty pass reported
        return np.zeros((len(logits), np.size(mean)), dtype=np.float32)
    return logits * std + mean


@torch.inference_mode()
def predict(
    model: nn.Module,
    examples: Examples,
    batch_size: int = 256,
    precision: Precision = "fp32",
    pad_id: int = 0,
    output: Literal["logits", "pooled", "pooled+logits"] = "logits",
    max_tokens: int | None = EVAL_MAX_TOKENS,
) -> np.ndarray:
    """(N, C) float32 logits (or pooled features, or both side by side from one pass: (N,
    d + C)) in input order, eval mode, length-sorted, at most ``batch_size`` examples and
    ``max_tokens`` padded positions per batch.

    ``precision="fp32"`` (the default, what ``predict`` and the featurizer serve with) runs under
    :func:`~smiexlm.model.encoder.batch_invariant`, so a molecule's output does not depend on
    its batch neighbours, their padding or the batch size. bf16 autocast (``"auto"``/``"bf16"``,
    used for validation while training) rounds each batch
    shape differently: outputs then move by up to about 1e-2 with the batching."""
    model.eval()
    device = next(model.parameters()).device
    plain = Examples(examples.rows, None, examples.features, examples.pooled)
    out: np.ndarray | None = None
    batches = sorted_batches(plain.lengths(), batch_size, max_tokens)
    fp32 = not uses_bf16(device, precision)
    for index, batch in iterate(plain, batches, device, pad_id):
        with autocast(device, precision), batch_invariant() if fp32 else contextlib.nullcontext():
            if output == "pooled":
                values = model.pool(batch["input_ids"], batch["attention_mask"])
            elif output == "pooled+logits":
                served = model(**batch)
                values = torch.cat([served.pooled, served.logits], dim=1)
            else:
                values = model(**batch).logits
        values = values.float().cpu().numpy()
        if out is None:
            out = np.zeros((len(plain), values.shape[1]), dtype=np.float32)
        out[index] = values
    return out if out is not None else np.zeros((0, 0), dtype=np.float32)


def predict_views(
    model: nn.Module,
    examples: Examples,
    batch_size: int = 256,
    precision: Precision = "fp32",
    pad_id: int = 0,
) -> np.ndarray:
    """(V, N, C) logits of every spelling of the examples (V = 1 + their variants): the
    canonical input first; the mean over V is the test-time-augmented prediction."""
    views = [examples.view(v) for v in range(examples.n_views)]
    return np.stack([predict(model, view, batch_size, precision, pad_id) for view in views])
