"""A fine-tuning run's labels and scores: :class:`Targets` (the labels as the head trains on
them, standardised on train for regression, and the metric of what it predicts) and
:class:`RunScores` (a finished run's validation and test scores, blended with its forest and
its kernel members when they are kept beside the model)."""

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
    kernels: Any = None  # KernelMembers
    weights: dict[str, float] = dataclasses.field(default_factory=dict)  # each member's
    cv_rmse: dict[str, float] = dataclasses.field(default_factory=dict)  # out-of-fold

    def members(self) -> list[str]:
        """The members whose scores are kept apart (model, forest, kernels), in order."""
        return [k.removeprefix("test_") for k in self.parts if k.startswith("test_")]

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

    def add_kernels(self, inputs: list[str], task: MoleculeTask, split: Split, seed: int,
                    cfg: FinetuneConfig, embedder) -> None:  # fmt: skip
        """Fit the kernel members of ``cfg.kernels`` on the training molecules (a regression
        task; ``embedder``: the backbone's model folder, None for a random init, whose
        members read ECFP4 alone), weigh every member by ``cfg.combine`` and serve their
        blend (:mod:`smiexlm.forests.members`)."""
        import pandas as pd

        from smiexlm.finetuning.config import kernel_kinds
        from smiexlm.forests.members import (
            FOREST,
            OOF_TREES,
            KernelMembers,
            blended,
            combine,
            forest_oof,
            rmse,
        )
        from smiexlm.moleculenet.splits import murcko_scaffolds

        kinds = kernel_kinds(cfg)  # resolved: none that read an embedding without one
        if not kinds:
            return
        train, valid, test = (np.asarray(p, dtype=np.intp)
                              for p in (split.train, split.valid, split.test))  # fmt: skip
        y = task.labels.astype(np.float64)
        scaffolds = pd.Series(murcko_scaffolds([inputs[i] for i in train])).fillna("")
        groups = pd.factorize(scaffolds)[0]
        if not self.parts:  # no forest: the network alone so far
            self.parts = {"valid_model": self.valid, "test_model": self.test}
        oof = {}
        if self.forest is not None:
            oof[FOREST] = forest_oof(inputs, y, train, groups, seed, cfg.forest,
                                     min(cfg.forest_trees, OOF_TREES))  # fmt: skip
        self.kernels, scores, kernel_oof = KernelMembers.fit(
            kinds, inputs, y, train, valid, groups, embedder, frozen_embedding(embedder)
        )
        oof |= kernel_oof
        for name, values in scores.items():
            self.parts |= {f"valid_{name}": values[valid], f"test_{name}": values[test]}
        names = ["model", *oof]
        self.weights = combine(cfg.combine, oof, y[train],
                               {n: self.parts[f"valid_{n}"] for n in names}, y[valid],
                               cfg.forest_weight)  # fmt: skip
        self.cv_rmse = {n: rmse(y[train], o) for n, o in oof.items()}
        self.valid, self.test = (
            blended(self.weights, {n: self.parts[f"{p}_{n}"] for n in names}).astype(np.float32)
            for p in ("valid", "test")
        )  # fmt: skip

    def members_record(self, cfg: FinetuneConfig) -> dict[str, Any] | None:
        """``finetune.json["members"]``: the kernels, the weights, the rule and each member's
        out-of-fold RMSE; None without kernels."""
        if self.kernels is None:
            return None
        return self.kernels.record() | {"combine": cfg.combine, "weights": self.weights,
                                        "cv_rmse": self.cv_rmse}  # fmt: skip

    def forest_summary(self, targets: Targets, split: Split, scale: float) -> dict[str, float]:
        """The model's and the forest's scores alone, beside the blend's in the result."""
        return {
            f"{p}_{who}": targets.score_values(rows, self.parts[f"{p}_{who}"]).mean * scale
            for p, rows in (("valid", split.valid), ("test", split.test))
            for who in self.members()
        }  # fmt: skip

    def cliff_summary(self, targets: Targets, split: Split, cliffs: np.ndarray) -> dict[str, Any]:
        """The model's and the forest's test RMSE alone over the cliff molecules (``cliffs``:
        (n_test, T) bool of the test rows, :mod:`~smiexlm.moleculenet.cliffs`), beside the
        served one in the result's measures."""
        from smiexlm.moleculenet.cliffs import cliff_rmse

        rows = split.test
        return {
            f"test_cliff_{who}": cliff_rmse(targets.y[rows], self.parts[f"test_{who}"],
                                            cliffs)[0]
            for who in self.members()
        }  # fmt: skip


def frozen_embedding(folder, backend: str = "torch") -> Any:
    """The embedding of the pretrained model folder ``folder`` as it serves it (the
    ``Featurizer``'s, on the CPU and ``backend``), loaded when first called; None without a
    folder. What the kernel members read, when fitted and when served: a molecule longer
    than the model's positions is cut to them, as the network beside it reads a cut one."""
    if folder is None:
        return None

    def embed(texts: list[str]) -> np.ndarray:
        from smiexlm.embedding.featurizer import Featurizer

        featurizer = Featurizer.from_pretrained(folder, device="cpu", backend=backend)
        featurizer.cut_at = featurizer.model.config.max_positions
        return featurizer.featurize(texts)

    return embed
