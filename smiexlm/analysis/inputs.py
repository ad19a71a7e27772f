"""Inputs shared by the analyses: a model folder with its vocabulary, SMILES files, batches.

Held-out SMILES default to ``$SMIEXLM_DATA/pretrain/moses_test.smi.gz`` (the analyses are
run on data the model did not train on, as in ExLM Appendix E.2 and MAE-LM §2.2).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from smiexlm.modelio.folder import ModelFolder
from smiexlm.modelio.pretrained import load_pretrained
from smiexlm.paths import check_not_a_file, data_dir

DEFAULT_SMILES = Path("pretrain") / "moses_test.smi.gz"


def default_smiles_file() -> Path:
    return data_dir() / DEFAULT_SMILES


def load_model_and_tokenizer(folder: Path):
    """``(model, tokenizer)`` of a ``save_pretrained`` folder, the model in eval mode."""
    reader = ModelFolder(check_not_a_file(folder))
    reader.config  # noqa: B018 (a folder without config.json fails here, naming it)
    pre = load_pretrained(reader)
    return pre.model.eval(), pre.tokenizer


def encode(tokenizer, smiles: list[str], max_length: int) -> tuple[Tensor, Tensor]:
    """(B, T) ids (BOS ... EOS, PAD = 0) and (B, T) bool mask (True = real token)."""
    batch = tokenizer.encode_batch(smiles, max_length=max_length, truncation="truncate")
    return batch.input_ids.long(), batch.attention_mask.bool()


def batches(ids: Tensor, mask: Tensor, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
    """Consecutive (b, T') slices, each trimmed to its longest row."""
    for start in range(0, ids.shape[0], batch_size):
        m = mask[start : start + batch_size]
        width = int(m.sum(1).max())
        yield ids[start : start + batch_size, :width], m[:, :width]


def masking_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
