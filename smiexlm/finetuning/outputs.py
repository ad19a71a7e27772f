"""What a finished fine-tuning seed keeps (:func:`write_outputs`): its scores and the test
molecules' nearness in its cell (``predictions.npz``), and the fine-tuned folder with its
reference (the embeddings and validation outputs the applicability domain and conformal
calibration read) and the token counts its weights were trained on."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from smiexlm.finetuning.backbone import Backbone
from smiexlm.finetuning.config import FinetuneConfig
from smiexlm.finetuning.folder import save_finetuned
from smiexlm.finetuning.targets import RunScores, Targets
from smiexlm.moleculenet import runs
from smiexlm.moleculenet.splits import Split
from smiexlm.moleculenet.task import MoleculeTask
from smiexlm.trust.reference import Reference

if TYPE_CHECKING:
    from smiexlm.finetuning.adapter import Setup


def write_outputs(run: Setup, task: MoleculeTask, split: Split, cfg: FinetuneConfig, seed: int,
                   backbone: Backbone, fitted, scores: RunScores, save_dir: Path | None,
                   run_dir: Path | None) -> None:  # fmt: skip
    """Write what a finished seed keeps: its scores and nearness in ``run_dir``
    (``predictions.npz``), the fine-tuned folder in ``save_dir``; nothing when both are None."""
    from smiexlm.finetuning import predict as engine_predict

    if save_dir is None and run_dir is None:
        return
    (train, valid, test), targets = run.parts, run.targets
    reference = build_reference(run.model, (train, valid), run.inputs, split, targets, cfg)
    if run_dir is not None:
        test_pooled = engine_predict(run.model, test, cfg.loop.eval_batch_size, output="pooled")
        nearness = reference.nearness([run.inputs[i] for i in split.test], test_pooled)
        runs.write_predictions(run_dir, split, scores.valid, scores.test, reference, nearness,
                               scores.parts)  # fmt: skip
        runs.write_history(run_dir, fitted.history)
    if save_dir is not None:
        scaler = None if run.scaler is None else run.scaler.to_dict()
        meta = dict(
            dataset=task.name, task_type=task.task_type, label_cols=task.label_cols,
            config=cfg.to_dict(), seed=seed, split=split.label, target_mean=targets.mean.tolist(),
            target_std=targets.std.tolist(), backbone=backbone.name, best_epoch=fitted.best_epoch,
            feature_scaler=scaler,
        )  # fmt: skip
        if (members := scores.members_record(cfg)) is not None:
            meta["members"] = members
        save_finetuned(run.model, run.tokenizer, save_dir, normalization=backbone.normalization,
                       meta=meta, reference=reference, forest=scores.forest, kernels=scores.kernels,
                       corpus_tokens=trained_tokens(backbone, train))  # fmt: skip


def trained_tokens(backbone: Backbone, train) -> tuple[np.ndarray, str] | None:
    """(V,) token counts of what a fine-tuned model's weights were trained on (the backbone's
    corpus, then every spelling of the training molecules) and what that was; None when the
    backbone keeps no record of its corpus."""
    counts = None if backbone.folder is None else backbone.folder.corpus_tokens
    if counts is None:
        return None
    source = f"the pretraining corpus of {backbone.name}"
    if train.rows is None:  # a frozen encoder: fine-tuning trained the head alone
        return counts, source
    rows = [*train.rows, *(row for spellings in train.variants or [] for row in spellings)]
    tuned = np.bincount(np.concatenate(rows), minlength=len(counts)) if rows else 0
    return counts + tuned, f"{source}, then {len(train.rows):,} fine-tuning training molecules"


def build_reference(model, parts, inputs: list[str], split: Split, targets: Targets,
               cfg: FinetuneConfig) -> Reference:  # fmt: skip
    """What the saved folder keeps for the applicability domain and calibration: the train
    and validation molecules' embeddings, the validation labels and served outputs
    (canonical SMILES, fp32)."""
    from smiexlm.finetuning import predict as engine_predict

    (train, valid), batch = parts, cfg.loop.eval_batch_size
    both = engine_predict(model, valid, batch, output="pooled+logits")  # one pass for both
    width = both.shape[1] - targets.y.shape[1]
    valid_pooled, valid_logits = both[:, :width], both[:, width:]
    return Reference.build(
        [inputs[i] for i in split.train], engine_predict(model, train, batch, output="pooled"),
        [inputs[i] for i in split.valid], valid_pooled,
        targets.y[split.valid], valid_logits, targets.to_scores(valid_logits),
    )  # fmt: skip
