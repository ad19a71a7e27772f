"""The classical reference: RandomForest on ECFP4 bits, RDKit 2D descriptors, or both.

``features``: ``ecfp4`` (Morgan radius 2, 2048 bits), ``rdkit2d`` (every descriptor of
``rdkit.Chem.Descriptors.descList``, the same code as the hybrid fine-tuning features and the
descriptor pretraining targets) or ``both`` (the two side by side). Descriptors go through the
hybrid features' :class:`~smiexlm.forests.features.FeatureScaler` fitted on the train
rows of each split: missing values (and the astronomically large ones, such as ``Ipc``, that
``rdkit2d_descriptors`` turns into NaN) take the train median, and values beyond
``DESCRIPTOR_CLIP`` train standard deviations are clipped (a forest only sees the order of
values, so the scaling changes nothing else).
Same data, same splits and same seeds as fine-tuning. One forest per task, trained on the
train rows whose label for that task is known; a task whose train labels hold one class only
predicts that class's prior. No model selection: the valid score is reported, not used.
Classes are weighted inversely to their frequency by default (``class_weight="balanced"``):
on the imbalanced sets (ClinTox, SIDER) unweighted forests score ~10 points lower.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import sparse
from tqdm.auto import tqdm

from smiexlm.atomic import atomic_paths
from smiexlm.chemistry.fingerprints import FEATURE_KINDS, morgan_fingerprints, rdkit2d_descriptors
from smiexlm.errors import ConfigError
from smiexlm.forests.features import FeatureScaler
from smiexlm.moleculenet.metrics import score
from smiexlm.moleculenet.report import RunResult
from smiexlm.moleculenet.runs import (
    check_fresh,
    finish,
    finished,
    is_finished,
    keep_predictions,
    refuse_a_difference,
    run_dir,
    state_dir,
    task_pairs,
)
from smiexlm.moleculenet.splits import check_split_kind
from smiexlm.moleculenet.task import MoleculeTask, check_task, run_seeds

log = logging.getLogger(__name__)

BASELINE_FEATURES = FEATURE_KINDS
FEATURE_LABELS = {"ecfp4": "ECFP4", "rdkit2d": "RDKit2D", "both": "ECFP4+RDKit2D"}
DESCRIPTOR_CLIP = 1e4  # train standard deviations


@dataclass
class BaselineConfig:
    features: str = "ecfp4"  # ecfp4 | rdkit2d | both
    n_trees: int = 500
    radius: int = 2
    n_bits: int = 2048
    split: str = "scaffold"
    n_jobs: int = 1
    class_weight: str = "balanced"  # "balanced" | "none"

    @property
    def model_name(self) -> str:
        weighting = ", unweighted" if self.class_weight == "none" else ""
        return f"RF-{FEATURE_LABELS[self.features]} ({self.n_trees} trees{weighting})"

    def __post_init__(self) -> None:
        if self.features not in BASELINE_FEATURES:
            raise ConfigError("features", self.features, f"one of {', '.join(BASELINE_FEATURES)}")
        if self.n_trees < 1:
            raise ConfigError("n_trees", self.n_trees, "a positive integer")
        if self.radius < 0 or self.n_bits < 8:
            raise ConfigError(
                "radius/n_bits", (self.radius, self.n_bits), "radius >= 0, n_bits >= 8"
            )
        if self.class_weight not in ("balanced", "none"):
            raise ConfigError("class_weight", self.class_weight, "'balanced' or 'none'")
        check_split_kind(self.split)


def fit_forests(
    x_train: np.ndarray | sparse.csr_matrix, y_train: np.ndarray, task_type: str, seed: int,
    cfg: BaselineConfig,
) -> list:  # fmt: skip
    """One fitted forest per task, on the train rows whose label is known; a classification
    task whose known train labels hold one class (or none) gets its prior instead (a float:
    the class-1 share, 0.5 with no label), a regression task without a known label NaN (in a
    fold of a sparse table)."""
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

    fitted: list = []
    for t in range(y_train.shape[1]):
        known = ~np.isnan(y_train[:, t])
        y = y_train[known, t]
        if task_type == "classification" and len(np.unique(y)) < 2:
            fitted.append(float(y.mean()) if len(y) else 0.5)
            continue
        if not len(y):
            fitted.append(float("nan"))
            continue
        if task_type == "classification":
            weight = None if cfg.class_weight == "none" else cfg.class_weight
            forest = RandomForestClassifier(
                n_estimators=cfg.n_trees, n_jobs=cfg.n_jobs, random_state=seed, class_weight=weight
            )
        else:
            forest = RandomForestRegressor(
                n_estimators=cfg.n_trees, n_jobs=cfg.n_jobs, random_state=seed
            )
        fitted.append(forest.fit(x_train[known], y))
    return fitted


def forest_scores(
    fitted: list, x_eval: np.ndarray | sparse.csr_matrix, task_type: str
) -> np.ndarray:
    """Scores (N_eval, T) of :func:`fit_forests`' forests: P(class 1) for classification,
    predictions for regression; a task's prior where it has no forest."""
    out = np.zeros((x_eval.shape[0], len(fitted)))
    for t, forest in enumerate(fitted):
        if isinstance(forest, float):
            out[:, t] = forest
        elif task_type == "classification":
            out[:, t] = forest.predict_proba(x_eval)[:, 1]
        else:
            out[:, t] = forest.predict(x_eval)
    return out


