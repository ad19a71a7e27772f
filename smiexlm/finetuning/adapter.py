"""MoleculeNet (and user CSV) adapter of the fine-tuning engine.

Recipe (paper §5.1, Table 8): sequence head on the first state's features (dense → tanh →
pooler dropout → out_proj), multi-label BCE with missing labels masked (MSE on standardised
targets for regression), validation after every epoch, the best-valid epoch's weights scored
once on test. The loop itself (optimizer, schedule, clipping, AMP, bucketed batches, early
stopping) is :func:`smiexlm.finetuning.fit`; this module turns a task and a split into
its inputs and its results into a :class:`RunResult`. Inputs have the pretraining form
(BOS ... EOS; the model expands them for ExLM), from canonical SMILES unless
``canonicalize=False``.

Where the encoder comes from, with its vocabulary and SMILES normalisation, is a
:class:`~smiexlm.finetuning.backbone.Backbone`.

A fine-tuned folder (``save_dir``) is written by
:func:`~smiexlm.finetuning.folder.save_finetuned` and served by
:func:`~smiexlm.serving.prediction.predict`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smiexlm.errors import ConfigError
from smiexlm.finetuning.adapt import adapt_descriptors
from smiexlm.finetuning.backbone import Backbone
from smiexlm.finetuning.config import (
    FinetuneConfig,
    kernel_kinds,
    resolve_forest,
    variant_name,
)
from smiexlm.finetuning.folder import check_free_seed_folders
from smiexlm.finetuning.outputs import write_outputs
from smiexlm.finetuning.targets import RunScores, Targets
from smiexlm.forests.members import check_kernel_rows
from smiexlm.model.inputs import UnseenTokens
from smiexlm.modelio.seed_record import record_seeds
from smiexlm.moleculenet import runs
from smiexlm.moleculenet.cliffs import task_cliffs
from smiexlm.moleculenet.report import RunResult
from smiexlm.moleculenet.splits import Split
from smiexlm.moleculenet.task import MoleculeTask, check_seeds, check_task, run_seeds
from smiexlm.paths import check_output

log = logging.getLogger(__name__)


def loop_config(cfg: FinetuneConfig, higher_is_better: bool):
    """The engine's settings for a MoleculeNet config: its loop, selecting the best epoch."""
    return dataclasses.replace(cfg.loop, select="best", higher_is_better=higher_is_better)


def with_backbone_blocks(cfg: FinetuneConfig, backbone: Backbone) -> FinetuneConfig:
    """``cfg`` with its ``layers`` set: the backbone's own embedding blocks when None."""
    return cfg if cfg.layers is not None else dataclasses.replace(cfg, layers=backbone.layers)


def _hybrid_features(cfg: FinetuneConfig, inputs: list[str], raw: np.ndarray | None, split: Split):
    """(features tensor, scaler) of the hybrid head, scaled on train; (None, None) without."""
    from smiexlm.forests.features import FeatureScaler

    if not cfg.features:
        return None, None
    if raw is None:
        from smiexlm.chemistry.fingerprints import molecule_features

        raw = molecule_features(inputs, cfg.features, cache=True)
    scaler = FeatureScaler.fit(raw[np.asarray(split.train)], cfg.features)
    return torch.from_numpy(scaler.transform(raw)), scaler


def _variants(backbone, tokenizer, inputs, rows, n: int, cfg: FinetuneConfig, seed: int):
    """``n`` random SMILES of each molecule ``rows`` as token ids, or None when n is 0 (the
    spellings depend on the seed and the molecule, :func:`~smiexlm.data.augment.random_smiles`)."""
    if not n:
        return None
    from smiexlm.data.augment import random_smiles

    texts = [inputs[i] for i in rows]
    spellings = random_smiles(texts, n, seed)
    flat, _ = backbone.inputs(tokenizer).rows([s for per in spellings for s in per], cfg.max_length)
    return [flat[k * n : (k + 1) * n] for k in range(len(texts))]


