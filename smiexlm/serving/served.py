"""One fine-tuned folder served on the parsable molecules (:func:`serve_one`; an ensemble's
folder, :func:`serve_ensemble`): its model's scores over the canonical and random spellings,
the head's input embedding, what was cut or never trained, and the members of a blend (a
model and its forest, or an ensemble's), each with its validation scores, which place its
quantiles and calibrate the conformal sets."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.errors import ConfigError, DataError
from smiexlm.finetuning.inference import to_scores
from smiexlm.finetuning.targets import frozen_embedding
from smiexlm.forests.forest import KeptForest
from smiexlm.forests.members import KernelMembers, member_weights
from smiexlm.modelio.folder import FinetunedFolder
from smiexlm.modelio.pretrained import load_finetuned
from smiexlm.trust.reference import Reference, require_reference

log = logging.getLogger(__name__)


@dataclass
class Member:
    """One member of a served blend: its scores of the validation molecules (what places its
    quantiles), of the molecules served, and its weight."""

    name: str
    valid: np.ndarray  # (n_valid, T)
    scores: np.ndarray  # (N, T)
    weight: float


@dataclass
class Served:
    """One folder's output on the parsable molecules."""

    texts: list[str]  # the model-side SMILES (normalised, canonical unless configured not)
    views: np.ndarray  # (V, N, T) scores: the canonical SMILES first, then random ones
    pooled: np.ndarray | None  # (N, d) the head's input embedding (torch backend)
    meta: dict[str, Any]
    reference: Reference | None
    cut: np.ndarray | None = None  # (N,) bool: cut to the fine-tuning's max_length
    untrained: list[list[str]] | None = None  # per molecule, or None without a corpus record
    # a blend's members (a model and its forest, or an ensemble's), blended ``how``
    members: list[Member] = field(default_factory=list)
    how: str = "quantile"

    def scores(self) -> np.ndarray:
        """(N, T) what the folder serves: the model's (mean over the views), or its members'
        blend."""
        if not self.members:
            return self.views.mean(axis=0)
        return self._blend([m.scores for m in self.members])

    def valid_scores(self) -> np.ndarray:
        """(n_valid, T) what the folder serves for its validation molecules."""
        if not self.members:
            return self.reference.valid_scores
        return self._blend([m.valid for m in self.members])

    def spread(self) -> np.ndarray:
        """(N, T) the members' standard deviation on the blend's scale (ddof 0)."""
        from smiexlm.forests.blend import on_one_scale

        task_type = self.meta["task_type"]
        return np.std([on_one_scale(task_type, m.valid, m.scores, self.how) for m in self.members],
                      axis=0)  # fmt: skip

    def _blend(self, scores: list[np.ndarray]) -> np.ndarray:
        from smiexlm.forests.blend import blend_members

        if len(scores[0]) == 0:  # no molecule to serve (every row of the input unparsable)
            return np.zeros(scores[0].shape, dtype=np.float32)
        return blend_members(self.meta["task_type"], [m.valid for m in self.members], scores,
                             [m.weight for m in self.members], self.how).astype(np.float32)  # fmt: skip


def serve_one(
    folder: Path | str, smiles: list[str], batch_size: int, backend: str, tta: int,
    calibrate: bool,
) -> Served:  # fmt: skip
    from smiexlm.data.augment import random_smiles
    from smiexlm.finetuning import Examples
    from smiexlm.finetuning import predict as engine_predict

    if backend == "onnx":  # the folder's predictor.onnx (smiexlm export-onnx)
        from smiexlm.serving.onnx_predictor import OnnxPredictor

        model = OnnxPredictor(FinetunedFolder(folder))
        inputs, meta = model.inputs, model.meta
    else:
        model, inputs, meta = load_finetuned(folder)
    cfg = meta["config"]
    texts = inputs.texts(smiles, cfg.get("canonicalize", True))
    features = _features(meta, texts, str(folder))
    spellings = [texts] + (list(zip(*random_smiles(texts, tta, 0), strict=True)) if tta else [])
    mean = np.asarray(meta["target_mean"], dtype=np.float32)
    std = np.asarray(meta["target_std"], dtype=np.float32)
    reference = Reference.load(folder)
    temperature = _temperature(folder, meta, reference) if calibrate else None
    views, pooled, cut, untrained = [], None, np.zeros(len(texts), dtype=bool), None
    for v, view in enumerate(spellings):
        rows, cut_rows = inputs.rows(list(view), cfg.get("max_length", 256))
        if v == 0:
            cut[cut_rows] = True
            if (unknown := inputs.unknown(rows))[1]:
                log.warning("%d of %d molecules hold %d tokens outside the model's vocabulary "
                            "([UNK])", unknown[1], len(rows), unknown[0])  # fmt: skip
            untrained = inputs.unseen(rows)
        if backend == "onnx":
            logits = model.logits(rows, features, batch_size)
        else:
            examples = Examples(rows, None, None if features is None else _tensor(features))
            if v == 0:  # the embedding of the domain columns comes with the first pass
                both = engine_predict(model, examples, batch_size, output="pooled+logits")
                width = both.shape[1] - meta["n_outputs"]
                pooled, logits = both[:, :width], both[:, width:]
            else:
                logits = engine_predict(model, examples, batch_size)
        if temperature is not None:
            logits = logits / temperature
        views.append(to_scores(logits, meta["task_type"], mean, std))
    if temperature is not None:  # what conformal calibration sees: the calibrated scores
        reference.valid_scores = to_scores(reference.valid_logits / temperature, "classification",
                                           mean, std).astype(np.float32)  # fmt: skip
    served = Served(texts, np.stack(views), pooled, meta, reference, cut, untrained)
    served.members = _members(folder, meta, served, backend)
    return served


