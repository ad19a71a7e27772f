"""τ-effective rank of token representations layer by layer (MAE-LM §2.2, Figure 1).

For each checkpoint and each encoder layer l (1 … n_layers, the block's output through the
model's final LayerNorm, as ``ExLMModel.encode(layer=l-1)`` returns it):

- ``with_mask``: rank_τ(H^l), every real row of the encoder input when the held-out SMILES are
  masked at ``mask_prob`` (for ExLM the expanded sequence; for MAE-LM the encoder drops
  [MASK], so this is its real-token matrix on masked inputs);
- ``without_mask``: rank_τ(H̃^l), the same SMILES fed unmasked (real tokens only);
- ``mask_only``: rank_τ of the [MASK] rows of H^l (Figure 1b; empty for MAE-LM).

MAE-LM's finding for an MLM: ``without_mask < with_mask``, the gap growing with depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from smiexlm.analysis import inputs
from smiexlm.analysis.measures import effective_rank
from smiexlm.analysis.plots import plot_rank
from smiexlm.analysis.report import write_rows
from smiexlm.errors import ConfigError
from smiexlm.model.expansion import expand_states
from smiexlm.model.masking import mask_tokens
from smiexlm.paths import write_json


@dataclass
class RankResult:
    rows: list[dict[str, Any]]
    settings: dict[str, Any]
    files: list[Path] = field(default_factory=list)


def _encoder_input_ids(model, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """The ids (B, T') and mask the encoder actually sees (ExLM: the expanded sequence)."""
    c = model.config
    if c.objective != "exlm":
        return ids, mask
    ex = expand_states(
        ids, mask, c.k, mask_id=c.mask_id, bos_id=c.bos_id, eos_id=c.eos_id, pad_id=c.pad_id
    )
    return ex.input_ids, ex.attention_mask


def layer_rows(model, ids: Tensor, mask: Tensor, layer: int) -> tuple[Tensor, Tensor]:
    """Rows of layer ``layer`` (0-based) at real positions (n, d), and which are [MASK] (n,)."""
    out = model.encode(ids, mask, pooling="mean", layer=layer)
    seen_ids, _ = _encoder_input_ids(model, ids, mask)
    keep = out.attention_mask
    if model.config.objective == "maelm":  # the encoder saw the real tokens only
        return out.hidden_states[keep], torch.zeros(int(keep.sum()), dtype=torch.bool)
    return out.hidden_states[keep], seen_ids[keep] == model.config.mask_id


@torch.no_grad()
def rank_by_layer(
    checkpoints: Sequence[Path],
    smiles: list[str],
    mask_prob: float = 0.15,
    tau: float = 0.9,
    seed: int = 0,
    batch_size: int = 64,
    max_length: int = 256,
    progress: bool = True,
) -> RankResult:
    """One row per (checkpoint, layer): τ-effective ranks with and without [MASK]."""
    if not checkpoints:
        raise ConfigError("checkpoints", [], "at least one checkpoint folder")
    if not 0.0 < mask_prob < 1.0:
        raise ConfigError("mask_prob", mask_prob, "a probability in (0, 1)")
    if not 0.0 < tau <= 1.0:
        raise ConfigError("tau", tau, "a fraction in (0, 1]")
    rows = []
    for path, label in zip(checkpoints, inputs.checkpoint_labels(checkpoints), strict=True):
        model, tokenizer = inputs.load_model_and_tokenizer(path)
        c = model.config
        ids, mask = inputs.encode(tokenizer, smiles, max_length)
        pairs = []
        for b, (x, m) in enumerate(inputs.batches(ids, mask, batch_size)):
            gen = inputs.masking_generator(seed * 1_000_003 + b)
            masked, _ = mask_tokens(x, m, mask_prob=mask_prob, generator=gen, mask_id=c.mask_id)
            pairs.append((x, masked, m))
        desc = f"rank {label}"
        for layer in tqdm(range(c.n_layers), desc=desc, disable=not progress, unit="layer"):
            where = {"checkpoint": label, "path": str(path)}
            rows.append(where | _layer_row(model, pairs, layer, tau))
    settings = {
        "n_molecules": len(smiles),
        "mask_prob": mask_prob,
        "tau": tau,
        "seed": seed,
        "max_length": max_length,
        "features": "ExLMModel.encode(layer=l-1): block l output through the final LayerNorm",
    }
    return RankResult(rows, settings)


def _layer_row(model, pairs: list, layer: int, tau: float) -> dict:
    """τ-effective ranks of one block's states over the batches, masked and plain."""
    with_mask, is_mask, plain = [], [], []
    for x, masked, m in pairs:
        h, flags = layer_rows(model, masked, m, layer)
        with_mask.append(h)
        is_mask.append(flags)
        plain.append(layer_rows(model, x, m, layer)[0])
    h_mask, flags = torch.cat(with_mask), torch.cat(is_mask)
    h_plain = torch.cat(plain)
    return {
        "objective": model.config.objective,
        "layer": layer + 1,
        "with_mask": effective_rank(h_mask, tau),
        "without_mask": effective_rank(h_plain, tau),
        "mask_only": effective_rank(h_mask[flags], tau) if bool(flags.any()) else None,
        "n_rows_with_mask": int(h_mask.shape[0]),
        "n_rows_without_mask": int(h_plain.shape[0]),
        "n_mask_rows": int(flags.sum()),
        "d_model": model.config.d_model,
    }


def write_rank(result: RankResult, out_dir: Path) -> list[Path]:
    """``rank.csv``, ``rank.json`` and ``rank.png`` in ``out_dir``."""
    out_dir = Path(out_dir)
    result.files = [
        write_rows(result.rows, out_dir / "rank.csv"),
        write_json(
            {"analysis": "rank", "settings": result.settings, "rows": result.rows},
            out_dir / "rank.json",
        ),
        plot_rank(result.rows, out_dir / "rank.png"),
    ]
    return result.files
