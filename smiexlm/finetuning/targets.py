"""A fine-tuning run's labels and scores: :class:`Targets` (the labels as the head trains on
them, standardised on train for regression, and the metric of what it predicts) and
:class:`RunScores` (a finished run's validation and test scores, blended with its forest when
one is kept beside the model)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from smiexlm.finetuning.config import FinetuneConfig
from smiexlm.finetuning.inference import to_scores
from smiexlm.moleculenet.metrics import TaskScores, score
from smiexlm.moleculenet.splits import Split
from smiexlm.moleculenet.task import MoleculeTask


@dataclass
class Targets:
    """Labels as the head is trained on them: standardised on train for regression."""

    y: np.ndarray  # (N, T) float32, NaN = missing
    mean: np.ndarray
    std: np.ndarray
    task_type: str

    @classmethod
    def fit(cls, task: MoleculeTask, split: Split) -> Targets:
        y = task.labels.astype(np.float32)
        mean = np.zeros(y.shape[1], dtype=np.float32)
        std = np.ones(y.shape[1], dtype=np.float32)
        if not task.is_classification:
            mean = np.nanmean(y[split.train], axis=0)
            std = np.nanstd(y[split.train], axis=0) + 1e-6
        return cls(y, mean, std, task.task_type)

    def scaled(self) -> torch.Tensor:
        return torch.from_numpy((self.y - self.mean) / self.std)

    def to_scores(self, logits: np.ndarray) -> np.ndarray:
        """Probabilities, or values in the labels' units."""
        return to_scores(logits, self.task_type, self.mean, self.std)

    def score(self, rows: Sequence[int], logits: np.ndarray):
        return self.score_values(rows, self.to_scores(logits))

    def score_values(self, rows: Sequence[int], values: np.ndarray):
        """The metric of ``values`` (probabilities, or values in the labels' units)."""
        if not len(rows):  # a split without test rows (hpopt's): nothing to score
            n = self.y.shape[1]
            return TaskScores(float("nan"), [float("nan")] * n, 0, list(range(n)))
        return score(self.task_type, self.y[rows], values)


@dataclass
class RunScores:
    """A finished run's validation and test scores (probabilities, or values in the labels'
    units): the model's, then, with a forest beside it, the blend's, the model's and the
    forest's kept apart."""

    valid: np.ndarray  # the served scores (the mean over the TTA views)
    valid_canonical: np.ndarray  # the canonical SMILES' alone: the blend's reference, as served
    test: np.ndarray
    forest: Any = None  # KeptForest
    parts: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def add_forest(self, inputs: list[str], task: MoleculeTask, split: Split, seed: int,
                   cfg: FinetuneConfig) -> None:  # fmt: skip
        """Fit the forest of ``cfg.forest`` on the training molecules (of the model-side
        SMILES ``inputs``) and blend."""
        from smiexlm.forests.forest import KeptForest

        self.forest, forest = KeptForest.fit(inputs, task.labels, split.train, split.valid,
                                             task.task_type, seed, cfg)  # fmt: skip
        self.parts = {"valid_model": self.valid, "test_model": self.test,
                      "valid_forest": forest[split.valid], "test_forest": forest[split.test]}  # fmt: skip
        self.valid, self.test = (
            self.forest.blended(task.task_type, self.valid_canonical, self.parts[f"{p}_model"],
                                self.parts[f"{p}_forest"])
            for p in ("valid", "test")
        )  # fmt: skip

    def forest_summary(self, targets: Targets, split: Split, scale: float) -> dict[str, float]:
        """The model's and the forest's scores alone, beside the blend's in the result."""
        return {
            f"{p}_{who}": targets.score_values(rows, self.parts[f"{p}_{who}"]).mean * scale
            for p, rows in (("valid", split.valid), ("test", split.test))
            for who in ("model", "forest")
        }  # fmt: skip

    def cliff_summary(self, targets: Targets, split: Split, cliffs: np.ndarray) -> dict[str, Any]:
        """The model's and the forest's test RMSE alone over the cliff molecules (``cliffs``:
        (N, T) bool of the whole table, :mod:`~smiexlm.moleculenet.cliffs`), beside the
        served one in the result's measures."""
        from smiexlm.moleculenet.cliffs import cliff_rmse

        rows = split.test
        return {
            f"test_cliff_{who}": cliff_rmse(targets.y[rows], self.parts[f"test_{who}"],
                                            cliffs[rows])[0]
            for who in ("model", "forest")
        }  # fmt: skip
