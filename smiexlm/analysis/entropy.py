"""Prediction entropy of MLM against ExLM checkpoints at several mask ratios (ExLM App. Q.1).

For every checkpoint and mask ratio r the same held-out SMILES are masked with the project's
``mask_tokens`` (``all_mask`` policy, one seeded generator per batch, so checkpoints that
share a vocabulary see identical masks), and the entropy in bits of the predicted
distribution is averaged over the masked tokens:

- ``mlm`` / ``maelm``: the LM head's distribution at each [MASK] position;
- ``exlm``: each [MASK] is k states; a masked token's entropy is the mean of its k states'
  emission entropies (the same per-token averaging as Appendix E.1 uses for k copies).

The state mean counts states that the alignment skips as much as states that emit. A second
figure, ``entropy_bits_path``, weights each [MASK] state by its probability of lying on the
DAG path for the true tokens (``smiexlm.dag.dag_state_posterior``): the entropy of the states
that actually carry the prediction. For MLM and MAE-LM every [MASK] emits, so both figures
are equal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from smiexlm.analysis import inputs
from smiexlm.analysis.measures import prediction_entropy_bits
from smiexlm.analysis.plots import plot_entropy
from smiexlm.analysis.report import write_rows
from smiexlm.dag import dag_state_posterior
from smiexlm.dag.gather import logsoftmax_gather
from smiexlm.errors import ConfigError
from smiexlm.model.expansion import expand_states
from smiexlm.model.masking import mask_tokens
from smiexlm.paths import write_json


@dataclass
class EntropyResult:
    rows: list[dict[str, Any]]
    settings: dict[str, Any]
    files: list[Path] = field(default_factory=list)

    def table(self) -> dict[str, dict[str, float]]:
        """{checkpoint: {mask ratio: entropy bits}} (the layout of Figure 12)."""
        out: dict[str, dict[str, float]] = {}
        for row in self.rows:
            out.setdefault(row["checkpoint"], {})[f"{row['mask_ratio']:g}"] = row["entropy_bits"]
        return out


def masked_entropies(model, masked: Tensor, mask: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """Per [MASK] token of ``masked`` (B, T): the entropies (bits) of its predictions and the
    probability that each of them is on the DAG path for ``labels``, both (N, k) (k = 1 and
    probability 1 for MLM and MAE-LM)."""
    c = model.config
    if c.objective != "exlm":
        out = model(masked, mask)  # labels=None: no loss, logits only
        h = prediction_entropy_bits(out.logits[(masked == c.mask_id) & mask])[:, None]  # (N, 1)
        return h, torch.ones_like(h)
    out = model(masked, mask, labels)
    emissions = logsoftmax_gather(out.logits.float(), out.targets)  # (B, M, S)
    on_path = dag_state_posterior(
        emissions, out.log_links, out.state_lengths, out.target_lengths
    ).sum(1)  # (B, S)
    ex = expand_states(
        masked, mask, c.k, mask_id=c.mask_id, bos_id=c.bos_id, eos_id=c.eos_id, pad_id=c.pad_id
    )
    is_mask = (masked.gather(1, ex.state_groups) == c.mask_id) & ex.state_mask  # (B, S)
    h = prediction_entropy_bits(out.logits[is_mask]).view(-1, c.k)  # (N, k) in group order
    return h, on_path[is_mask].double().view(-1, c.k)


@torch.no_grad()
def entropy_by_mask_ratio(
    checkpoints: Sequence[Path],
    smiles: list[str],
    mask_ratios: Sequence[float],
    seed: int = 0,
    batch_size: int = 64,
    max_length: int = 256,
    progress: bool = True,
) -> EntropyResult:
    """Rows (checkpoint, objective, k, mask ratio, mean entropy in bits, its std, the
    path-weighted entropy, n tokens)."""
    if not checkpoints:
        raise ConfigError("checkpoints", [], "at least one checkpoint folder")
    for r in mask_ratios:
        if not 0.0 < r < 1.0:
            raise ConfigError("mask_ratios", r, "probabilities in (0, 1)")
    inputs.check_models(checkpoints, predict_tokens=True)
    rows = []
    bar = tqdm(total=len(checkpoints) * len(mask_ratios), disable=not progress, unit="run")
    for path, label in zip(checkpoints, inputs.checkpoint_labels(checkpoints), strict=True):
        model, tokenizer = inputs.load_model_and_tokenizer(path)
        ids, mask = inputs.encode(tokenizer, smiles, max_length)
        c = model.config
        for ratio in mask_ratios:
            states, weights = [], []
            for b, (x, m) in enumerate(inputs.batches(ids, mask, batch_size)):
                gen = inputs.masking_generator(seed * 1_000_003 + b)
                masked, labels = mask_tokens(
                    x, m, mask_prob=ratio, generator=gen, mask_id=c.mask_id
                )
                h_states, on_path = masked_entropies(model, masked, m, labels)
                states.append(h_states)
                weights.append(on_path)
            h_states, on_path = torch.cat(states).double(), torch.cat(weights)
            h = h_states.mean(1)  # (N,) per masked token
            rows.append(
                {
                    "checkpoint": label,
                    "path": str(path),
                    "objective": c.objective,
                    "k": c.k if c.objective == "exlm" else 1,
                    "mask_ratio": float(ratio),
                    "entropy_bits": float(h.mean()) if len(h) else math.nan,
                    "entropy_std": float(h.std()) if len(h) > 1 else math.nan,
                    "entropy_bits_path": _weighted_mean(h_states, on_path),
                    "n_tokens": len(h),
                    "max_bits": math.log2(c.vocab_size),
                }
            )
            bar.update(1)
    bar.close()
    settings = {
        "n_molecules": len(smiles),
        "mask_ratios": list(mask_ratios),
        "seed": seed,
        "max_length": max_length,
        "masking": "mask_tokens(policy='all_mask')",
    }
    return EntropyResult(rows, settings)


def _weighted_mean(values: Tensor, weights: Tensor) -> float:
    total = float(weights.sum())
    return float((values * weights).sum()) / total if total > 0 else math.nan


def write_entropy(result: EntropyResult, out_dir: Path) -> list[Path]:
    """``entropy.csv``, ``entropy.json`` and ``entropy.png`` in ``out_dir``."""
    out_dir = Path(out_dir)
    doc = {"analysis": "entropy", "settings": result.settings, "table": result.table()}
    result.files = [
        write_rows(result.rows, out_dir / "entropy.csv"),
        write_json(doc | {"rows": result.rows}, out_dir / "entropy.json"),
        plot_entropy(result.rows, out_dir / "entropy.png"),
    ]
    return result.files
