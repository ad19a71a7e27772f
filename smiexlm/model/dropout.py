"""Dropout with cheap masks on a CPU.

``aten::bernoulli_`` on a CPU draws one Mersenne-Twister number per element: at dropout and
attention dropout 0.1 that was a fifth of a fine-tuning update on one thread. Here the keep
mask comes from NumPy's PCG64 as 16-bit integers (``rng.bytes``, about five times cheaper per
element), seeded from torch's default generator, so ``torch.manual_seed`` still fixes every mask.
An element is dropped when its draw is below ``round(p * 65536)``: the dropout rate is ``p`` to
within 1e-5. Other devices keep torch's own kernels (CUDA's Philox generator is not the cost).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 1 << 16


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> Tensor:
    """A bool CPU tensor of ``shape``: True (keep) with probability 1 - p."""
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
    rng = np.random.Generator(np.random.PCG64(seed))
    n = int(np.prod(shape, dtype=np.int64))
    draws = np.frombuffer(rng.bytes(2 * n), dtype=np.uint16).reshape(shape)
    return torch.from_numpy(draws >= round(p * _LEVELS))


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """``F.dropout`` with :func:`keep_mask` on a CPU: kept elements are scaled by 1/(1 - p)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, training)
    scale = torch.tensor(1.0 / (1.0 - p), dtype=x.dtype)
    return x * keep_mask(x.shape, p).to(x.dtype).mul_(scale)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same ``p``, same ``isinstance``) whose CPU masks come from :func:`keep_mask`."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