def _class_weights(task: MoleculeTask, split: Split, cfg: FinetuneConfig) -> np.ndarray | None:
    """(2, T) loss weights of each task's classes on the training molecules, or None."""
    check_class_weight(task, cfg)
    if cfg.class_weight == "none":
        return None
    from smiexlm.model.heads import balanced_class_weights

    return balanced_class_weights(task.labels[np.asarray(split.train)])


#: below this share of positives among a classification set's labels, unweighted fine-tuning
#: is warned that it may settle on the prior (as MUV's 0.2 % did; its config weighs the classes)
RARE_POSITIVES = 0.01


def warn_rare_positives(task: MoleculeTask, cfg: FinetuneConfig) -> float | None:
    """Warn, and return the share of positives, when an unweighted classification set holds
    fewer than :data:`RARE_POSITIVES` of them; None otherwise."""
    labels = task.labels[~np.isnan(task.labels)]
    if cfg.class_weight != "none" or not task.is_classification or not labels.size:
        return None
    share = float((labels > 0.5).mean())
    if share >= RARE_POSITIVES:
        return None
    log.warning("%s: %.2f %% of its labels are positive; unweighted, fine-tuning can settle on "
                "the prior and rank the positives at chance for many epochs (MUV's did); "
                "--class-weight balanced weighs each task's classes inversely to their "
                "frequency", task.name, 100 * share)  # fmt: skip
    return share


def check_class_weight(task: MoleculeTask, cfg: FinetuneConfig) -> None:
    """ConfigError when ``cfg`` weighs the classes of a regression task."""
    if cfg.class_weight != "none" and not task.is_classification:
        raise ConfigError("class_weight", cfg.class_weight,
                          f"'none' for {task.name}, a regression task (classes are weighted "
                          "in classification only)")  # fmt: skip


@dataclass
class Setup:
    """A seed's run before training: the model-side SMILES and their tokenizer, the model, its
    (train, valid, test) examples, the targets and the hybrid features' scaler."""

    inputs: list[str]
    tokenizer: Any
    n_cut: int  # inputs cut to cfg.max_length tokens
    unknown: tuple[int, int]  # ([UNK] tokens, molecules holding one)
    targets: Targets
    scaler: Any  # FeatureScaler, or None without hybrid features
    model: Any  # ExLMForSequencePrediction
    parts: tuple[Any, Any, Any]  # (train, valid, test) Examples
    adapted: dict[str, Any]  # what the descriptor adaptation reports, {} without one