# A seed's forests are fitted task by task (ToxCast: 617 of them, about an hour of one core);
# with a run folder, the finished tasks' scores are kept in its state/ at most this often, so
# that a stopped seed goes on from them
KEEP_EVERY_S = 30.0
PARTIAL_NAME = "forests.npz"


def forest_columns(
    x: np.ndarray | sparse.csr_matrix, labels: np.ndarray, train: Sequence[int],
    rows: Sequence[int], task_type: str, seed: int, cfg: BaselineConfig,
    partial: Path | None = None,
) -> np.ndarray:  # fmt: skip
    """The forests' scores (len(rows), T) on ``rows``, fitted on ``train``, one task at a time.

    With ``partial`` (a file in a cell's ``state/``), the columns of the tasks done so far are
    kept there (atomically, every :data:`KEEP_EVERY_S` seconds) and read back by the next call
    with the same features, trees, seed and rows: each task's forest depends only on its own
    labels and the seed, so a stopped seed ends with the columns of an uninterrupted one."""
    n_tasks = labels.shape[1]
    identity = np.array(json.dumps({"config": asdict(cfg), "seed": seed, "tasks": n_tasks,
                                    "labels_sha256": _digest(labels), "task_type": task_type,
                                    "train": [int(i) for i in train],
                                    "rows": [int(i) for i in rows]}))  # fmt: skip
    out = np.full((len(rows), n_tasks), np.nan)
    done = np.zeros(n_tasks, dtype=bool)
    if partial is not None and partial.is_file():
        try:
            with np.load(partial, allow_pickle=False) as kept:
                if str(kept["identity"]) == str(identity):
                    out, done = kept["scores"].copy(), kept["done"].copy()
                    log.info("%s: %d of %d tasks' forests read back", partial, done.sum(), n_tasks)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:  # fitted again
            log.warning("%s unreadable (%s): its seed's forests are fitted from the start",
                        partial, err)  # fmt: skip
    x_train, y_train, x_rows = x[np.asarray(train)], labels[np.asarray(train)], x[np.asarray(rows)]
    last = time.monotonic()
    for t in np.flatnonzero(~done):
        fitted = fit_forests(x_train, y_train[:, [t]], task_type, seed, cfg)
        out[:, t] = forest_scores(fitted, x_rows, task_type)[:, 0]
        done[t] = True
        if partial is not None and time.monotonic() - last >= KEEP_EVERY_S:
            partial.parent.mkdir(parents=True, exist_ok=True)
            with atomic_paths(partial) as (tmp,), open(tmp, "wb") as handle:
                np.savez(handle, identity=identity, scores=out, done=done)
            last = time.monotonic()
    return out


class ForestFeatures:
    """The raw forest features of every molecule of ``smiles``, computed once: ECFP4 bits
    and/or RDKit 2D descriptors. :meth:`scaler` fits the descriptors' scaling on a split's
    train rows, :meth:`matrix` applies it. ``cache``: a data set's descriptors are kept on
    disk (:func:`~smiexlm.chemistry.fingerprints.rdkit2d_descriptors`)."""

    def __init__(self, smiles: Sequence[str], kind: str, radius: int = 2, n_bits: int = 2048,
                 cache: bool = False):  # fmt: skip
        self.kind = kind
        smiles = list(smiles)
        with_bits, with_descriptors = kind in ("ecfp4", "both"), kind != "ecfp4"
        self.bits = morgan_fingerprints(smiles, radius, n_bits) if with_bits else None
        self.descriptors = rdkit2d_descriptors(smiles, cache=cache) if with_descriptors else None

    def scaler(self, train: Sequence[int]) -> FeatureScaler | None:
        """The descriptors' scaling fitted on the ``train`` rows; None for bits alone."""
        if self.descriptors is None:
            return None
        return FeatureScaler.fit(self.descriptors[np.asarray(train)], "rdkit2d",
                                 clip=DESCRIPTOR_CLIP)  # fmt: skip

    def matrix(self, scaler: FeatureScaler | None) -> np.ndarray | sparse.csr_matrix:
        """(N, F) float32 for the forest; bits alone as a sparse matrix (fitted 1.4x (BACE)
        to 6x (MUV) faster: few of 2,048 bits are set in a molecule; scikit-learn's sparse
        splitter may break ties between equal splits otherwise than its dense one, so a
        forest on the dense bits can differ slightly)."""
        if self.descriptors is None:
            return sparse.csr_matrix(self.bits.astype(np.float32))
        parts = [] if self.bits is None else [self.bits.astype(np.float32)]
        parts.append(scaler.transform(self.descriptors))
        return np.concatenate(parts, axis=1)