def _members(folder: Path | str, meta: dict, served: Served, backend: str) -> list[Member]:
    """The members of a folder's blend: the model, its forest and its kernel members (each
    scoring ``served.texts``, weighted as ``finetune.json`` says); none for the model alone."""
    forest, kernels = KeptForest.load(folder, meta), KernelMembers.load(folder, meta)
    if forest is None and kernels is None:
        return []
    reference = served.reference
    require_reference(folder, reference, "its forest" if kernels is None else "its members")
    members = [Member("model", reference.valid_scores, served.scores(), 1.0)]
    if forest is not None:
        _check_scored(folder, "its forest", forest.valid_scores, reference)
        served.how = forest.how
        members[0].weight = forest.weight
        members.append(Member("forest", forest.valid_scores,
                              forest.scores(served.texts, meta["task_type"]), 1.0 - forest.weight))  # fmt: skip
    if kernels is not None:
        embed = frozen_embedding(kernels.embedder, backend)
        for name, values in kernels.scores(served.texts, embed).items():
            _check_scored(folder, f"its member {name!r}", kernels.valid_scores[name], reference)
            members.append(Member(name, kernels.valid_scores[name], values, 0.0))
        weights = member_weights(meta["members"], [m.name for m in members], folder)
        for member in members:
            member.weight = weights[member.name]
    return members


def serve_ensemble(folder: Path | str, smiles: list[str], batch_size: int, backend: str,
                    tta: int, calibrate: bool) -> Served:  # fmt: skip
    """An ensemble's folder served (:mod:`smiexlm.finetuning.ensemble`): each network member
    as a fine-tuned folder, each forest, and the members blended; the embedding, the domain
    and the views are the first network's, the cut and untrained tokens any network's."""
    from smiexlm.finetuning.ensemble import EnsembleFolder

    ensemble = EnsembleFolder.read(folder)
    networks = {name: serve_one(path, smiles, batch_size, backend, tta, calibrate)
                for name, path in ensemble.networks.items()}  # fmt: skip
    first = next(iter(networks.values()))
    task_type = first.meta["task_type"]
    for name, net in networks.items():
        require_reference(ensemble.networks[name], net.reference, "an ensemble")
        if (net.meta["label_cols"], net.meta["task_type"]) != (ensemble.meta.get("label_cols"),
                                                               ensemble.meta.get("task_type")):  # fmt: skip
            raise DataError(f"--checkpoint {str(folder)!r}: member {name!r} predicts "
                            f"{net.meta['label_cols']} ({net.meta['task_type']}); expected the "
                            "labels of its ensemble.json")  # fmt: skip
        _check_scored(folder, f"member {name!r}", net.reference.valid_scores, first.reference)
    members = {name: (net.reference.valid_scores, net.scores()) for name, net in networks.items()}
    for name, forest in ensemble.forests.items():
        _check_scored(folder, f"member {name!r}", forest.valid_scores, first.reference)
        members[name] = (forest.valid_scores, forest.scores(first.texts, task_type))
    order = [m["name"] for m in ensemble.meta["members"]]
    served = Served(first.texts, np.mean([n.views for n in networks.values()], axis=0),
                     first.pooled, first.meta | {"ensemble": ensemble.meta}, first.reference,
                     np.any([n.cut for n in networks.values()], axis=0),
                     None if any(n.untrained is None for n in networks.values()) else
                     [sorted({t for n in networks.values() for t in n.untrained[i]})
                      for i in range(len(first.texts))],
                     how=ensemble.meta.get("blend", "quantile"))  # fmt: skip
    served.members = [Member(name, *members[name], 1.0 / len(order)) for name in order]
    return served


def _check_scored(folder, who: str, valid: np.ndarray, reference: Reference) -> None:
    """DataError unless ``who`` scored as many validation molecules as ``reference`` holds."""
    if len(valid) != len(reference.valid_scores):
        raise DataError(
            f"--checkpoint {str(folder)!r}: {who} scored {len(valid)} validation molecules and "
            f"its reference holds {len(reference.valid_scores)}: expected the same molecules"
        )


def _temperature(folder: Path | str, meta: dict, reference: Reference | None) -> np.ndarray:
    """(T,) float32 temperatures fitted on the folder's validation molecules."""
    from smiexlm.trust.calibration import fit_temperature

    if meta["task_type"] != "classification":
        raise ConfigError("calibrate", True, "classification models (temperature scaling of "
                          f"probabilities); {str(folder)!r} is a regression model")  # fmt: skip
    require_reference(folder, reference, "calibrate")
    return fit_temperature(reference.valid_labels, reference.valid_logits).astype(np.float32)


def _features(meta: dict, texts: list[str], folder: str) -> np.ndarray | None:
    """The hybrid head's scaled features, or None for a plain head."""
    if not meta.get("feature_scaler"):
        return None
    from smiexlm.chemistry.fingerprints import molecule_features
    from smiexlm.forests.features import FeatureScaler

    scaler = FeatureScaler.from_dict(meta["feature_scaler"], folder)
    return scaler.transform(molecule_features(texts, scaler.kind))


def _tensor(x: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(x)