def _setup(task: MoleculeTask, split: Split, cfg: FinetuneConfig, seed: int, backbone: Backbone,
           inputs: list[str] | None, raw_features: np.ndarray | None) -> Setup:  # fmt: skip
    """Tokenize, scale the targets and features on train, build the seeded model (after the
    descriptor adaptation, when asked for) and its examples, in the order that fixes the
    random state of the run."""
    from smiexlm.finetuning import Examples
    from smiexlm.model.heads import ExLMForSequencePrediction

    inputs = inputs if inputs is not None else backbone.model_texts(task.smiles, cfg.canonicalize)
    tokenizer = backbone.tokenizer(inputs)
    model_inputs = backbone.inputs(tokenizer)
    rows, cut = model_inputs.rows(inputs, cfg.max_length)
    if len(cut) > len(rows) / 10:  # a cut molecule loses its tail: say so where many are
        log.warning("%s: max_length=%d cuts %d of %d molecules, which the model reads only in "
                    "part; raise max_length to read them whole", task.name, cfg.max_length,
                    len(cut), len(rows))  # fmt: skip
    unknown = model_inputs.unknown(rows)
    if unknown[1]:
        log.warning("%s: %d of %d molecules hold %d tokens outside the model's vocabulary "
                    "([UNK])", task.name, unknown[1], len(rows), unknown[0])  # fmt: skip
    if (unseen := model_inputs.unseen(rows)) and any(unseen):
        log.warning("%s: %s; fine-tuning trains those its training molecules hold",
                    task.name, UnseenTokens().add(unseen).describe())  # fmt: skip
    targets = Targets.fit(task, split)
    class_weights = _class_weights(task, split, cfg)
    features, scaler = _hybrid_features(cfg, inputs, raw_features, split)
    torch.manual_seed(seed)
    encoder, adapted = backbone.build(tokenizer, cfg.dropout), {}
    if cfg.adapt_steps:  # descriptor regression on the training molecules first
        adapted = adapt_descriptors(encoder, [rows[i] for i in split.train],
                                    [inputs[i] for i in split.train], cfg.adapt_steps,
                                    cfg.adapt_lr, cfg.loop.batch_size, seed)  # fmt: skip
    model = ExLMForSequencePrediction(
        encoder, len(task.label_cols),
        "multilabel" if task.is_classification else "regression", cfg.pooler_dropout,
        cfg.pooling, n_features=0 if features is None else features.shape[1],  # type: ignore[arg-type]
        layers=cfg.layers, class_weights=class_weights,
    )  # fmt: skip
    examples = Examples(rows, targets.scaled(), features)
    train, valid, test = (examples.subset(np.asarray(p)) for p in (split.train, split.valid, split.test))  # fmt: skip
    train.variants = _variants(backbone, tokenizer, inputs, split.train, cfg.augment, cfg, seed)
    valid.variants = _variants(backbone, tokenizer, inputs, split.valid, cfg.tta, cfg, seed)
    test.variants = _variants(backbone, tokenizer, inputs, split.test, cfg.tta, cfg, seed)
    return Setup(inputs, tokenizer, len(cut), unknown, targets, scaler, model, (train, valid, test),
                  adapted)  # fmt: skip


def finetune_once(
    task: MoleculeTask,
    split: Split,
    cfg: FinetuneConfig,
    seed: int,
    backbone: Backbone,
    save_dir: Path | None = None,
    inputs: list[str] | None = None,
    raw_features: np.ndarray | None = None,
    progress: bool = True,
    run_dir: Path | None = None,
    on_epoch: Callable[[int, float], None] | None = None,
) -> RunResult:
    """One seed: train on ``split.train``, select on valid per epoch, score test (NaN when
    ``split.test`` is empty); ``on_epoch(epoch, valid score)`` is the loop's hook.

    ``inputs`` are the model-side SMILES when already prepared (:meth:`Backbone.model_texts`);
    ``raw_features`` the unscaled hybrid features of every row, when already computed.
    ``run_dir`` keeps the run's state after every epoch (``state/``, and a run that finds one
    there goes on from it) and, at the end, its scores (``predictions.npz``) and result
    (``result.json``); see :mod:`smiexlm.moleculenet.runs`.
    """
    from smiexlm.finetuning import FitRun, fit

    t0 = time.perf_counter()
    task = check_task(task)
    cfg = _resolved(cfg, task, split, backbone)
    run = _setup(task, split, cfg, seed, backbone, inputs, raw_features)
    (train, valid, _), targets = run.parts, run.targets
    loop = loop_config(cfg, higher_is_better=task.is_classification)
    state = None if run_dir is None else runs.state_dir(run_dir)
    identity = runs.identity(task, split, cfg, backbone)
    driven = FitRun(seed, progress, f"{task.name} seed {seed}", state, identity, on_epoch)
    fitted = fit(run.model, train, valid, loop,
                 lambda logits: targets.score(split.valid, logits).mean, driven)  # fmt: skip
    scores, config = _served_scores(run, task, split, cfg, backbone, fitted)
    valid_score, test_score = fitted.best_valid, targets.score_values(split.test, scores.test)
    if cfg.forest:
        scores.add_forest(run.inputs, task, split, seed, cfg)
    if not task.is_classification and kernel_kinds(cfg):
        embedder = None if backbone.folder is None else backbone.folder.path
        scores.add_kernels(run.inputs, task, split, seed, cfg, embedder)
        config |= {f"member_weight_{n}": round(w, 4) for n, w in scores.weights.items()}
        config |= {f"cv_rmse_{n}": v for n, v in scores.cv_rmse.items()}
    if scores.parts:
        config |= scores.forest_summary(targets, split, task.scale)
        if not task.is_classification:  # each alone on the test molecules of activity cliffs
            cliffs = task_cliffs(task, split.test, gap=cfg.cliff_gap)
            config |= scores.cliff_summary(targets, split, cliffs)
        valid_score = targets.score_values(split.valid, scores.valid).mean
        test_score = targets.score_values(split.test, scores.test)
    if not runs.is_main():
        save_dir = run_dir = None  # one process writes
    write_outputs(run, task, split, cfg, seed, backbone, fitted, scores, save_dir, run_dir)
    result = task.result(variant_name(backbone, cfg), split, seed, valid_score, test_score,
                         time.perf_counter() - t0, config, fitted.best_epoch, scores.test)  # fmt: skip
    if run_dir is not None:
        runs.finish(run_dir, result)
    return result