def run_baseline(
    task: MoleculeTask, seeds: Sequence[int] = (0, 1, 2), cfg: BaselineConfig | None = None,
    on_result: Callable[[RunResult], None] | None = None, run_root: Path | None = None,
    resume: bool = False,
) -> list[RunResult]:  # fmt: skip
    """Train and score the RF baseline on ``task`` for each seed; ``on_result`` gets each
    seed's result as soon as it exists. With ``run_root``, each seed is a run folder as
    fine-tuning keeps one (``run_root/<set>/seed<k>/``: its valid and test predictions, then
    ``result.json``); one that is there already is refused unless ``resume``, which reads a
    finished seed back (made with the same data, split and forests, else a DataError naming
    what differs) and goes on with a stopped one from the tasks it had fitted."""
    cfg = cfg or BaselineConfig()
    task = check_task(task)
    seeds = list(seeds)
    if run_root is not None and not resume:
        check_fresh(run_root, task.name, seeds)
    start, features = time.perf_counter(), None
    if run_root is None or not all(is_finished(run_root, task.name, s) for s in seeds):
        features = ForestFeatures(task.smiles, cfg.features, cfg.radius, cfg.n_bits, cache=True)
    feature_s = time.perf_counter() - start  # shared by the seeds (read back ones need none)
    scaled: dict[tuple[int, ...], np.ndarray] = {}  # per train split (deterministic: one)
    bar = tqdm(total=len(seeds), desc=f"{cfg.model_name} {task.name}", leave=False)

    def one_seed(split, seed: int) -> RunResult:
        folder = None if run_root is None else run_dir(run_root, task.name, seed)
        if folder is not None and (done := finished(folder)) is not None:
            bar.update()
            return _checked(done, folder, task, split, cfg)
        cpu = time.process_time()
        key = tuple(split.train)
        if key not in scaled:
            scaled[key] = features.matrix(features.scaler(split.train))
        partial = None if folder is None else state_dir(folder) / PARTIAL_NAME
        pred = forest_columns(scaled[key], task.labels, split.train, split.valid + split.test,
                              task.task_type, seed, cfg, partial)  # fmt: skip
        n_valid = len(split.valid)
        valid = score(task.task_type, task.labels[split.valid], pred[:n_valid])
        test = score(task.task_type, task.labels[split.test], pred[n_valid:])
        keep_predictions(run_root, task.name, seed, split, pred[:n_valid], pred[n_valid:])
        if partial is not None:  # the kept predictions hold it all now
            partial.unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # the state folder, when nothing else is in it
                partial.parent.rmdir()
        bar.update()
        config = asdict(cfg) | {"train_cpu_seconds": time.process_time() - cpu}
        return task.result(cfg.model_name, split, seed, valid.mean, test, 0.0, config,
                           test_pred=pred[n_valid:])  # fmt: skip

    def kept(result: RunResult) -> None:  # once it holds its wall time
        if run_root is not None and not result.read_back:
            finish(run_dir(run_root, task.name, result.seed), result)
        if on_result is not None:
            on_result(result)

    try:
        return run_seeds(task, seeds, cfg.split, one_seed, feature_s, kept)
    finally:
        bar.close()


def _digest(labels: np.ndarray) -> str:
    """The sha256 of the labels in memory (a stopped cell's columns are theirs alone)."""
    return hashlib.sha256(np.ascontiguousarray(labels, dtype=np.float64)).hexdigest()


#: settings of how the forests are fitted, not of what they compute
_HOW_RUN = frozenset({"n_jobs"})


def _checked(done: RunResult, folder: Path, task: MoleculeTask, split, cfg: BaselineConfig):
    """``done``, read back from ``folder``, when it was made on ``task``'s data and ``split``
    with ``cfg``'s forests; else a DataError naming the first setting that differs."""
    pairs = [("data_sha256", done.data_sha256, task.sha256), ("split", done.split, split.label),
             *task_pairs(done, task.record())]  # fmt: skip
    pairs += [(key, done.config.get(key), value) for key, value in asdict(cfg).items()
              if key not in _HOW_RUN]  # fmt: skip
    refuse_a_difference(folder, pairs)
    return done
