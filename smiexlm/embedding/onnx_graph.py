"""``ExLMModel.encode`` (and a fine-tuned head) written in ops that export to ONNX.

The model's own forward uses complex numbers for RoPE (``view_as_complex``), a fused SDPA and
an ExLM expansion whose width is read back to Python (``int(lengths.max())``); none of these
trace into a graph with dynamic batch and length. The modules here compute the same values
from the same weights with plain tensor ops:

- ExLM: BOS and EOS become k states inside the graph, exactly as ``expand_states`` lays them
  out (sequence position i, clone 1…k with 2D RoPE; other tokens (j, 0)). The expanded width
  is T + 2(k − 1): each row holds BOS … EOS and no [MASK] (the runtime checks this before a
  batch goes in), so the widest row of a batch gets exactly torch's width.
- MAE-LM without [MASK] tokens and MLM: positions 0 … T − 1, 1D RoPE.
- RoPE rotates interleaved pairs as real numbers: (a, b) -> (a cos − b sin, a sin + b cos).
- attention is matmul → masked softmax → matmul in float32. The torch path runs CPU
  attention per group of one length, without a mask, under
  :func:`smiexlm.model.encoder.batch_invariant` because SDPA's fp32 kernels change their
  summation order with the padded length. onnxruntime's float32 MatMul
  and Softmax gave each molecule bitwise the same output in any batch, padded or alone, with
  1 and 2 threads (tests/unit/serving/test_onnx.py checks it wherever it runs), so the graph keeps float32.
- mean pooling is the last entry of a running sum over positions (CumSum adds them one by
  one): onnxruntime's ReduceSum, and a (1, L) @ (L, d) MatMul, moved the mean by up to 6e-7
  with the batch size.

Shapes: B batch, T input length, L encoder length (T, or T + 2(k − 1) for ExLM), d width.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:  # pragma: no cover
    from smiexlm.model.encoder import EncoderBlock
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel

POOLING_ROWS = {"cls": 0, "mean": 1, "max": 2}  # rows of the encoder graph's ``poolings``
# Positions the last block computes for cls pooling (which reads the first). Two, not one:
# onnxruntime multiplies a single query row by a matrix-vector kernel whose sums change with
# the padded length (by up to 5e-7); from two rows on it uses the GEMM, which does not.
CLS_QUERIES = 2


def _inverse_frequencies(n_pairs: int, theta: float) -> Tensor:
    """The rotation frequencies, computed as :mod:`smiexlm.model.rope` computes them."""
    exponent = torch.arange(n_pairs, dtype=torch.float32) / n_pairs
    return theta ** (-exponent)  # (n_pairs,)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE on interleaved pairs of ``x`` (B, H, L, D) with cos/sin (B, 1, L, D/2)."""
    pairs = x.unflatten(-1, (-1, 2))  # (B, H, L, D/2, 2)
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class EncoderGraph(nn.Module):
    """``input_ids`` (B, T) int64, ``attention_mask`` (B, T) int64 (1 = real token) and
    ``cls_only`` () int64 -> ``poolings`` (B, n_layers, 3, d) float32: the cls, mean and max
    poolings (:data:`POOLING_ROWS`) of every block's output through the final LayerNorm, the
    last block first, from one pass, so that a combined pooling (``cls+max``) of several
    blocks costs one run.

    With ``cls_only`` = 1 the last block runs for the first :data:`CLS_QUERIES` positions only
    (``encode(pooled_only=True)`` does the same with one) and only the cls rows mean anything:
    a slice whose length comes from an input, so one graph serves every pooling. Rows are
    BOS … EOS then padding (at least 2 tokens), as the tokenizer writes them.
    """

    def __init__(self, model: ExLMModel):
        super().__init__()
        c = model.config
        self.model = model
        self.exlm = c.objective == "exlm"
        pairs = c.head_dim // 4 if self.exlm else c.head_dim // 2
        self.register_buffer("inv_freq", _inverse_frequencies(pairs, c.rope_theta), False)

    # ------------------------------------------------------------------ layout
    def _layout(self, input_ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Encoder ids (B, L), mask (B, L) bool, sequence and clone positions (B, L) int64."""
        b, t = input_ids.shape
        columns = torch.arange(t, device=input_ids.device).expand(b, t)
        if not self.exlm:
            return input_ids, mask, columns, torch.zeros_like(columns)
        c = self.model.config
        expand = ((input_ids == c.bos_id) | (input_ids == c.eos_id)) & mask  # (B, T)
        counts = torch.where(expand, c.k, 1) * mask  # (B, T) positions each token takes
        ends = counts.cumsum(1)  # (B, T)
        width = c.encoder_length(t)
        p = torch.arange(width, device=input_ids.device)  # (L,)
        # Token covering expanded position p: how many tokens end at or before p.
        source = (ends[:, None, :] <= p[None, :, None]).sum(-1)  # (B, L)
        valid = p[None, :] < ends[:, -1:]  # (B, L)
        source = source.clamp(max=t - 1)
        copy = p[None, :] - (ends - counts).gather(1, source)  # (B, L)
        ids = input_ids.gather(1, source).masked_fill(~valid, c.pad_id)
        is_clone = expand.gather(1, source) & valid
        if not c.rope_2d:  # the ablation: clones share position (i, 0)
            is_clone = torch.zeros_like(is_clone)
        clone = torch.where(is_clone, copy + 1, 0)
        return ids, valid, source.masked_fill(~valid, 0), clone

    def _rotary(self, seq: Tensor, clone: Tensor) -> tuple[Tensor, Tensor]:
        """cos, sin (B, 1, L, D/2) as ``rope_angles`` / ``rope_angles_2d`` compute them."""
        angles = seq.to(torch.float32)[..., None] * self.inv_freq  # (B, L, pairs)
        if self.exlm:
            angles = torch.cat([angles, clone.to(torch.float32)[..., None] * self.inv_freq], -1)
        return angles.cos()[:, None], angles.sin()[:, None]

    # ------------------------------------------------------------------ blocks
    def _attend(self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor) -> Tensor:
        """(B, H, n, hd), (B, H, L, hd) ×2, key mask (B, 1, 1, L) -> (B, H, n, hd)."""
        scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)  # (B, H, n, L)
        scores = scores.masked_fill(~key_mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def _block(
        self, block: EncoderBlock, x: Tensor, cos: Tensor, sin: Tensor, key_mask: Tensor,
        n: int | None,
    ) -> Tensor:  # fmt: skip
        """One pre-norm block, (B, L, d) -> (B, L, d), or (B, n, d): the first n positions."""
        attn = block.attn
        h = block.attn_norm(x)
        q, k, v = attn.qkv(h).unflatten(-1, (3, attn.n_heads, -1)).permute(2, 0, 3, 1, 4)
        if n is not None:
            q, x = q[:, :, :n], x[:, :n]
        n = q.shape[2]
        q, k = rotate(q, cos[:, :, :n], sin[:, :, :n]), rotate(k, cos, sin)
        y = self._attend(q, k, v, key_mask)  # (B, H, n, hd)
        x = x + attn.out(y.transpose(1, 2).flatten(2))
        ffn = block.ffn
        return x + ffn.fc2(F.gelu(ffn.fc1(block.ffn_norm(x))))

    def hidden(
        self, input_ids: Tensor, attention_mask: Tensor, n_last: int | None = None,
        layers: int = 1,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """Final-normed states (B, L, d) and their mask (B, L) bool; with ``n_last`` the last
        block computes the first ``n_last`` positions only: (B, n_last, d), (B, n_last).
        ``layers`` = n > 1: the last n blocks' states side by side, the last first,
        (B, ·, n·d), as ``ExLMModel.encode(layer=(-1, …, -n))``."""
        mask = attention_mask != 0
        ids, mask, seq, clone = self._layout(input_ids, mask)
        cos, sin = self._rotary(seq, clone)
        key_mask = mask[:, None, None, :]  # (B, 1, 1, L), True = real key
        x = self.model.embed(ids)  # (B, L, d)
        blocks, states = self.model.encoder.layers, []
        for i, block in enumerate(blocks):
            x = self._block(block, x, cos, sin, key_mask, n_last if i == len(blocks) - 1 else None)
            states.append(x)
        n = x.shape[1]
        kept = [self.model.final_norm(h[:, :n]) for h in reversed(states[len(blocks) - layers :])]
        return torch.cat(kept, dim=-1), mask[:, :n]

    def forward(self, input_ids: Tensor, attention_mask: Tensor, cls_only: Tensor) -> Tensor:
        width = self.width(input_ids.shape[1])
        n = torch.where(cls_only != 0, CLS_QUERIES, width).item()
        torch._check(n >= CLS_QUERIES)
        torch._check(n <= width)
        blocks = self.model.config.n_layers
        hidden, mask = self.hidden(input_ids, attention_mask, n, blocks)  # (B, n, blocks·d)
        d = hidden.shape[-1] // blocks
        return torch.stack([torch.stack([pool(h, mask, name) for name in POOLING_ROWS], dim=1)
                            for h in hidden.split(d, -1)], dim=1)  # fmt: skip

    def width(self, t: int) -> int:
        """Encoder positions of an input of width ``t``."""
        return self.model.config.encoder_length(t)


def pool(hidden: Tensor, mask: Tensor, pooling: str) -> Tensor:
    """(B, L, d) states and (B, L) bool mask -> (B, d), as ``smiexlm.model.model.pool``.

    The mean's sum over positions is the last entry of a running sum: CumSum adds positions
    one by one, so padding (+0.0) and the batch size leave it unchanged (module docstring).
    Several joined by ``+`` (``cls+max``): (B, n·d), side by side in that order."""
    if "+" in pooling:
        return torch.cat([pool(hidden, mask, part) for part in pooling.split("+")], dim=-1)
    if pooling == "cls":
        return hidden[:, 0]
    m = mask[..., None]  # (B, L, 1)
    if pooling == "mean":
        weights = m.to(hidden.dtype)
        return (hidden * weights).cumsum(1)[:, -1] / weights.sum(1).clamp_min(1)
    return hidden.masked_fill(~m, float("-inf")).amax(1)


class PredictorGraph(nn.Module):
    """A fine-tuned model: ids, mask (and ``features`` (B, F) float32 for a hybrid head) ->
    ``logits`` (B, n_outputs), the head on the encoder pooled as it was trained (cls: the
    last block for the first :data:`CLS_QUERIES` positions only, as the torch path's
    ``pooled_only`` does for one)."""

    def __init__(self, model: ExLMForSequencePrediction):
        super().__init__()
        self.pooling = model.pooling
        self.layers = model.layers
        self.encoder = EncoderGraph(model.model)
        self.head = model.head

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor, features: Tensor | None = None
    ) -> Tensor:
        n_last = CLS_QUERIES if self.pooling == "cls" else None
        hidden, mask = self.encoder.hidden(input_ids, attention_mask, n_last, self.layers)
        d = hidden.shape[-1] // self.layers
        pooled = torch.cat([pool(h, mask, self.pooling) for h in hidden.split(d, -1)], -1)
        if features is not None:
            pooled = torch.cat([pooled, features.to(pooled.dtype)], dim=-1)  # (B, d + F)
        return self.head.traced(pooled)  # (B, n_outputs)
