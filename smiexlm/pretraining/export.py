"""Package a pretraining run as a self-describing model folder with a model card.

The folder holds what ``ExLMModel.from_pretrained`` and ``Featurizer.from_pretrained`` read
(``config.json``, ``vocab.json``, ``model.safetensors`` and ``checksums.json``, its sha256,
checked on every load), plus ``normalization.json`` (how the corpus SMILES were normalised, so
the featurizer applies the same), ``corpus_tokens.json`` (each token's count in the training
split, when the dataset is given: which embeddings were never trained) and ``MODEL_CARD.md``:
the training data, steps, tokens seen, final train/valid losses and the exact command.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smiexlm.atomic import atomic_dir
from smiexlm.data.normalize import REWRITES
from smiexlm.data.shards import read_manifest
from smiexlm.errors import DataError
from smiexlm.model.pooling import pooling_parts
from smiexlm.modelio.layout import (
    CARD_NAME,
    CORPUS_TOKENS_NAME,
    EMBEDDING_NAME,
    NORMALIZATION_NAME,
    WEIGHTS_NAME,
)
from smiexlm.modelio.pretrained import load_pretrained
from smiexlm.modelio.records import (
    DEFAULT_NORMALIZATION,
    write_corpus_tokens,
    write_embedding,
    write_normalization,
)
from smiexlm.paths import check_output, read_json_file
from smiexlm.tokenizer.special import N_SPECIAL_TOKENS


@dataclass
class RunSummary:
    """What a run's metrics and trainer state say about it."""

    step: int
    tokens_seen: int
    train_loss: float  # mean of the last logged training losses
    valid_loss: float | None  # at the exported checkpoint's last evaluation
    best_valid_loss: float | None
    wall_s: float


def summarise_run(run_dir: Path, checkpoint: Path, last_n: int = 5) -> RunSummary:
    """Read ``metrics.jsonl`` and the checkpoint's trainer state."""
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise DataError(f"run folder {str(run_dir)!r} has no metrics.jsonl")
    lines = metrics_path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):  # only the last line may be cut short by a killed run
                raise DataError(f"{str(metrics_path)!r} line {number} is not JSON") from None
    _, trainer_state = read_json_file(checkpoint / "trainer_state.json", "trainer state")
    state = trainer_state["state"]
    step = int(state["step"])
    upto = [r for r in records if r["step"] <= step]
    if not upto:
        raise DataError(f"metrics.jsonl of {str(run_dir)!r} has no record up to step {step}")
    train = [r["loss"] for r in upto if "loss" in r][-last_n:]
    valid = [r["valid_loss"] for r in upto if r.get("valid_loss") is not None]
    return RunSummary(
        step=step,
        tokens_seen=int(state["tokens_seen"]),
        train_loss=sum(train) / len(train),
        valid_loss=valid[-1] if valid else None,
        best_valid_loss=state.get("best_valid_loss"),
        wall_s=float(upto[-1].get("elapsed_s", 0.0)),
    )


def export_run(
    run_dir: Path,
    out_dir: Path,
    checkpoint: str = "last",
    dataset: Path | None = None,
    fp16: bool = True,
    command: str | None = None,
    pooling: str = "cls",
) -> Path:
    """Write ``out_dir`` from ``run_dir/checkpoints/<checkpoint>``; returns the card's path.
    ``pooling`` is what the featurizer and the probe use when a caller names none
    (``embedding.json``)."""
    import torch

    run_dir, out_dir = Path(run_dir), Path(out_dir)
    source = run_dir / "checkpoints" / checkpoint
    if not (source / WEIGHTS_NAME).is_file():
        raise DataError(
            f"checkpoint {str(source)!r} does not exist: expected a run folder of "
            "`smiexlm pretrain` and a checkpoint name such as 'last' or 'best'"
        )
    check_output(out_dir, "--out", "folder")  # a file there is refused, never replaced
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / CARD_NAME).is_file():
        raise DataError(
            f"--out {str(out_dir)!r} is a folder with other files in it: expected a new folder "
            "or a model folder written by an earlier export (which is replaced)"
        )
    pooling_parts(pooling)
    if dataset is not None:
        _check_trained_on(source, Path(dataset))
    manifest = _read_manifest(dataset if dataset is not None else _trained_on(source))
    pre = load_pretrained(source)
    corpus = manifest.get("config", {})
    normalization = dataclasses.replace(
        DEFAULT_NORMALIZATION,
        **{name: bool(corpus.get(name, getattr(DEFAULT_NORMALIZATION, name))) for name in REWRITES},
    )
    summary = summarise_run(run_dir, source)
    _, train_config = read_json_file(source / "train_config.json", "training config")
    corpus = None if dataset is None else dataset_tokens(pre.tokenizer, Path(dataset))
    card = _card(pre.model, summary, manifest, normalization, train_config, command, fp16, pooling,
                 None if corpus is None else corpus[0])  # fmt: skip
    # The folder appears complete or not at all: written under a temporary name, renamed.
    with atomic_dir(out_dir) as tmp:
        pre.model.save_pretrained(tmp, tokenizer=pre.tokenizer, dtype=torch.float16 if fp16 else None)  # fmt: skip
        write_normalization(tmp, normalization)
        write_embedding(tmp, pooling)
        if corpus is not None:
            write_corpus_tokens(tmp, pre.tokenizer.tokens, *corpus)
        (tmp / CARD_NAME).write_text(card)
    return out_dir / CARD_NAME


