"""What a hyper-parameter search (:mod:`smiexlm.hpopt.run`) searches, and how one
trial runs: the budget (:class:`HpoptConfig`), the space (:class:`SearchSpace`), the data every
trial shares (:class:`Search`) and what a search leaves (:class:`HpoptResult`).

What is searched (:class:`SearchSpace`, around ``base``, the task's Table 8 row):

- ``lr``: log-uniform, a decade either side of the row's;
- ``epochs``: an integer from a quarter of the row's to the row's (a trial never costs more
  than the Table 8 run, and the schedule's decay follows the epochs chosen);
- ``dropout`` in [0, 0.3] and ``pooler_dropout`` in [0, 0.5] (Table 8: 0.1, and 0 to 0.5);
- ``pooling``: cls | mean | max; ``features``: none | ecfp4 | rdkit2d | both (the hybrid head);
- ``freeze_layers``: 0 (nothing frozen) to the backbone's number of blocks;
- ``layers``: the last 1 to all of the backbone's blocks read by the head.

Everything else (batch size, warmup, optimiser, split, ``max_train_steps``, precision) stays
as ``base``. Trial 0 is the row itself, so the report shows what the search gained over it.

**The test split is never seen.** The split is made on the whole table, as ``finetune`` makes
it (that decides which rows are test, nothing more); the search then runs on a task made of
the train and validation rows alone, with an empty test part: the test molecules never reach
the tokenizer, the hybrid features, the model or a metric.

A trial is one fine-tuning run (seed ``seed``) on train, its validation score reported to the
trial after every epoch (:meth:`Search.run`); its value is its best validation score,
ROC-AUC x 100 maximised or RMSE minimised (a pruned trial's: its last one).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.chemistry.fingerprints import FEATURE_KINDS
from smiexlm.errors import DataError
from smiexlm.finetuning.backbone import Backbone
from smiexlm.finetuning.config import FinetuneConfig
from smiexlm.hpopt.config import HpoptConfig
from smiexlm.model.pooling import POOLINGS
from smiexlm.moleculenet.splits import Split
from smiexlm.moleculenet.task import MoleculeTask, check_task
from smiexlm.paths import json_safe

IDENTITY_FORMAT = "smiexlm-hpopt/1"
FEATURE_CHOICES: tuple[str, ...] = ("none", *FEATURE_KINDS)


@dataclass(frozen=True)
class SearchSpace:
    """Ranges over flat FinetuneConfig keys (see the module docstring); ``features`` and
    ``pooling`` are choices, the others (low, high) inclusive."""

    lr: tuple[float, float]
    epochs: tuple[int, int]
    dropout: tuple[float, float] = (0.0, 0.3)
    pooler_dropout: tuple[float, float] = (0.0, 0.5)
    pooling: tuple[str, ...] = POOLINGS
    features: tuple[str, ...] = FEATURE_CHOICES
    freeze_layers: tuple[int, int] = (0, 0)  # (0, 0): not searched
    layers: tuple[int, int] = (1, 1)  # (1, 1): not searched

    @classmethod
    def around(cls, base: FinetuneConfig, n_layers: int) -> SearchSpace:
        """The space around ``base`` for a backbone of ``n_layers`` blocks; it holds ``base``
        (trial 0). With ``freeze`` (head only) every block is frozen already."""
        lr, epochs = base.loop.lr, base.loop.epochs
        return cls(
            lr=(lr / 10, lr * 10), epochs=(max(1, epochs // 4), epochs),
            dropout=(0.0, max(0.3, base.dropout)),
            pooler_dropout=(0.0, max(0.5, base.pooler_dropout)),
            freeze_layers=(0, 0 if base.loop.freeze else n_layers), layers=(1, n_layers),
        )  # fmt: skip

    def suggest(self, trial) -> dict[str, Any]:
        """The trial's point, as its params (``features`` "none" for no hybrid head)."""
        params = {
            "lr": trial.suggest_float("lr", *self.lr, log=True),
            "epochs": trial.suggest_int("epochs", *self.epochs),
            "dropout": trial.suggest_float("dropout", *self.dropout),
            "pooler_dropout": trial.suggest_float("pooler_dropout", *self.pooler_dropout),
            "pooling": trial.suggest_categorical("pooling", self.pooling),
            "features": trial.suggest_categorical("features", self.features),
        }
        for key in ("freeze_layers", "layers"):
            low, high = getattr(self, key)
            if high > low:
                params[key] = trial.suggest_int(key, low, high)
        return params

    def params_of(self, base: FinetuneConfig) -> dict[str, Any]:
        """``base``'s own point (trial 0)."""
        params = {"lr": base.loop.lr, "epochs": base.loop.epochs, "dropout": base.dropout,
                  "pooler_dropout": base.pooler_dropout, "pooling": base.pooling,
                  "features": base.features or "none"}  # fmt: skip
        own = {"freeze_layers": base.loop.freeze_layers, "layers": base.layers}
        return params | {
            key: own[key] for key in own if getattr(self, key)[1] > getattr(self, key)[0]
        }


def flat_keys(params: dict[str, Any]) -> dict[str, Any]:
    """A trial's params as flat FinetuneConfig keys."""
    flat = dict(params)
    if "features" in flat:
        flat["features"] = None if flat["features"] == "none" else flat["features"]
    return flat


