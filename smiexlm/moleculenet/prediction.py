"""Predictions of fine-tuned folders (one, or the seeds of a run as an ensemble), with what
tells a chemist how far each can be trusted.

Columns of :func:`predict`, in order:

- ``smiles``, ``valid`` (False: unparsable or too long; its other cells are NaN);
- ``<label>``: the probability (classification) or value (regression), the ensemble's mean;
- ``<label>_std``: the spread over the ensemble's models (several folders);
- ``<label>_tta_std``: the spread over the random SMILES of each molecule (``tta``);
- ``<label>_model`` and ``<label>_forest``: folders fine-tuned with a forest beside the model
  (``finetune --forest``, :mod:`smiexlm.moleculenet.forest`) serve their blend as
  ``<label>`` (and its spread as ``<label>_std``), and the model's and the forest's scores
  alone in these two (the ensemble's means);
- ``<label>_<member>`` and ``<label>_members_std``: a wide ensemble's folder (``finetune
  --ensemble wide``, :mod:`smiexlm.moleculenet.ensemble`) serves its members' blend as
  ``<label>``, each member's own score (``_model``, ``_model_rdkit2d``, ``_rf_rdkit2d``,
  ``_rf_both``, ``_rf_ecfp4``) and the members' spread on the blend's scale (their
  quantiles among their own validation scores, for classification);
- ``truncated``: the molecule has more tokens than fine-tuning's ``max_length`` and was cut
  to it (its first tokens and EOS), as fine-tuning cut its own (any model of an ensemble);
- ``untrained_tokens`` (folders fine-tuned from a backbone that records its corpus,
  ``corpus_tokens.json``): the molecule's tokens that neither pretraining nor fine-tuning's
  training molecules held, space-separated (``""`` when none): the model never read them in
  training, so the prediction rests on the rest of the molecule;
- the applicability domain (:mod:`smiexlm.trust.domain`; folders with a reference):
  ``nearest_tanimoto`` and ``mean_tanimoto_k5`` (ECFP4 to the training molecules),
  ``nearest_cosine`` and ``mean_cosine_k5`` (the models' own embeddings, the ensemble's mean;
  not with the ONNX backend, whose graph gives logits only), and ``in_domain`` (both nearest
  similarities at least the ``domain_quantile`` of the validation molecules', 5 % by
  default; an ensemble compares its mean similarity with its models' mean bound);
- with ``conformal_alpha``: ``<label>_set`` (classification: the conformal set, ``{0}``,
  ``{1}``, ``{0,1}`` or ``{}``; ``""`` in a bad row) or ``<label>_low`` and ``<label>_high``
  (regression: the interval), calibrated on the validation molecules
  (:mod:`smiexlm.trust.conformal`) as ``conformal_method`` says: ``split`` (one threshold a
  task), ``class`` (one a class), ``distance`` (Mondrian by the nearest Tanimoto similarity
  to the training molecules: up to three bins of the validation molecules, each molecule
  calibrated on its bin's, ``conformal_bin`` 0 the farthest) or ``weighted`` (the
  validation molecules weighted by how much they look like the molecules predicted
  together, a density ratio on their nearness to the training molecules: it depends on the
  batch; ``conformal_weight``, the molecule's density ratio: above 1, a molecule whose
  nearness is rarer among the validation molecules than among those predicted);
  ``outside_calibration``: the molecule is farther from the training molecules than every
  validation molecule, where no calibration speaks for it.

``calibrate=True`` divides each classification model's logits by the temperature fitted on
its validation molecules (:func:`smiexlm.trust.calibration.fit_temperature`) before the
sigmoid: the probabilities, the ensemble spread and the conformal sets use the calibrated
scores (the model's part of a blend; a forest is not recalibrated). A quantile blend
(``forest_blend = "quantile"``) serves a score in [0, 1] that ranks molecules, not a
probability; the conformal sets are calibrated on the blend's own validation scores. The
columns that need a folder's ``reference.safetensors`` are left out, with one warning per
folder, for folders fine-tuned before it was kept; ``calibrate`` and ``conformal_alpha``
refuse them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from smiexlm.errors import ConfigError, DataError, check_spellings
from smiexlm.model.folder import FinetunedFolder
from smiexlm.model.pretrained import load_finetuned
from smiexlm.moleculenet.folder import finetuned_folders
from smiexlm.moleculenet.forest import KeptForest
from smiexlm.moleculenet.metrics import to_scores
from smiexlm.moleculenet.reference import Reference
from smiexlm.trust.columns import DOMAIN_COLUMNS
from smiexlm.trust.domain import (
    DEFAULT_QUANTILE,
    DomainBounds,
    cosine_neighbours,
    tanimoto_neighbours,
)

log = logging.getLogger(__name__)
_NO_REFERENCE: set[Path] = set()  # folders already reported as lacking one


@dataclass
class _Member:
    """One member of a served blend: its scores of the validation molecules (what places its
    quantiles), of the molecules served, and its weight."""

    name: str
    valid: np.ndarray  # (n_valid, T)
    scores: np.ndarray  # (N, T)
    weight: float


@dataclass
class _Served:
    """One folder's output on the parsable molecules."""

    texts: list[str]  # the model-side SMILES (normalised, canonical unless configured not)
    views: np.ndarray  # (V, N, T) scores: the canonical SMILES first, then random ones
    pooled: np.ndarray | None  # (N, d) the head's input embedding (torch backend)
    meta: dict[str, Any]
    reference: Reference | None
    cut: np.ndarray | None = None  # (N,) bool: cut to the fine-tuning's max_length
    untrained: list[list[str]] | None = None  # per molecule, or None without a corpus record
    # a blend's members (a model and its forest, or an ensemble's), blended ``how``
    members: list[_Member] = field(default_factory=list)
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
        from smiexlm.moleculenet.blend import on_one_scale

        task_type = self.meta["task_type"]
        return np.std([on_one_scale(task_type, m.valid, m.scores, self.how) for m in self.members],
                      axis=0)  # fmt: skip

    def _blend(self, scores: list[np.ndarray]) -> np.ndarray:
        from smiexlm.moleculenet.blend import blend_members

        if len(scores[0]) == 0:  # no molecule to serve (every row of the input unparsable)
            return np.zeros(scores[0].shape, dtype=np.float32)
        return blend_members(self.meta["task_type"], [m.valid for m in self.members], scores,
                             [m.weight for m in self.members], self.how).astype(np.float32)  # fmt: skip