def dataset_tokens(tokenizer, dataset: Path) -> tuple[np.ndarray, str]:
    """(V,) token counts of the training split of the preprocessed ``dataset`` a model was
    pretrained on (its vocabulary must be the model's), and the record's ``source``."""
    from smiexlm.data.shards import TokenDataset

    train = TokenDataset(dataset, "train")
    if train.vocab_hash != tokenizer.vocab_hash:
        raise DataError(
            f"--data {str(dataset)!r} was tokenized with vocabulary {str(train.vocab_hash)[:12]}…"
            f" and the model's is {tokenizer.vocab_hash[:12]}…: expected the dataset the model "
            "was pretrained on"
        )
    return train.token_counts(tokenizer.vocab_size), f"{dataset.name}, train split ({len(train):,} molecules)"  # fmt: skip


def _trained_line(counts: np.ndarray | None) -> str:
    """The card's line on the vocabulary the corpus covered ("" without the counts)."""
    if counts is None:
        return ""
    ordinary = counts[N_SPECIAL_TOKENS:]
    return (f"\n- tokens trained: {int((ordinary > 0).sum())} of the vocabulary's {len(ordinary)} "
            f"(`{CORPUS_TOKENS_NAME}`); the others never occurred in the training split, so "
            "the model never read them as input. `featurize`, `embed` and `predict` say which "
            "molecules hold them; `smiexlm vocab corpus` lists them.")  # fmt: skip


def _check_trained_on(checkpoint: Path, dataset: Path) -> None:
    """DataError unless ``dataset`` is the one the run trained on: the content id its
    checkpoint records (``trainer_state.json``), as ``pretrain --resume`` checks it. A moved
    or copied dataset passes; a checkpoint written before the id was recorded is not checked."""
    from smiexlm.pretraining.resume import dataset_id

    state = _recorded_state(checkpoint)
    trained = state.get("data_id")
    if trained is not None and trained != (given := dataset_id(dataset)):
        raise DataError(
            f"--data {str(dataset)!r} (content id {given}) is not the dataset the run trained "
            f"on ({state.get('data_dir')!r}, content id {trained}): the card's counts and the "
            "model's trained tokens would describe another corpus; expected the run's dataset"
        )


def _trained_on(checkpoint: Path) -> Path | None:
    """The dataset the checkpoint records it trained on, whose normalisation (canonical
    SMILES, salts, stereo) the model folder must keep: a DataError when it is not there (pass
    --data); None for a checkpoint older than the record (the defaults are written)."""
    recorded = _recorded_state(checkpoint).get("data_dir")
    if recorded is None:
        return None
    if not (Path(recorded) / "manifest.json").is_file():
        raise DataError(
            f"the run trained on the dataset {recorded!r}, which is not there: pass --data "
            "with it, so that the model folder keeps how its SMILES were normalised (salts, "
            "stereo), which the featurizer applies to every input"
        )
    return Path(recorded)


def _recorded_state(checkpoint: Path) -> dict:
    """The trainer state a checkpoint records (its dataset's folder and content id)."""
    from smiexlm.training.run_state import STATE_FILE

    _, payload = read_json_file(checkpoint / STATE_FILE, f"checkpoint {STATE_FILE}")
    return payload.get("state") if isinstance(payload.get("state"), dict) else {}


