"""Inputs shared by the analyses: a model folder with its vocabulary, SMILES files, batches.

Held-out SMILES default to ``$SMIEXLM_DATA/pretrain/moses_test.smi.gz`` (the analyses are
run on data the model did not train on, as in ExLM Appendix E.2 and MAE-LM §2.2).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor

from smiexlm.errors import ConfigError
from smiexlm.modelio.folder import ModelFolder
from smiexlm.modelio.pretrained import load_pretrained
from smiexlm.paths import check_not_a_file, data_dir

DEFAULT_SMILES = Path("pretrain") / "moses_test.smi.gz"


def default_smiles_file() -> Path:
    return data_dir() / DEFAULT_SMILES


def load_model_and_tokenizer(folder: Path):
    """``(model, tokenizer)`` of a ``save_pretrained`` folder, the model in eval mode."""
    reader = ModelFolder(check_not_a_file(folder))
    reader.check_reads_smiles()  # a folder without config.json fails here, naming it
    pre = load_pretrained(reader)
    return pre.model.eval(), pre.tokenizer


def check_models(folders: Sequence[Path], predict_tokens: bool = False) -> None:
    """Before any is loaded: a ConfigError naming the first of ``folders`` whose model does
    not read SMILES (a text model) or, with ``predict_tokens``, does not predict masked
    tokens (one pre-trained to regress descriptors), or a folder named twice."""
    named = [str(Path(folder).resolve()) for folder in folders]
    if len(set(named)) < len(named):
        raise ConfigError("checkpoints", [str(f) for f in folders], "each folder named once")
    for folder in folders:
        reader = ModelFolder(check_not_a_file(folder))
        reader.check_reads_smiles()
        if predict_tokens and reader.config.objective == "mtr":
            raise ConfigError("checkpoint", str(folder), "a model that predicts masked tokens "
                              "(objective mlm, exlm or maelm); this one regresses descriptors "
                              "(mtr) and has no token head")  # fmt: skip


def checkpoint_labels(folders: Sequence[Path | str]) -> list[str]:
    """A label per model folder for tables and plots: its name, or the path as given where
    two share a name (``runA/checkpoints/last`` and ``runB/checkpoints/last``)."""
    names = [Path(f).name for f in folders]
    return [n if names.count(n) == 1 else str(f) for n, f in zip(names, folders, strict=True)]


def readable_smiles(smiles: list[str]) -> tuple[list[str], list[tuple[int, str, str]]]:
    """The SMILES the tokenizer reads, and ``(row, smiles, reason)`` of each it cannot
    (``row``: its 0-based place among ``smiles``, as every rejects file counts), which an
    analysis leaves out."""
    from smiexlm.errors import InvalidSmilesError
    from smiexlm.tokenizer.smiles import split_smiles

    kept, rejects = [], []
    for row, text in enumerate(smiles):
        try:
            split_smiles(text)
        except InvalidSmilesError as err:
            rejects.append((row, text, str(err)))
        else:
            kept.append(text)
    return kept, rejects


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