def _serve_one(
    folder: Path | str, smiles: list[str], batch_size: int, backend: str, tta: int,
    calibrate: bool,
) -> _Served:  # fmt: skip
    from smiexlm.data.augment import random_smiles
    from smiexlm.finetuning import Examples
    from smiexlm.finetuning import predict as engine_predict

    if backend == "onnx":  # the folder's predictor.onnx (smiexlm export-onnx)
        from smiexlm.serving.onnx_runtime import OnnxPredictor

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
    served = _Served(texts, np.stack(views), pooled, meta, reference, cut, untrained)
    forest = KeptForest.load(folder, meta)
    if forest is not None:
        _require(folder, reference, "its forest")
        _check_scored(folder, "its forest", forest.valid_scores, reference)
        served.how = forest.how
        served.members = [_Member("model", reference.valid_scores, served.scores(), forest.weight),
                          _Member("forest", forest.valid_scores,
                                  forest.scores(texts, meta["task_type"]), 1.0 - forest.weight)]  # fmt: skip
    return served


def _serve_ensemble(folder: Path | str, smiles: list[str], batch_size: int, backend: str,
                    tta: int, calibrate: bool) -> _Served:  # fmt: skip
    """An ensemble's folder served (:mod:`smiexlm.moleculenet.ensemble`): each network member
    as a fine-tuned folder, each forest, and the members blended; the embedding, the domain
    and the views are the first network's, the cut and untrained tokens any network's."""
    from smiexlm.moleculenet.ensemble import EnsembleFolder

    ensemble = EnsembleFolder.read(folder)
    networks = {name: _serve_one(path, smiles, batch_size, backend, tta, calibrate)
                for name, path in ensemble.networks.items()}  # fmt: skip
    first = next(iter(networks.values()))
    task_type = first.meta["task_type"]
    for name, net in networks.items():
        _require(ensemble.networks[name], net.reference, "an ensemble")
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
    served = _Served(first.texts, np.mean([n.views for n in networks.values()], axis=0),
                     first.pooled, first.meta | {"ensemble": ensemble.meta}, first.reference,
                     np.any([n.cut for n in networks.values()], axis=0),
                     None if any(n.untrained is None for n in networks.values()) else
                     [sorted({t for n in networks.values() for t in n.untrained[i]})
                      for i in range(len(first.texts))],
                     how=ensemble.meta.get("blend", "quantile"))  # fmt: skip
    served.members = [_Member(name, *members[name], 1.0 / len(order)) for name in order]
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
    _require(folder, reference, "calibrate")
    return fit_temperature(reference.valid_labels, reference.valid_logits).astype(np.float32)