def _resolved(cfg: FinetuneConfig, task: MoleculeTask, split: Split,
              backbone: Backbone) -> FinetuneConfig:  # fmt: skip
    """``cfg`` as it runs on ``task`` with ``backbone`` (its forest, kernels and head blocks);
    DataError before training where the kernel members' folds lack training molecules."""
    embedding = backbone.folder is not None  # a random init has no frozen embedding
    cfg = resolve_forest(cfg, task.task_type, len(task.label_cols), embedding)
    if not task.is_classification and kernel_kinds(cfg):
        check_kernel_rows(task.labels[np.asarray(split.train, np.intp)], task.label_cols)
    return with_backbone_blocks(cfg, backbone)


def _served_scores(run: Setup, task: MoleculeTask, split: Split, cfg: FinetuneConfig,
                   backbone: Backbone, fitted) -> tuple[RunScores, dict]:  # fmt: skip
    """The fitted model's validation and test scores, as ``predict`` serves them (fp32,
    batch-invariant, so the reported score is the one a user gets back from the saved
    model), and the run's config record."""
    from smiexlm.finetuning import predict_views

    _, valid, test = run.parts
    targets = run.targets
    test_views = predict_views(run.model, test, cfg.loop.eval_batch_size)  # (V, N, T)
    valid_views = predict_views(run.model, valid, cfg.loop.eval_batch_size)
    scores = RunScores(targets.to_scores(valid_views.mean(axis=0)),
                     targets.to_scores(valid_views[0]), targets.to_scores(test_views.mean(axis=0)))  # fmt: skip
    backbone_record = {"backbone": backbone.name, "backbone_sha256": backbone.weights_sha256}
    counts = {"n_truncated": run.n_cut, "n_unk_tokens": run.unknown[0],
              "n_unk_molecules": run.unknown[1]}  # fmt: skip
    config = cfg.to_dict() | backbone_record | counts | fitted.summary()
    config |= run.adapted
    config["processes"] = runs.processes()
    if len(test_views) > 1:  # what the canonical SMILES alone scores, beside the mean
        config["test_canonical"] = targets.score(split.test, test_views[0]).mean * task.scale
    return scores, config


def _refuse_early(task: MoleculeTask, cfg: FinetuneConfig, seeds: Sequence[int],
                  save_dir: Path | None, run_root: Path | None, resume: bool,
                  overwrite: bool) -> None:  # fmt: skip
    """What :func:`run_finetune` refuses before anything trains: class weights the task
    cannot take, a run folder already there without ``resume``, a wide ensemble over several
    processes, and a ``save_dir`` whose seed folders are taken."""
    check_class_weight(task, cfg)
    warn_rare_positives(task, cfg)
    if run_root is not None and not resume:
        runs.check_fresh(run_root, task.name, seeds)
    if cfg.ensemble != "none" and runs.processes() > 1:
        raise ConfigError("ensemble", cfg.ensemble, "'none' in a run of several processes (a "
                          "wide ensemble fine-tunes its members one after the other)")  # fmt: skip
    if save_dir is not None:
        check_output(save_dir, "--save-dir", "folder")
        check_seeds(seeds)
        fresh = [
            s for s in seeds if run_root is None or not runs.is_finished(run_root, task.name, s)
        ]
        check_free_seed_folders(Path(save_dir), fresh, overwrite)  # a finished run's are its own


