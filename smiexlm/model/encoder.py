"""Pre-norm Transformer encoder: SDPA attention with rotary q/k, GELU feed-forward.

Every block is ``x + drop(attn(LN(x)))`` then ``x + drop(ffn(LN(x)))``; the final LayerNorm
lives in the model (it is shared by ``encode`` and every pre-training head). Padding is a key
mask: padded keys get no attention, so real positions never see pads (padding invariance).

Padding is invisible in exact arithmetic only: SDPA's CPU kernels sum a row of attention
weights in vector chunks whose grouping follows the padded length, so in fp32 a molecule's
output moves by a few ulps (about 1e-6) with the length of its longest batch neighbour. Under
:func:`batch_invariant` (what served inference runs in) CPU attention is computed in float64,
whose rounding vanishes when the result is cast back: an output is then the same whatever
batch it sits in, for about 1.2x the time of an fp32 inference pass.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from smiexlm.model.config import ExLMConfig
from smiexlm.model.dropout import Dropout, dropout
from smiexlm.model.rope import apply_rotary

_BATCH_INVARIANT = contextvars.ContextVar("smiexlm_batch_invariant", default=False)


@contextlib.contextmanager
def batch_invariant() -> Iterator[None]:
    """Within it, fp32 CPU attention runs in float64 so that outputs do not depend on the
    padding or the size of their batch (see the module docstring)."""
    token = _BATCH_INVARIANT.set(True)
    try:
        yield
    finally:
        _BATCH_INVARIANT.reset(token)


class SelfAttention(nn.Module):
    def __init__(self, config: ExLMConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)
        self.attention_dropout = config.attention_dropout

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor, n_queries: int | None = None
    ) -> Tensor:
        """``x`` (B, L, d); ``key_mask`` (B, 1, 1, L) bool, True = real token. With
        ``n_queries`` only the first n positions attend (output (B, n, d)); keys and values
        still cover every position."""
        if n_queries is None:
            q, k, v = self.qkv(x).unflatten(-1, (3, self.n_heads, -1)).permute(2, 0, 3, 1, 4)
        else:
            d = x.shape[-1]
            w, b = self.qkv.weight, self.qkv.bias  # (3d, d), (3d,): rows q | k | v
            q = F.linear(x[:, :n_queries], w[:d], b[:d]).unflatten(-1, (self.n_heads, -1))
            q = q.transpose(1, 2)  # (B, H, n, hd)
            kv = F.linear(x, w[d:], b[d:]).unflatten(-1, (2, self.n_heads, -1))
            k, v = kv.permute(2, 0, 3, 1, 4)  # (B, H, L, hd) each
        nq = q.shape[2]
        q, k = apply_rotary(q, cos[:, :, :nq], sin[:, :, :nq]), apply_rotary(k, cos, sin)
        p = self.attention_dropout if self.training else 0.0
        if p > 0.0 and q.device.type == "cpu":
            y = attention_with_dropout(q, k, v, key_mask, p)
        elif _BATCH_INVARIANT.get() and q.device.type == "cpu" and q.dtype == torch.float32:
            q, k, v = q.double(), k.double(), v.double()
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask).float()
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=p)
        return self.out(y.transpose(1, 2).flatten(2))  # (B, L, d)


def attention_with_dropout(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor, p: float) -> Tensor:
    """SDPA's math path (at least float32 inside, as SDPA computes it on a CPU), with the
    attention weights dropped by :func:`smiexlm.model.dropout.dropout`: CPU training only."""
    dtype = q.dtype
    work = torch.promote_types(dtype, torch.float32)
    q, k, v = q.to(work), k.to(work), v.to(work)
    scores = (q @ k.transpose(-2, -1)).mul_(q.shape[-1] ** -0.5)
    scores = scores.masked_fill(~key_mask, float("-inf"))
    return (dropout(torch.softmax(scores, dim=-1), p) @ v).to(dtype)


class FeedForward(nn.Module):
    def __init__(self, config: ExLMConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.dropout = Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(F.gelu(self.fc1(x))))


class EncoderBlock(nn.Module):
    def __init__(self, config: ExLMConfig):
        super().__init__()
        self.attn_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.attn = SelfAttention(config)
        self.ffn_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = FeedForward(config)
        self.dropout = Dropout(config.dropout)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor, n_queries: int | None = None
    ) -> Tensor:
        """(B, L, d) -> (B, L, d), or (B, n_queries, d): the first positions only."""
        y = self.attn(self.attn_norm(x), cos, sin, key_mask, n_queries)
        x = x[:, : y.shape[1]] + self.dropout(y)
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class Encoder(nn.Module):
    """A stack of ``n_layers`` pre-norm blocks (no final norm: the caller owns it)."""

    def __init__(self, config: ExLMConfig, n_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(EncoderBlock(config) for _ in range(n_layers))

    def forward(
        self,
        x: Tensor,
        rotary: tuple[Tensor, Tensor],
        attention_mask: Tensor,
        n_layers: int | None = None,
        last_queries: int | None = None,
    ) -> Tensor:
        """``x`` (B, L, d), ``attention_mask`` (B, L) bool (True = real) -> (B, L, d).

        ``n_layers`` stops after that many blocks (intermediate-layer features).
        ``last_queries`` = n computes the last block for the first n positions only and
        returns (B, n, d): the same values as the full pass, for a fraction of the last
        block's cost (fine-tuning on the first state needs nothing else).
        """
        cos, sin = rotary
        key_mask = attention_mask[:, None, None, :]  # (B, 1, 1, L)
        layers = self.layers[:n_layers]
        for i, layer in enumerate(layers):
            x = layer(x, cos, sin, key_mask, last_queries if i == len(layers) - 1 else None)
        return x


def count_parameters(module: nn.Module) -> int:
    """Number of distinct parameters (tied tensors counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT-style initialisation: N(0, 0.02) weights, zero biases, unit LayerNorm."""
    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            nn.init.normal_(sub.weight, mean=0.0, std=std)
            if getattr(sub, "bias", None) is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)