@dataclass
class Search:
    """What every trial shares: the search task (the split's train and validation rows only,
    an empty test part), the model-side SMILES, the hybrid features once computed."""

    task: MoleculeTask
    split: Split
    base: FinetuneConfig
    space: SearchSpace
    backbone: Backbone
    seed: int
    inputs: list[str]
    source: dict[str, Any]  # the whole table's provenance and split, for the identity
    features: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def build(
        cls, whole: MoleculeTask, base: FinetuneConfig, backbone: Backbone, seed: int
    ) -> Search:
        """The search on ``whole``'s train and validation rows (see the module docstring)."""
        whole = check_task(whole)
        split = whole.split(base.split, seed)
        rows = [*split.train, *split.valid]  # the test rows are left out here, for good
        task = whole.subset(rows)
        n = len(split.train)
        own = Split(split.kind, split.seed, list(range(n)), list(range(n, len(rows))), [])
        check_searchable(task, own)
        inputs = backbone.model_texts(task.smiles, base.canonicalize)
        n_layers = backbone.config(backbone.tokenizer(inputs)).n_layers
        source = {"dataset": whole.name, "data_sha256": whole.sha256, "n_molecules": len(whole),
                  "task_type": whole.task_type, "labels": list(whole.label_cols),
                  "split": split.label,
                  "sizes": list(split.sizes)}  # fmt: skip
        from smiexlm.finetuning.adapter import with_backbone_blocks

        base = with_backbone_blocks(base, backbone)  # trial 0 is the backbone's own setting
        space = SearchSpace.around(base, n_layers)
        return cls(task, own, base, space, backbone, seed, inputs, source)

    @property
    def direction(self) -> str:
        return "maximize" if self.task.is_classification else "minimize"

    def config(self, params: dict[str, Any]) -> FinetuneConfig:
        """``base`` with the trial's params."""
        return FinetuneConfig.from_flat(**(self.base.to_dict() | flat_keys(params)))

    def identity(self, hp: HpoptConfig) -> dict[str, Any]:
        """What a resumed study must share with the one in the folder (JSON values)."""
        base = {k: v for k, v in self.base.recorded().items() if k != "device"}
        sampler = hp.identity()
        doc = {"format": IDENTITY_FORMAT, **self.source, "backbone": self.backbone.name,
               "backbone_sha256": self.backbone.weights_sha256, "base": base,
               "space": asdict(self.space), "sampler": sampler}  # fmt: skip
        return json.loads(json.dumps(json_safe(doc)))

    def raw_features(self, kind: str | None) -> np.ndarray | None:
        """The search rows' unscaled hybrid features of ``kind`` (computed once)."""
        if kind is None:
            return None
        if kind not in self.features:
            from smiexlm.chemistry.fingerprints import molecule_features

            self.features[kind] = molecule_features(self.inputs, kind, cache=True)
        return self.features[kind]

    def run(self, trial, progress: bool = False) -> float:
        """Fine-tune the trial's point; its best validation score (scaled as reports are)."""
        import optuna

        from smiexlm.finetuning.adapter import finetune_once

        # the network alone (run_hpopt leaves out the forest): no kernel members either
        cfg = replace(self.config(self.space.suggest(trial)), kernels="none")
        scale = self.task.scale

        def report(epoch: int, value: float) -> None:
            trial.report(value * scale, epoch)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned after epoch {epoch}")

        cpu = time.process_time()
        try:
            raw = self.raw_features(cfg.features)
            result = finetune_once(self.task, self.split, cfg, self.seed, self.backbone,
                                   inputs=self.inputs, raw_features=raw, progress=progress,
                                   on_epoch=report)  # fmt: skip
        finally:
            trial.set_user_attr("cpu_seconds", round(time.process_time() - cpu, 3))
        trial.set_user_attr("best_epoch", result.best_epoch)
        trial.set_user_attr("epochs_run", result.config["epochs_run"])
        return result.valid


def check_searchable(task: MoleculeTask, split: Split) -> None:
    """DataError unless train and validation each hold a labelled molecule and, for
    classification, some label column has both classes in validation (the search selects on
    it). The test part is not looked at."""
    labelled = ~np.isnan(task.labels).all(axis=1)
    counts = [int(labelled[np.asarray(part, dtype=np.int64)].sum()) for part in (split.train, split.valid)]  # fmt: skip
    if min(counts) == 0:
        raise DataError(
            f"{task.name}: the {split.label} split leaves {counts[0]}/{counts[1]} labelled "
            "molecules in train/valid; expected at least 1 in each (use more data or another "
            "--split)"
        )
    if task.is_classification:
        y = task.labels[np.asarray(split.valid, dtype=np.int64)]
        both = [(col == 1).any() and (col == 0).any() for col in y.T]
        if not any(both):
            raise DataError(
                f"{task.name}: the {split.label} validation part holds a single class for "
                "every label column; expected one with both classes, which the search selects "
                "on (use more data or another --split)"
            )


@dataclass
class HpoptResult:
    """Where a search stands when it stops: its best trial (None before one completes), the
    trials counted and failed, the CPU seconds spent, what stopped it, the best config."""

    best_number: int | None
    best_value: float | None
    best_config: dict[str, Any] | None
    counted: int
    failed: int
    cpu_seconds: float
    stopped_by: str
    out: Path
