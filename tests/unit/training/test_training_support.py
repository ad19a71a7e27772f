"""Shared pieces of the training tests: a tiny dataset built by the real pipeline."""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

# A model small enough that a step takes milliseconds on one thread.
MICRO_MODEL = [
    "model.n_layers=2",
    "model.n_heads=2",
    "model.d_model=32",
    "model.d_ff=64",
    "model.n_transition_heads=2",
    "model.dropout=0.0",
    "model.attention_dropout=0.0",
]
FAST = [
    "max_tokens=512",
    "update_freq=1",
    "warmup_steps=2",
    "lr=0.003",
    "log_every=1",
    "valid_every=4",
    "valid_batches=2",
    "save_every=4",
    "keep_last=2",
    "num_threads=1",
    "progress=false",
]


def build_dataset(source_gz: Path, out: Path, n: int = 300) -> Path:
    """A dataset folder from the first ``n`` SMILES of a gzip file, with its own vocabulary."""
    from smiexlm.data.pipeline import PreprocessConfig, preprocess
    from smiexlm.tokenizer import SmilesTokenizer

    with gzip.open(source_gz, "rt") as handle:
        smiles = [next(handle).strip() for _ in range(n)]
    out.mkdir(parents=True, exist_ok=True)
    raw = out.parent / f"{out.name}.smi"
    raw.write_text("\n".join(smiles) + "\n")
    vocab = out.parent / f"{out.name}.vocab.json"
    SmilesTokenizer.build(smiles).save(vocab)
    config = PreprocessConfig(valid_fraction=0.1)
    preprocess([raw], out, config, vocab=vocab, progress=False)
    return out


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "smiexlm.cli.main", *args]
