"""A random forest kept beside a fine-tuned model and served blended with it
(``smiexlm finetune --forest KIND``).

When the network has trained, the campaign's forest baseline (:mod:`~smiexlm.forests.baseline`:
``KIND`` features, ``forest_trees`` trees, balanced classes, the run's seed) is fitted on the
same training molecules, from the same model-side SMILES, and scores the validation and test
molecules. The network's training and its choice of epoch do not see the forest. The run
reports the blend (:func:`~smiexlm.forests.blend.blend`, ``forest_blend`` and
``forest_weight``), and the model and the forest alone beside it.

A fine-tuned folder keeps the forest in ``forest.skops``: the fitted forests (one per label;
a label whose training molecules hold one class keeps that class's share instead), and the
forest's scores of the validation molecules, which the quantile blend and conformal
calibration need. The file is written with `skops <https://skops.readthedocs.io>`_, whose
format holds no pickle; it is read back trusting, beyond skops' defaults, scikit-learn's tree
type alone, after its sha256 is checked against ``checksums.json``. The settings
and the descriptors' scaling are in ``finetune.json["forest"]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.errors import DataError
from smiexlm.forests.blend import BLENDS, blend
from smiexlm.forests.features import FeatureScaler
from smiexlm.modelio.layout import FINETUNE_NAME, FOREST_NAME

FOREST_FORMAT = "smiexlm-forest/1"
#: the types a forest file may hold beyond those skops trusts by default
TRUSTED_TYPES = ("sklearn.tree._tree.Tree",)


@dataclass
class KeptForest:
    """The forests of one fine-tuned run, with what serving them needs."""

    features: str  # ecfp4 | rdkit2d | both
    n_trees: int
    how: str  # the blend, smiexlm.forests.blend.BLENDS
    weight: float  # the model's weight in the blend
    scaler: FeatureScaler | None  # the descriptors' train scaling (None for bits alone)
    forests: list  # per label: a fitted forest, or a float (the class-1 share)
    valid_scores: np.ndarray  # (n_valid, T) the forest's scores of the validation molecules

    @classmethod
    def fit(cls, texts: list[str], labels: np.ndarray, train: list[int], valid: list[int],
            task_type: str, seed: int, cfg) -> tuple[KeptForest, np.ndarray]:  # fmt: skip
        """The forest of ``cfg`` (a FinetuneConfig with ``forest`` set) fitted on the ``train``
        rows of ``texts`` and ``labels``, and its scores (N, T) of every row."""
        from smiexlm.forests.baseline import (
            BaselineConfig,
            ForestFeatures,
            fit_forests,
            forest_scores,
        )

        features = ForestFeatures(texts, cfg.forest, cache=True)
        scaler = features.scaler(train)
        x = features.matrix(scaler)
        baseline = BaselineConfig(features=cfg.forest, n_trees=cfg.forest_trees)
        forests = fit_forests(x[train], labels[train], task_type, seed, baseline)
        scores = forest_scores(forests, x, task_type).astype(np.float32)
        kept = cls(cfg.forest, cfg.forest_trees, cfg.forest_blend, cfg.forest_weight, scaler,
                   forests, scores[valid])  # fmt: skip
        return kept, scores

    def scores(self, texts: list[str], task_type: str) -> np.ndarray:
        """(N, T) float32: the forests' scores of ``texts`` (model-side SMILES)."""
        from smiexlm.forests.baseline import ForestFeatures, forest_scores

        if not texts:
            return np.zeros((0, len(self.forests)), dtype=np.float32)
        x = ForestFeatures(texts, self.features).matrix(self.scaler)
        return forest_scores(self.forests, x, task_type).astype(np.float32)

    def blended(self, task_type: str, model_valid: np.ndarray, model: np.ndarray,
                forest: np.ndarray) -> np.ndarray:  # fmt: skip
        """(N, T) float32: ``model``'s scores blended with the forest's (``forest``)."""
        if len(model) == 0:  # no molecule to serve (every row of the input unparsable)
            return np.zeros((0, len(self.forests)), dtype=np.float32)
        return blend(task_type, model_valid, model, self.valid_scores, forest, self.weight,
                     self.how).astype(np.float32)  # fmt: skip

    def record(self, name: str = FOREST_NAME) -> dict[str, Any]:
        """The ``finetune.json["forest"]`` block (of a forest saved as ``name``)."""
        return {"features": self.features, "n_trees": self.n_trees, "blend": self.how,
                "weight": self.weight, "file": name,
                "scaler": None if self.scaler is None else self.scaler.to_dict()}  # fmt: skip

    def save(self, folder: Path, name: str = FOREST_NAME) -> Path:
        """Write ``name`` (``forest.skops``) into ``folder``; the caller records its sha256."""
        import skops.io

        path = Path(folder) / name
        skops.io.dump({"format": FOREST_FORMAT, "forests": self.forests,
                       "valid_scores": np.ascontiguousarray(self.valid_scores)}, path)  # fmt: skip
        return path

    @classmethod
    def load(cls, folder: Path | str, meta: dict[str, Any], record: Any = None,
             where: str = FINETUNE_NAME) -> KeptForest | None:  # fmt: skip
        """The forest of the fine-tuned folder whose ``finetune.json`` is ``meta``; None when
        it has none. ``record`` (named in messages as ``where``'s): a forest record of
        another file of ``folder`` instead (an ensemble's, ``ensemble.json``). DataError
        naming the file for a damaged record or file, a sha256 that differs, or a type in the
        file outside skops' defaults and :data:`TRUSTED_TYPES`."""
        record = meta.get("forest") if record is None else record
        if record is None:
            return None
        scaler = _check_record(record, Path(folder), where)
        path = Path(folder) / record.get("file", FOREST_NAME)
        if not path.is_file():
            raise DataError(f"{str(path)!r}: no such file, which {where}'s 'forest' names")
        from smiexlm.modelio.integrity import verify_checksum

        verify_checksum(path, required=True)
        doc = _read(path)
        forests, valid = doc.get("forests"), doc.get("valid_scores")
        n = meta["n_outputs"]
        if (
            doc.get("format") != FOREST_FORMAT
            or not isinstance(forests, list)
            or len(forests) != n
            or not isinstance(valid, np.ndarray)
            or valid.ndim != 2
            or valid.shape[1] != n
        ):
            raise DataError(
                f"{str(path)!r}: expected a {FOREST_FORMAT} file with {n} forests and "
                f"(validation molecules, {n}) scores"
            )
        return cls(record["features"], record["n_trees"], record["blend"], record["weight"],
                   scaler, forests, valid)  # fmt: skip