def _require(folder: Path | str, reference: Reference | None, option: str) -> None:
    if reference is None:
        raise DataError(
            f"--checkpoint {str(folder)!r}: no reference.safetensors (fine-tuned before "
            f"it was kept), which {option} needs: expected a folder fine-tuned by this version"
        )


def _features(meta: dict, texts: list[str], folder: str) -> np.ndarray | None:
    """The hybrid head's scaled features, or None for a plain head."""
    if not meta.get("feature_scaler"):
        return None
    from smiexlm.fingerprints import molecule_features
    from smiexlm.moleculenet.features import FeatureScaler

    scaler = FeatureScaler.from_dict(meta["feature_scaler"], folder)
    return scaler.transform(molecule_features(texts, scaler.kind))


def _tensor(x: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(x)


def _checked_options(backend: str, tta: int, conformal_alpha: float | None, mondrian: bool,
                     conformal_method: str | None, domain_quantile: float) -> str:  # fmt: skip
    """The conformal method :func:`predict`'s options ask for; ConfigError naming the first
    bad one."""
    from smiexlm.trust.arrays import check_alpha
    from smiexlm.trust.domain import check_quantile

    if backend not in ("torch", "onnx"):
        raise ConfigError("backend", backend, "'torch' or 'onnx'")
    check_spellings("tta", tta)
    method = _conformal_method(conformal_method, mondrian)
    if conformal_alpha is not None:
        check_alpha(conformal_alpha)
    elif mondrian or conformal_method is not None:
        option = "--mondrian" if mondrian else "--conformal-method"
        raise ConfigError(option, mondrian or conformal_method, "to come with --conformal-alpha "
                          "(it chooses how the sets are calibrated)")  # fmt: skip
    check_quantile(domain_quantile)
    return method


def _label_frame(served: list, final: np.ndarray, tta: int, ok: list[bool]) -> pd.DataFrame:
    """One column per label (the mean of ``final`` (M, N, T) over the models), then beside
    each its spreads and members: ``<label>_std`` over the models, ``<label>_tta_std`` over
    the spellings, ``<label>_<member>`` of a blend and ``<label>_members_std`` of an
    ensemble; NaN rows where ``ok`` is False."""
    labels = served[0].meta["label_cols"]
    n_models, n_good = final.shape[:2]
    views = np.stack([s.views for s in served]).reshape(n_models, tta + 1, n_good, len(labels))
    frame = pd.DataFrame(_rows_of(final.mean(axis=0), ok), columns=labels)
    columns = {"std": final.std(axis=0) if n_models > 1 else None,
               "tta_std": views.std(axis=1).mean(axis=0) if tta else None}  # fmt: skip
    for j, member in enumerate(served[0].members):  # what a blend is made of
        columns[member.name] = np.mean([s.members[j].scores for s in served], axis=0)
    if "ensemble" in served[0].meta:
        columns["members_std"] = np.mean([s.spread() for s in served], axis=0)
    for suffix, values in columns.items():
        if values is not None:
            values = _rows_of(values.reshape(n_good, len(labels)), ok)
            for j, label in enumerate(labels):
                frame[f"{label}_{suffix}"] = values[:, j]
    return frame


def predict(
    checkpoint: Path | str | Sequence[Path | str],
    smiles: Sequence[str],
    batch_size: int = 256,
    backend: Literal["torch", "onnx"] = "torch",
    tta: int = 0,
    calibrate: bool = False,
    conformal_alpha: float | None = None,
    mondrian: bool = False,
    domain_quantile: float = DEFAULT_QUANTILE,
    conformal_method: str | None = None,
) -> pd.DataFrame:
    """Predictions per input SMILES, one row each (the module docstring lists the columns).

    Several fine-tuned folders (e.g. the seeds of one run) make an ensemble: each label column
    is the mean over the models and ``<label>_std`` their standard deviation (ddof 0).
    ``tta=K`` scores each molecule as the mean over its canonical SMILES and K random ones
    (:mod:`smiexlm.data.augment`); ``<label>_tta_std`` is their standard deviation (averaged
    over the models). Unparsable SMILES (and those longer than
    :data:`~smiexlm.data.normalize.MAX_SMILES_CHARS`) get NaN rows and ``valid = False``, never
    silently dropped. ``backend="onnx"`` serves each folder's ``predictor.onnx`` with
    onnxruntime (written by ``smiexlm export-onnx FOLDER``). ``calibrate``,
    ``conformal_alpha``, ``conformal_method`` (one of
    :data:`~smiexlm.trust.conformal.METHODS`, :data:`DEFAULT_CONFORMAL` when None) and
    ``mondrian`` (the same as ``conformal_method="class"``): see the module docstring.
    ``domain_quantile`` q: ``in_domain`` is False below the q-quantile of the validation
    molecules' nearest similarities (0.05 by default; 0: below the least similar of them).
    """
    from smiexlm.data.normalize import smiles_problem
    from smiexlm.moleculenet.ensemble import is_ensemble

    method = _checked_options(backend, tta, conformal_alpha, mondrian, conformal_method,
                              domain_quantile)  # fmt: skip
    folders = finetuned_folders(checkpoint)
    ok = [smiles_problem(s) is None for s in smiles]  # too long or unparsable: a NaN row
    good = [s for s, v in zip(smiles, ok, strict=True) if v]
    served = [(_serve_ensemble if is_ensemble(f) else _serve_one)(f, good, batch_size, backend,
                                                                   tta, calibrate)
              for f in folders]  # fmt: skip
    _check_agree(folders, served)
    n_labels = len(served[0].meta["label_cols"])
    final = np.stack([s.scores() for s in served]).reshape(len(folders), len(good), n_labels)
    frame = _label_frame(served, final, tta, ok)
    frame["truncated"] = _column_of(np.any([s.cut for s in served], axis=0), ok)
    if all(s.untrained is not None for s in served):
        tokens = [" ".join(dict.fromkeys(t for s in served for t in s.untrained[i]))
                  for i in range(len(good))]  # fmt: skip
        frame["untrained_tokens"] = _column_of(np.asarray(tokens, dtype=object), ok)
    domain = _domain(folders, served, domain_quantile)
    for name, values in (domain or {}).items():
        frame[name] = _column_of(values, ok)
    if conformal_alpha is not None:
        mean = final.mean(axis=0)  # (N, T)
        for name, values in _conformal(folders, served, mean, conformal_alpha, method, domain).items():  # fmt: skip
            frame[name] = _column_of(values, ok)
    frame.insert(0, "valid", ok)
    frame.insert(0, "smiles", list(smiles))
    return frame


def _check_agree(folders: list, served: list[_Served]) -> None:
    """DataError unless every folder predicts the same labels of the same kind, blended of the
    same members (a model and its forest, an ensemble's, or none)."""
    first = served[0].meta
    members = [m.name for m in served[0].members]
    for folder, s in zip(folders[1:], served[1:], strict=True):
        meta = s.meta
        if (meta["label_cols"], meta["task_type"]) != (first["label_cols"], first["task_type"]):
            raise DataError(
                f"--checkpoint {str(folder)!r}: predicts {meta['label_cols']} "
                f"({meta['task_type']}); expected {first['label_cols']} like {str(folders[0])!r}"
            )
        if [m.name for m in s.members] != members:

            def blended(names: list[str]) -> str:
                return f"blends {', '.join(names)}" if names else "serves its model alone"

            raise DataError(
                f"--checkpoint {str(folder)!r} {blended([m.name for m in s.members])} and "
                f"{str(folders[0])!r} {blended(members)}: expected the folders of an ensemble "
                "to be blended alike (all fine-tuned with the same --forest and --ensemble)"
            )


def _domain(folders: list, served: list[_Served], quantile: float) -> dict | None:
    """The applicability-domain columns on the parsable molecules, ``in_domain`` against the
    ``quantile`` bounds (:class:`~smiexlm.trust.domain.DomainBounds`), or None when a folder
    has no reference."""
    from smiexlm.search import ecfp4_packed

    lacking = [f for f, s in zip(folders, served, strict=True) if s.reference is None]
    for folder in lacking:
        _say_no_reference(Path(folder))
    if lacking:
        return None
    queries = ecfp4_packed(served[0].texts)
    tanimoto = {}  # one computation per distinct training set
    per_model = []
    for s in served:
        ref = s.reference
        key = ref.train_ecfp4.tobytes()
        if key not in tanimoto:
            tanimoto[key] = tanimoto_neighbours(queries, ref.train_ecfp4)
        cosine = None if s.pooled is None else cosine_neighbours(s.pooled, ref.train_embedding)
        per_model.append((tanimoto[key], cosine, ref.bounds(quantile)))
    nearest_t = np.mean([t[0] for t, _, _ in per_model], axis=0)
    columns = {DOMAIN_COLUMNS[0]: nearest_t,
               DOMAIN_COLUMNS[1]: np.mean([t[1] for t, _, _ in per_model], axis=0)}  # fmt: skip
    nearest_c = None
    if all(c is not None for _, c, _ in per_model):
        nearest_c = np.mean([c[0] for _, c, _ in per_model], axis=0)
        columns[DOMAIN_COLUMNS[2]] = nearest_c
        columns[DOMAIN_COLUMNS[3]] = np.mean([c[1] for _, c, _ in per_model], axis=0)
    bounds = DomainBounds(
        float(np.mean([b.tanimoto for _, _, b in per_model])),
        float(np.mean([b.cosine for _, _, b in per_model])),
    )
    columns[DOMAIN_COLUMNS[4]] = bounds.inside(nearest_t, nearest_c)
    return columns


#: ``predict``'s calibration when ``conformal_method`` is not given
#: (benchmarks/results/trust/shift.md)
DEFAULT_CONFORMAL = "split"


def _conformal_method(method: str | None, mondrian: bool) -> str:
    from smiexlm.errors import check_choice
    from smiexlm.trust.conformal import METHODS

    if method is None:
        return "class" if mondrian else DEFAULT_CONFORMAL
    check_choice("conformal_method", method, METHODS)
    if mondrian and method != "class":
        raise ConfigError("--mondrian", True, f"left out with --conformal-method {method} "
                          "(--mondrian is --conformal-method class)")  # fmt: skip
    return method


def _conformal(
    folders: list, served: list[_Served], scores: np.ndarray, alpha: float, method: str,
    domain: dict | None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """``<label>_set`` or ``<label>_low``/``_high`` columns of the ensemble's scores (N, T),
    calibrated on the ensemble's mean validation scores (its models share the validation
    molecules) as ``method`` says, with ``outside_calibration`` (a molecule farther from the
    training molecules than every calibration one) and, by distance, ``conformal_bin`` (0
    the farthest); a task with too few validation labels for ``alpha`` (in a bin) gets the
    trivial set or an unbounded interval."""
    from smiexlm.trust.conformal import (
        ClassificationCalibrator,
        RegressionCalibrator,
        method_shift,
        outside_calibration,
    )

    for folder, s in zip(folders, served, strict=True):
        _require(folder, s.reference, "--conformal-alpha")
    labels = served[0].reference.valid_labels
    for folder, s in zip(folders[1:], served[1:], strict=True):
        if not np.array_equal(s.reference.valid_labels, labels, equal_nan=True):
            raise DataError(
                f"--checkpoint {str(folder)!r}: its validation molecules differ from those of "
                f"{str(folders[0])!r}: expected the seeds of one split for a conformal ensemble"
            )
    valid = np.mean([s.valid_scores() for s in served], axis=0)
    names = served[0].meta["label_cols"]
    near_valid = np.mean([s.reference.valid_tanimoto for s in served], axis=0)
    near_query = domain[DOMAIN_COLUMNS[0]]  # every folder has a reference: the domain is there
    out = {"outside_calibration": outside_calibration(near_valid, near_query)}
    cal_x, query_x = [near_valid], [near_query]
    if DOMAIN_COLUMNS[2] in domain:  # the embeddings' nearness too (not with ONNX)
        cal_x.append(np.mean([s.reference.valid_cosine for s in served], axis=0))
        query_x.append(domain[DOMAIN_COLUMNS[2]])
    shift, bins = method_shift(method, np.stack(cal_x, 1), np.stack(query_x, 1), alpha)
    if bins is not None:
        out["conformal_bin"] = bins
    if shift is not None and shift.weights is not None:
        out["conformal_weight"] = shift.weights[1]
    if served[0].meta["task_type"] == "classification":
        sets = ClassificationCalibrator(labels, valid).sets(scores, alpha, method == "class",
                                                            "full", shift)  # fmt: skip
        return {f"{n}_set": sets.labels()[:, j] for j, n in enumerate(names)} | out
    if method == "class":
        raise ConfigError(
            "conformal_method", "class", "a classification model (sets per class, --mondrian)"
        )
    bounds = RegressionCalibrator(labels, valid).intervals(scores, alpha, too_small="full",
                                                           shift=shift)  # fmt: skip
    low = {f"{n}_low": bounds.low[:, j] for j, n in enumerate(names)}
    return low | {f"{n}_high": bounds.high[:, j] for j, n in enumerate(names)} | out


def _say_no_reference(folder: Path) -> None:
    key = folder.resolve()
    if key not in _NO_REFERENCE:
        _NO_REFERENCE.add(key)
        log.warning(
            "%r has no reference.safetensors (fine-tuned before it was kept): its predictions "
            "come without the applicability-domain columns; fine-tune again to have them",
            str(folder),
        )


def _rows_of(values: np.ndarray, ok: list[bool]) -> np.ndarray:
    """(len(ok), T): ``values`` in the rows marked ok, NaN in the others."""
    out = np.full((len(ok), values.shape[1]), np.nan)
    out[np.asarray(ok, dtype=bool)] = values
    return out


def _column_of(values: np.ndarray, ok: list[bool]) -> np.ndarray:
    """One column: ``values`` in the rows marked ok; NaN (False for a flag, "" for text) in
    the others."""
    mask = np.asarray(ok, dtype=bool)
    if values.dtype == bool:
        out = np.zeros(len(ok), dtype=bool)
    elif values.dtype == object:
        out = np.full(len(ok), "", dtype=object)
    else:
        out = np.full(len(ok), np.nan)
    out[mask] = values
    return out
