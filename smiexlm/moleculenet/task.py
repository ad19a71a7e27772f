"""A molecule property task as one typed record, and the seed loop every model shares.

:class:`MoleculeTask` is what the loaders read and what fine-tuning, the linear probe and the
random-forest baseline consume: the (already validated) SMILES, the label matrix, the task
type and where the table came from. It replaces metadata carried in ``DataFrame.attrs``,
which pandas drops on many operations. :func:`run_seeds` is the one per-seed loop (the split,
cached when it does not depend on the seed; the scorability check; the result record), so
each model keeps only its own training code.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from smiexlm.errors import ConfigError, DataError
from smiexlm.moleculenet.metrics import TaskScores, check_scorable, more_scores, scorable
from smiexlm.moleculenet.registry import TaskType
from smiexlm.moleculenet.report import RunResult
from smiexlm.moleculenet.splits import (
    Split,
    check_split_kind,
    column_split,
    make_split,
    split_column,
)

log = logging.getLogger(__name__)


@dataclass
class MoleculeTask:
    """SMILES (each parsable by RDKit: checked when the table was read), labels (N, T) float
    with NaN for a missing label, and the table's provenance."""

    name: str
    smiles: list[str]
    labels: np.ndarray
    label_cols: list[str]
    task_type: TaskType = "classification"
    source: str | None = None
    sha256: str | None = None
    n_raw: int | None = None
    n_invalid: int = 0
    invalid: list[tuple[int, str]] = field(default_factory=list)  # the first dropped rows
    # the table's own split: its column's name and each molecule's part (train/valid/test)
    split_col: str | None = None
    parts: list[str] | None = None

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.float64).reshape(len(self.smiles), -1)
        if self.labels.shape[1] != len(self.label_cols):
            raise ValueError(
                f"task {self.name!r}: {self.labels.shape[1]} label columns but "
                f"label_cols names {len(self.label_cols)}"
            )

    def __len__(self) -> int:
        return len(self.smiles)

    @property
    def is_classification(self) -> bool:
        return self.task_type == "classification"

    @property
    def metric(self) -> str:
        return "roc_auc" if self.is_classification else "rmse"

    @property
    def scale(self) -> float:
        """Reported scores are ROC-AUC x 100, or RMSE as it is."""
        return 100.0 if self.is_classification else 1.0

    def table(self) -> pd.DataFrame:
        """``smiles`` and the label columns as a plain DataFrame, for display and export; the
        type and provenance stay on the task."""
        frame = pd.DataFrame(self.labels, columns=self.label_cols)
        frame.insert(0, "smiles", self.smiles)
        return frame

    def subset(self, rows: Sequence[int]) -> MoleculeTask:
        """The task on ``rows`` only (provenance kept)."""
        rows = list(rows)
        return MoleculeTask(
            self.name, [self.smiles[i] for i in rows], self.labels[rows], self.label_cols,
            self.task_type, self.source, self.sha256, self.n_raw, self.n_invalid, self.invalid,
            self.split_col, None if self.parts is None else [self.parts[i] for i in rows],
        )  # fmt: skip

    def split(self, kind: str, seed: int) -> Split:
        """The split ``kind`` names (:func:`~smiexlm.moleculenet.splits.make_split`), or the
        table's own for ``column:NAME`` when the task was read with that column."""
        column = split_column(check_split_kind(kind))
        if column is None:
            return make_split(self.smiles, kind, seed)
        if column != self.split_col or self.parts is None:
            raise ConfigError("split", kind, f"a split the table was read with ({self.name} was "
                              f"read with {'no split column' if self.split_col is None else repr('column:' + self.split_col)})")  # fmt: skip
        return column_split(kind, self.parts)

    def record(self) -> dict[str, Any]:
        """What a run learns from the table beside its bytes: the label columns and their
        kind (one table holds several), which a run's identity and its result keep."""
        return {"labels": list(self.label_cols), "task_type": self.task_type}

    def check_split(self, split: Split) -> None:
        """DataError unless train, valid and test each hold a labelled molecule (training,
        selection and the test score need one each) and a classification test part can be
        scored (:func:`~smiexlm.moleculenet.metrics.check_scorable`); a warning when the
        validation part cannot be."""
        labelled = ~np.isnan(self.labels).all(axis=1)
        parts = (split.train, split.valid, split.test)
        counts = [int(labelled[np.asarray(part, dtype=np.int64)].sum()) for part in parts]
        if min(counts) == 0:
            advice = ("use more data" if split.label.startswith("random") else "use more data, "
                      "or --split random, which gives each part a molecule from 6 molecules up")  # fmt: skip
            if split_column(split.kind) is not None and not split.valid:
                advice = "give the split column valid rows, or a --valid-from-train above 0"
            raise DataError(
                f"{self.name}: the {split.label} split of {len(self)} molecules leaves "
                f"{'/'.join(map(str, counts))} labelled molecules in train/valid/test; expected "
                f"at least 1 in each ({advice})"
            )
        if self.is_classification:
            check_scorable(self.labels[split.test], self.label_cols, self.name, split.label)
            if split.valid and not scorable(self.labels[split.valid]):
                log.warning(
                    "%s: the %s validation part holds a single class for every label column: "
                    "its ROC-AUC cannot be scored, so no epoch is chosen by it (the first is "
                    "kept); give it more molecules (a larger --valid-from-train, another "
                    "--split)", self.name, split.label
                )  # fmt: skip

    def result(
        self,
        model: str,
        split: Split,
        seed: int,
        valid: float,
        test: TaskScores,
        wall_s: float,
        config: dict[str, Any],
        best_epoch: int | None = None,
        test_pred: np.ndarray | None = None,
    ) -> RunResult:
        """The report's record of one seed: ``valid`` is the selection score (unscaled),
        ``test`` the test split's scores; ``config`` gains the versions of what decided them
        (``software``); ``test_pred``, the test molecules' probabilities or values, gives the
        measures reported beside the score (:func:`~smiexlm.moleculenet.metrics.more_scores`;
        for regression also the RMSE on the test molecules that form activity cliffs and their
        count, :mod:`~smiexlm.moleculenet.cliffs`)."""
        config = config | self.record() | {"software": software_versions()}
        more = (
            {}
            if test_pred is None
            else more_scores(self.task_type, self.labels[split.test], test_pred)
        )
        if test_pred is not None and not self.is_classification:
            from smiexlm.moleculenet.cliffs import GAP, cliff_rmse, task_cliffs

            cliffs = task_cliffs(self, split.test, gap=config.get("cliff_gap", GAP))
            rmse, n = cliff_rmse(self.labels[split.test], test_pred, cliffs)
            more |= {"cliff_rmse": rmse, "n_cliff": n}
        return RunResult(
            model=model, dataset=self.name, seed=seed, split=split.label, metric=self.metric,
            test=test.mean * self.scale, valid=valid * self.scale, sizes=split.sizes,
            n_invalid=self.n_invalid, n_tasks_scored=test.n_scored, n_tasks=len(self.label_cols),
            wall_s=wall_s, data_sha256=self.sha256, best_epoch=best_epoch, config=config,
            more=more,
        )  # fmt: skip