def _read(path: Path) -> dict:
    import skops.io

    try:
        untrusted = [t for t in skops.io.get_untrusted_types(file=path) if t not in TRUSTED_TYPES]
        if untrusted:
            raise DataError(
                f"{str(path)!r} holds types that are not a forest's ({', '.join(untrusted)}): "
                "expected scikit-learn random forests only; the file is not loaded"
            )
        doc = skops.io.load(path, trusted=list(TRUSTED_TYPES))
    except DataError:
        raise
    except Exception as exc:  # skops raises many kinds for a damaged file  # noqa: BLE001
        raise DataError(f"{str(path)!r}: not a readable skops file ({exc})") from None
    if not isinstance(doc, dict):
        raise DataError(f"{str(path)!r}: expected a {FOREST_FORMAT} record")
    return doc


def _check_record(record: Any, folder: Path, name: str) -> FeatureScaler | None:
    """The scaler of a ``finetune.json["forest"]`` block (of the file ``name``), every key
    checked."""
    from smiexlm.chemistry.fingerprints import FEATURE_KINDS

    where = f"{str(folder / name)!r}: key 'forest'"
    if not isinstance(record, dict):
        raise DataError(f"{where} is {record!r}: expected an object")
    checks = {
        "features": record.get("features") in FEATURE_KINDS,
        "n_trees": type(record.get("n_trees")) is int and record["n_trees"] > 0,
        "blend": record.get("blend") in BLENDS,
        "weight": type(record.get("weight")) in (int, float) and 0 <= record["weight"] <= 1,
        "scaler": (record.get("scaler") is None) == (record.get("features") == "ecfp4"),
        "file": isinstance(record.get("file", FOREST_NAME), str)
        and Path(record.get("file", FOREST_NAME)).name == record.get("file", FOREST_NAME),
    }
    for key, ok in checks.items():
        if not ok:
            raise DataError(
                f"{where}: {key!r} is {record.get(key, 'missing')!r}: expected a forest record "
                f"(features one of {FEATURE_KINDS}, n_trees > 0, blend one of {BLENDS}, "
                "weight in [0, 1], a descriptor scaler exactly when descriptors are used, "
                "a file name inside the folder)"
            )
    if record["scaler"] is None:
        return None
    try:
        return FeatureScaler.from_dict(record["scaler"], where)
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{where}: 'scaler' is not a feature scaler") from None
