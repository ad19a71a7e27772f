"""Task-adaptive descriptor regression (``finetune --adapt-steps N``).

Before fine-tuning, the backbone takes ``N`` more updates of the objective it was pretrained
with, regression of its RDKit 2D descriptors (MTR), on the task's own training molecules (no
labels: only what RDKit computes from each structure), so that its embedding learns the
chemistry of the molecules it will be asked about, which the pretraining corpus may lack.
Descriptors are normalised with the backbone's own statistics (``descriptors.json``). The
updates walk through shuffled epochs of the training molecules in length-bucketed batches, as
fine-tuning does (a random batch pads to its longest SMILES: on ClinTox that tripled the
padded length and the cost); AdamW at a constant learning rate with a linear warm-up over the
first tenth, gradients clipped to norm 1. Needs a backbone with a descriptor head, such as
the shipped default.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from smiexlm.errors import ConfigError


def adapt_descriptors(
    model: Any, rows: list[list[int]], texts: list[str], steps: int, lr: float,
    batch_size: int, seed: int, pad_id: int = 0,
) -> dict[str, float]:  # fmt: skip
    """Train ``model`` (an :class:`~smiexlm.model.model.ExLMModel`) in place for ``steps``
    updates of descriptor regression on ``rows`` (token ids of ``texts``, the model-side
    SMILES of the training molecules); returns the loss of the first and last tenth of the
    updates (normalised units) and the CPU seconds spent."""
    from smiexlm.chemistry.fingerprints import compute_descriptors
    from smiexlm.finetuning.batches import Examples, bucketed_batches, to_batch

    stats = model.descriptor_stats
    if model.descriptor_head is None or stats is None:
        raise ConfigError(
            "adapt_steps", steps, "0 for a backbone without a descriptor head and statistics "
            "(adaptation continues the descriptor regression of pretraining, objective mtr)",
        )  # fmt: skip
    start = time.process_time()
    targets = torch.from_numpy(stats.normalize(compute_descriptors(texts, stats.kind)))
    examples = Examples(rows, targets)
    device = next(model.parameters()).device
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    losses: list[float] = []
    batches: list[np.ndarray] = []
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        if not batches:  # the next epoch
            batches = bucketed_batches(examples.lengths(), batch_size, rng)
        batch = to_batch(examples, batches.pop(), device, pad_id)
        out = model(batch["input_ids"], batch["attention_mask"], descriptors=batch["labels"])
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
    tenth = max(1, steps // 10)
    return {"adapt_loss_first": float(np.mean(losses[:tenth])),
            "adapt_loss_last": float(np.mean(losses[-tenth:])),
            "adapt_cpu_s": time.process_time() - start}  # fmt: skip


def check_adapt(steps: int, lr: float) -> None:
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ConfigError("adapt_steps", steps, "0 (none) or a positive number of updates")
    if not (isinstance(lr, (int, float)) and 0 < lr < 1):
        raise ConfigError("adapt_lr", lr, "a learning rate in (0, 1)")