def run_finetune(
    task: MoleculeTask,
    cfg: FinetuneConfig,
    backbone: Backbone | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    save_dir: Path | None = None,
    progress: bool = True,
    run_root: Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> list[RunResult]:
    """``finetune_once`` per seed (a deterministic split is made once); ``save_dir`` gets one
    fine-tuned folder per seed (``seed0``, ``seed1``, ...), replacing one that exists only
    when ``overwrite`` (a finished run read back with ``resume`` keeps the one it wrote), and
    the record of the seeds it holds (:mod:`smiexlm.modelio.seed_record`).

    ``run_root`` keeps each (set, seed) run in ``run_root/<set>/seed<k>/``: its state after
    every epoch, then its result. With ``resume`` a finished run's result is read back instead
    of trained again, and a stopped run goes on from its last epoch; without it, a run folder
    that is already there is refused (:func:`smiexlm.moleculenet.runs.check_fresh`)."""
    task = check_task(task)
    _refuse_early(task, cfg, seeds, save_dir, run_root, resume, overwrite)
    backbone = backbone or Backbone()
    cfg = with_backbone_blocks(resolve_forest(cfg, task.task_type, len(task.label_cols)), backbone)

    @functools.cache
    def texts() -> list[str]:
        """The model's texts, made when a seed first trains (a finished run read back needs
        none)."""
        return backbone.model_texts(task.smiles, cfg.canonicalize)

    @functools.cache
    def features_of(kind: str | None) -> np.ndarray | None:
        """The hybrid features beside the head (None without): on MUV they take minutes."""
        if not kind:
            return None
        from smiexlm.chemistry.fingerprints import molecule_features

        return molecule_features(texts(), kind, cache=True)

    def one_seed(split: Split, seed: int) -> RunResult:
        run_dir = None if run_root is None else runs.run_dir(run_root, task.name, seed)
        if run_dir is not None and (done := runs.finished(run_dir)) is not None:
            log.info("%s seed %d: finished before (%s)", task.name, seed, run_dir)
            expected = runs.identity(task, split, cfg, backbone)
            return runs.check_finished(done, run_dir, expected, type(cfg))
        target = None if save_dir is None else Path(save_dir) / f"seed{seed}"
        if cfg.ensemble == "wide":
            r = _wide_seed(task, split, cfg, seed, backbone, target, texts(), features_of,
                           progress, run_dir)  # fmt: skip
        else:
            r = finetune_once(task, split, cfg, seed, backbone, target, texts(),
                              features_of(cfg.features), progress, run_dir)  # fmt: skip
        log.info("%s seed %d: valid %.2f test %.2f", r.dataset, seed, r.valid, r.test)
        if target is not None and runs.is_main():  # predict refuses it with a seed gone
            record_seeds(save_dir, [seed])
        return r

    return run_seeds(task, seeds, cfg.split, one_seed)


def _wide_seed(task, split, cfg, seed, backbone, target, inputs, features_of, progress, run_dir):
    """:func:`smiexlm.finetuning.ensemble.fit_seed`, its members' runs kept in a temporary
    folder when no run folder is given."""
    import tempfile

    from smiexlm.finetuning.ensemble import fit_seed

    def fit(root: Path) -> RunResult:
        return fit_seed(task, split, cfg, seed, backbone, target, inputs, features_of, progress,
                        root, finetune_once, variant_name(backbone, cfg))  # fmt: skip

    if run_dir is not None:
        return fit(run_dir)
    with tempfile.TemporaryDirectory(prefix="smiexlm-ensemble-") as tmp:
        return fit(Path(tmp))