def software_versions() -> dict[str, str]:
    """The versions a score depends on: RDKit (canonical SMILES, scaffolds, descriptors),
    torch, scikit-learn (forests, probes, metrics), numpy and this package."""
    import rdkit
    import sklearn
    import torch

    from smiexlm.core.version import __version__

    return {"smiexlm": __version__, "rdkit": rdkit.__version__, "torch": torch.__version__,
            "scikit-learn": sklearn.__version__, "numpy": np.__version__}  # fmt: skip


def check_task(task: object, field: str = "task") -> MoleculeTask:
    """``task`` when it is a :class:`MoleculeTask`; ConfigError otherwise (a DataFrame is a
    view for display: ``load_task`` and ``read_task`` give the task)."""
    if not isinstance(task, MoleculeTask):
        raise ConfigError(
            field, type(task).__name__, "a MoleculeTask (from load_task or read_task)"
        )
    return task


def check_seeds(seeds: Sequence[int]) -> None:
    """ConfigError unless ``seeds`` are distinct integers in [0, 2**32), which numpy, torch
    and scikit-learn all accept. Each seed is one run: a repeated seed would repeat a run and
    count its copy as an independent one in the mean ± std."""
    seeds = list(seeds)
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ConfigError("--seeds", seed, "integers")
        if not 0 <= seed < 2**32:
            raise ConfigError("--seeds", seed, "non-negative integers below 2**32")
    twice = [seed for seed in dict.fromkeys(seeds) if seeds.count(seed) > 1]
    if twice:
        raise ConfigError(
            "--seeds", seeds, f"distinct seeds (seed {twice[0]} is given more than once)"
        )


def run_seeds(
    task: MoleculeTask,
    seeds: Sequence[int],
    split_kind: str,
    one_seed: Callable[[Split, int], RunResult],
    shared_s: float = 0.0,
    on_result: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """``one_seed(split, seed)`` for each seed on its split (a deterministic split is made
    once); each result's wall time gets an equal share of ``shared_s``, the seconds spent on
    work common to all seeds (features, embeddings), and the seconds of earlier segments of a
    resumed run (``config["resumed_seconds"]``); a result read back from a finished run keeps
    its own. The seeds and every split are checked
    (:func:`check_seeds`, :meth:`MoleculeTask.check_split`) before the first run.
    ``on_result`` is called with each result as soon as it exists (to keep it before the next
    seed starts)."""
    check_seeds(seeds)
    t0 = time.perf_counter()
    splits: list[Split] = []
    for seed in seeds:
        split = splits[-1] if splits and splits[-1].seed is None else None
        if split is None:  # seeded kinds differ per seed
            split = task.split(split_kind, seed)
            task.check_split(split)
        splits.append(split)
    shared_s += time.perf_counter() - t0
    results: list[RunResult] = []
    for seed, split in zip(seeds, splits, strict=True):
        t0 = time.perf_counter()
        result = one_seed(split, seed)
        if not result.read_back:  # a finished run read back keeps the time it recorded
            earlier = float(result.config.get("resumed_seconds", 0.0))
            result.wall_s = time.perf_counter() - t0 + shared_s / len(seeds) + earlier
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