def _read_manifest(dataset: Path | None) -> dict:
    if dataset is None:
        return {}
    return read_manifest(Path(dataset))


def _descriptor_line(c, stats) -> str:
    """What the model was taught about descriptors (which, how), for the card."""
    which = f" of {stats.n_descriptors:,} {stats.kind} descriptors" if stats is not None else ""
    what = (f"{c.descriptor_loss.upper()} on the {c.descriptor_pooling} state{which}, "
            "median/IQR-normalised")  # fmt: skip
    if c.objective == "mtr":
        return f"the whole objective: {what} (`descriptors.json`)"
    if c.aux_descriptor_weight > 0:
        return (f"auxiliary, weight {c.aux_descriptor_weight:g}, on the {c.aux_descriptor_input} "
                f"input: {what} (`descriptors.json`)")  # fmt: skip
    return "none"


def _card(model, s: RunSummary, manifest, normalization, train_config, command, fp16, pooling,
          corpus_counts=None) -> str:  # fmt: skip
    c = model.config
    n_params = model.num_parameters()
    splits = manifest.get("splits", {})

    def count(split: str, key: str) -> str:  # "?" when no dataset manifest was given
        value = splits.get(split, {}).get(key)
        return f"{value:,}" if isinstance(value, int) else "?"

    sources = "\n".join(
        f"  - `{Path(src['path']).name}` ({src.get('role', '?')}), sha256 `{src['sha256'][:16]}…`"
        for src in manifest.get("sources", [])
    )
    valid = f"{s.valid_loss:.4f}" if s.valid_loss is not None else "not evaluated"
    descriptors = _descriptor_line(c, model.descriptor_stats)
    best = f"{s.best_valid_loss:.4f}" if s.best_valid_loss is not None else "–"
    return f"""# Model card: {c.objective} ({c.n_layers} layers, d {c.d_model}, {n_params / 1e6:.2f}M parameters)

| field | value |
|---|---|
| objective | `{c.objective}`{f" (k = {c.k}, 2D RoPE {c.rope_2d}, transitions {c.transitions}, DAG {c.dag})" if c.objective == "exlm" else ""} |
| descriptor regression | {descriptors} |
| architecture | {c.n_layers} layers, {c.n_heads} heads, d_model {c.d_model}, FFN {c.d_ff}, pre-norm, RoPE |
| embedding | {pooling} pooling of the last block, what the featurizer and the probe use unless told otherwise (`{EMBEDDING_NAME}`) |
| parameters | {n_params:,} (weights stored in {"fp16" if fp16 else "fp32"}) |
| vocabulary | {c.vocab_size} tokens, hash `{c.vocab_hash}` |
| updates | {s.step:,} |
| tokens seen | {s.tokens_seen:,} |
| final train loss | {s.train_loss:.4f} (mean of the last logged values) |
| final valid loss | {valid} (best {best}) |
| wall time | {s.wall_s / 60:.1f} min |
| optimiser | Adam β {tuple(train_config.get("adam_betas", ()))}, lr {train_config.get("lr")}, warmup {train_config.get("warmup_steps")}, polynomial decay to {train_config.get("end_lr")} over {train_config.get("total_steps") or train_config.get("max_steps")} updates, clip {train_config.get("clip_norm")}, {train_config.get("max_tokens")} tokens per batch |
| start | {f"the weights of `{train_config['init']}` (continued pre-training)" if train_config.get("init") else "random weights"} |
| spelling | {"a fresh random SMILES of each molecule each time it comes round" if train_config.get("spelling") == "random" else "each molecule as the dataset stores it"} |

## Training data

- molecules: {count("train", "molecules")} train / {count("valid", "molecules")} valid, {count("train", "tokens")} train tokens
- sources:
{sources or "  - (dataset manifest not given)"}
- normalisation: RDKit canonical SMILES {"on" if normalization.canonicalize else "off"}, stereo {"stripped" if normalization.strip_stereo else "kept"}, salt stripping {"on" if normalization.strip_salts else "off"}. The featurizer applies the same (`{NORMALIZATION_NAME}`).{_trained_line(corpus_counts)}

## Command

```bash
{command or "(not recorded)"}
```
"""
