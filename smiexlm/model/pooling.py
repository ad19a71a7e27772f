"""How an encoder's states become one vector per molecule: the pooling choices and ``pool``.

``cls`` reads the first position (for exlm the first BOS state), ``mean`` and ``max`` pool
over the real positions; several joined by ``+`` (``cls+max``) are put side by side, in that
order. :data:`POOLINGS` is the one list of choices: the featurizer, fine-tuning, the probe,
the ONNX graphs and a fine-tuned folder's ``finetune.json`` are all checked against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import torch
from torch import Tensor

from smiexlm.errors import ConfigError

Pooling = Literal["cls", "mean", "max"]
POOLINGS: tuple[str, ...] = get_args(Pooling)  # the one list of pooling choices


def block_indices(layer: int | Sequence[int], n_layers: int) -> tuple[int, ...]:
    """``layer`` (a block index, or several different ones, −1 = last) as 0-based blocks of an
    encoder of ``n_layers``; ConfigError naming ``layer`` for anything else."""
    if isinstance(layer, int):
        blocks: tuple = (layer,)
    else:
        blocks = tuple(layer) if isinstance(layer, Sequence) and not isinstance(layer, str) else ()
    kept = tuple(b % n_layers for b in blocks if type(b) is int and -n_layers <= b < n_layers)
    if not blocks or len(kept) != len(blocks) or len(set(kept)) != len(kept):
        raise ConfigError("layer", layer, f"an index in [{-n_layers}, {n_layers - 1}], or "
                          "several different ones")  # fmt: skip
    return kept


def last_blocks(n: int, n_layers: int | None = None, name: str = "layers") -> tuple[int, ...]:
    """The last ``n`` encoder blocks as ``encode(layer=...)`` takes them, the last first:
    ``(-1, -2, ..., -n)``; with ``n_layers`` (the encoder's blocks), ConfigError naming
    ``name`` unless it has that many."""
    if n_layers is not None and (type(n) is not int or not 1 <= n <= n_layers):
        raise ConfigError(name, n, f"1 to {n_layers}: the model has {n_layers} encoder blocks")
    return tuple(range(-1, -n - 1, -1))


def pooling_parts(spec: str, name: str = "pooling") -> tuple[str, ...]:
    """The poolings of ``spec``: one of :data:`POOLINGS`, or several joined by ``+`` (such as
    ``cls+max``), whose vectors are put side by side in that order."""
    parts = tuple(spec.split("+")) if isinstance(spec, str) else ()
    if not parts or len(set(parts)) != len(parts) or not set(parts) <= set(POOLINGS):
        raise ConfigError(name, spec, f"one of {', '.join(POOLINGS)}, or several joined by '+' "
                          "(such as 'cls+max')")  # fmt: skip
    return parts


def pool(hidden: Tensor, mask: Tensor, pooling: str) -> Tensor:
    """(B, L, d) features and (B, L) mask -> (B, d) by ``cls`` (first), ``mean`` or ``max``;
    (B, n·d) for n poolings joined by ``+`` (:func:`pooling_parts`)."""
    parts = pooling_parts(pooling)
    if len(parts) > 1:
        return torch.cat([pool(hidden, mask, part) for part in parts], dim=-1)
    if pooling == "cls":
        return hidden[:, 0]
    m = mask[..., None]  # (B, L, 1)
    if pooling == "mean":
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1)
    return hidden.masked_fill(~m, float("-inf")).amax(1)
