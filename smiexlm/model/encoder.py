"""Pre-norm Transformer encoder: SDPA attention with rotary q/k, GELU feed-forward.

Every block is ``x + drop(attn(LN(x)))`` then ``x + drop(ffn(LN(x)))``; the final LayerNorm
lives in the model (it is shared by ``encode`` and every pre-training head). Padding is a key
mask: padded keys get no attention, so real positions never see pads (padding invariance).

Padding is invisible in exact arithmetic only: SDPA's CPU kernels sum a row of attention
weights in vector chunks whose grouping follows the padded length, so in fp32 a molecule's
output moves by a few ulps (about 1e-6) with the length of its longest batch neighbour, and
a matrix product of 1 to 3 rows (one molecule of 3 tokens alone, or a ``last_queries`` block
of 1 to 3 molecules) takes another kernel than a larger one. Under :func:`batch_invariant`
(what served inference runs in) a CPU forward in fp32 is the same for a molecule whatever
batch it sits in, bit for bit:

- attention runs per group of molecules of one length, without padding or mask, through
  SDPA's fp32 CPU kernel (:func:`attention_by_length`), which splits each molecule's queries
  and keys by its own length only: its attention is then the computation it gets alone,
  whatever the group's size and the thread count. (A plain fp32 matmul-softmax-matmul is not:
  its batched product takes another kernel for another number of molecules.) Served
  ``featurize`` cuts its batches by length, so they hold no padding at all;
- linear layers (and the fine-tuning heads) pad a product of fewer than
  :data:`MIN_GEMM_ROWS` rows or outputs with zeros (:func:`linear`), so that every product
  takes the same kernel.

Under :func:`int8_products` (``Featurizer(int8=True)``, opt-in) the linear layers of a CPU
forward compute in int8 instead (:func:`int8_linear`): integer products are exact whatever
the kernel, and every rescaling is element by element, so these outputs too are the same
for a molecule in any batch, bit for bit; they differ from the fp32 ones by the rounding to
int8 (``benchmarks/results/featurize.md``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from smiexlm.model.config import ExLMConfig
from smiexlm.model.dropout import Dropout, dropout
from smiexlm.model.rope import apply_rotary

_BATCH_INVARIANT = contextvars.ContextVar("smiexlm_batch_invariant", default=False)
_INT8 = contextvars.ContextVar("smiexlm_int8_products", default=False)


# fp32 CPU matrix products of fewer rows (or outputs) take another kernel (MKL: 1 to 3 rows;
# one output: rows modulo 4); padded to this many under batch_invariant, with a margin for
# CPUs whose small-matrix paths are wider
MIN_GEMM_ROWS = 16


@contextlib.contextmanager
def batch_invariant() -> Iterator[None]:
    """Within it, an fp32 CPU forward gives each molecule bitwise the same output whatever
    the padding, the neighbours or the size of its batch (see the module docstring)."""
    token = _BATCH_INVARIANT.set(True)
    try:
        yield
    finally:
        _BATCH_INVARIANT.reset(token)


@contextlib.contextmanager
def int8_products(on: bool = True) -> Iterator[None]:
    """Within it (when ``on``), :func:`linear` on a CPU computes fp32 inputs through
    :func:`int8_linear`."""
    token = _INT8.set(bool(on))
    try:
        yield
    finally:
        _INT8.reset(token)


def int8_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear`` through int8: each row of ``x`` and each row (output) of ``weight``
    rounded to int8 on its own symmetric scale (its largest magnitude over 127), the products
    summed exactly in int32 (``torch._int_mm``), then rescaled by the two scales and the bias
    added, element by element. An output depends on its own input row and weight row alone,
    and no sum is rounded: the same in any batch, bit for bit. A weight is rounded once and
    kept beside it until it changes."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.shape[0] == 0:
        return F.linear(x, weight, bias)
    x8, x_scale = _int8_rows(flat)
    w8, w_scale = _int8_weight(weight)
    y = torch._int_mm(x8, w8.t()).to(torch.float32).mul_(x_scale).mul_(w_scale)
    if bias is not None:
        y = y.add_(bias)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def _int8_rows(a: Tensor) -> tuple[Tensor, Tensor]:
    """(int8 rows, (rows, 1) fp32 scales): each row times 127 over its largest magnitude,
    rounded (within [-127, 127] by construction); a row of zeros keeps the scale 1."""
    peak = a.detach().abs().amax(dim=1, keepdim=True)
    peak = torch.where(peak > 0, peak, 127.0)
    return torch.mul(a, 127.0 / peak).round_().to(torch.int8), peak / 127.0


def _int8_weight(weight: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`_int8_rows` of a weight, its scales as one (1, outputs) row, computed again
    only when the weight is changed in place or replaced."""
    key = (weight._version, weight.data_ptr())
    kept = getattr(weight, "_smiexlm_int8", None)
    if kept is None or kept[0] != key:
        w8, scale = _int8_rows(weight.detach())
        kept = (key, w8, scale.t().contiguous())
        weight._smiexlm_int8 = kept
    return kept[1], kept[2]


def _invariant(x: Tensor) -> bool:
    return _BATCH_INVARIANT.get() and x.device.type == "cpu" and x.dtype == torch.float32


def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear`` (:func:`int8_linear` under :func:`int8_products`); under
    :func:`batch_invariant` a product of fewer than
    :data:`MIN_GEMM_ROWS` rows, or of fewer outputs (a head of 1 to 15 tasks, whose products
    took a kernel that follows the number of rows modulo 4), is computed with zero rows or
    zero outputs added, in the kernel of a large batch. Rows and outputs are independent:
    the padding changes none of the real ones."""
    if _INT8.get() and x.device.type == "cpu" and x.dtype == torch.float32:
        return int8_linear(x, weight, bias)
    rows, out = (x.numel() // x.shape[-1] if x.shape[-1] else 0), weight.shape[0]
    if min(rows, out) >= MIN_GEMM_ROWS or rows == 0 or not _invariant(x):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    if rows < MIN_GEMM_ROWS:
        flat = torch.cat([flat, flat.new_zeros(MIN_GEMM_ROWS - rows, flat.shape[1])])
    if out < MIN_GEMM_ROWS:
        weight = torch.cat([weight, weight.new_zeros(MIN_GEMM_ROWS - out, weight.shape[1])])
        bias = None if bias is None else torch.cat([bias, bias.new_zeros(MIN_GEMM_ROWS - out)])
    return F.linear(flat, weight, bias)[:rows, :out].reshape(*x.shape[:-1], out)


def attention_by_length(q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor) -> Tensor:
    """Attention of each molecule over its own keys, without padding: ``q`` (B, H, n, hd),
    ``k``/``v`` (B, H, L, hd), ``key_mask`` (B, 1, 1, L) with each row's real positions first
    (as every smiexlm batch lays them out) -> (B, H, n, hd), zero at padded queries.

    Molecules of one length go together through SDPA without a mask, whose fp32 CPU kernel
    computes each molecule's rows from its own length alone, so a molecule's output is the
    one it gets alone, with 1 or 2 threads. With fewer queries than keys (``last_queries``)
    the queries are padded with zeros to the keys' length, so that the first ones take the
    full pass's kernel and give its values. (Float64 matmul-softmax-matmul, served before,
    was invariant too; the served call now takes 1/1.67 of its CPU time on BBBP, one thread:
    ``benchmarks/featurize_served.py``.)"""
    lengths = key_mask.flatten(1).sum(1)  # (B,)
    positions = torch.arange(key_mask.shape[-1], device=key_mask.device)
    if not torch.equal(key_mask.flatten(1), positions < lengths[:, None]):
        raise ValueError("batch_invariant attention expects each row's real positions first")
    groups = lengths.unique().tolist()
    if groups == [k.shape[2]] and q.shape[2] == k.shape[2]:  # one length, no padding (served
        return F.scaled_dot_product_attention(q, k, v)  # batches): the loop's values, no copy
    y = q.new_zeros(q.shape)
    for n in groups:
        rows = (lengths == n).nonzero().squeeze(1)
        first, last = int(rows[0]), int(rows[-1]) + 1
        if last - first == len(rows):  # a run of rows (a batch sorted by length): no gather
            rows = slice(first, last)
        nq = min(q.shape[2], n)
        qs, ks, vs = (t[rows, :, :n] for t in (q, k, v))
        if nq < n:  # the first queries only: as many as the full pass, so the same kernel
            qs = torch.cat([qs, qs.new_zeros(*qs.shape[:2], n - nq, qs.shape[3])], dim=2)
        y[rows, :, :nq] = F.scaled_dot_product_attention(qs, ks, vs)[:, :, :nq]  # no padding
    return y


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
        w, b = self.qkv.weight, self.qkv.bias  # (3d, d), (3d,): rows q | k | v
        if n_queries is None:
            q, k, v = linear(x, w, b).unflatten(-1, (3, self.n_heads, -1)).permute(2, 0, 3, 1, 4)
        else:
            d = x.shape[-1]
            q = linear(x[:, :n_queries], w[:d], b[:d]).unflatten(-1, (self.n_heads, -1))
            q = q.transpose(1, 2)  # (B, H, n, hd)
            kv = linear(x, w[d:], b[d:]).unflatten(-1, (2, self.n_heads, -1))
            k, v = kv.permute(2, 0, 3, 1, 4)  # (B, H, L, hd) each
        nq = q.shape[2]
        q, k = apply_rotary(q, cos[:, :, :nq], sin[:, :, :nq]), apply_rotary(k, cos, sin)
        p = self.attention_dropout if self.training else 0.0
        if p > 0.0 and q.device.type == "cpu":
            y = attention_with_dropout(q, k, v, key_mask, p)
        elif _invariant(q):
            y = attention_by_length(q, k, v, key_mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=p)
        return linear(y.transpose(1, 2).flatten(2), self.out.weight, self.out.bias)  # (B, L, d)


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
        h = F.gelu(linear(x, self.fc1.weight, self.fc1.bias))
        return linear(self.dropout(h), self.fc2.weight, self.fc2.bias)


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
        last = len(self.layers[:n_layers]) - 1
        return self.outputs(x, rotary, attention_mask, (last,), last_queries)[0]

    def outputs(
        self,
        x: Tensor,
        rotary: tuple[Tensor, Tensor],
        attention_mask: Tensor,
        blocks: Sequence[int],
        last_queries: int | None = None,
    ) -> list[Tensor]:
        """The outputs of ``blocks`` (0-based, in the order given) of one pass that stops at
        the deepest of them; ``last_queries`` applies to that deepest block, as in
        :meth:`forward`, so its output is (B, n, d) and the others (B, L, d)."""
        cos, sin = rotary
        key_mask = attention_mask[:, None, None, :]  # (B, 1, 1, L)
        deepest = max(blocks)
        kept: dict[int, Tensor] = {}
        for i, layer in enumerate(self.layers[: deepest + 1]):
            x = layer(x, cos, sin, key_mask, last_queries if i == deepest else None)
            if i in blocks:
                kept[i] = x
        return [kept[i] for i in blocks]


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
