"""The columns of :func:`~smiexlm.serving.prediction.predict` that say how far each
prediction can be trusted: the applicability domain (nearness to the training molecules) and
the conformal sets or intervals, with the calibration each rests on (the prediction module's
docstring lists them)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from smiexlm.errors import ConfigError, DataError, check_choice
from smiexlm.trust.columns import DOMAIN_COLUMNS
from smiexlm.trust.domain import DomainBounds, cosine_neighbours, tanimoto_neighbours
from smiexlm.trust.reference import require_reference

if TYPE_CHECKING:
    from smiexlm.serving.served import Served

log = logging.getLogger(__name__)
_NO_REFERENCE: set[Path] = set()  # folders already reported as lacking one
_SAID: set[str] = set()  # the other warnings already given in this process


def domain_columns(folders: list, served: list[Served], quantile: float) -> dict | None:
    """The applicability-domain columns on the parsable molecules, ``in_domain`` against the
    ``quantile`` bounds (:class:`~smiexlm.trust.domain.DomainBounds`), or None when a folder
    has no reference."""
    from smiexlm.chemistry.fingerprints import ecfp4_packed

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
    else:
        _say_tanimoto_alone()
    bounds = DomainBounds(
        float(np.mean([b.tanimoto for _, _, b in per_model])),
        float(np.mean([b.cosine for _, _, b in per_model])),
    )
    columns[DOMAIN_COLUMNS[4]] = bounds.inside(nearest_t, nearest_c)
    return columns


def default_method(task_type: str, blended: bool) -> str:
    """``predict``'s calibration when ``conformal_method`` is not given: ``difficulty`` for a
    classification folder that serves a blend (it keeps the promise on new scaffolds where
    split-conformal breaks it), ``split`` for a model alone and for regression, whose
    intervals normalised by the members' disagreement grow two to three times as wide for no
    coverage (``benchmarks/results/trust/shift.md``)."""
    return "difficulty" if task_type == "classification" and blended else "split"


def asked_conformal_method(method: str | None, mondrian: bool) -> str | None:
    """The method asked for; None for :func:`default_method`'s, which the folders decide."""
    from smiexlm.trust.shift import METHODS

    if method is None:
        return "class" if mondrian else None
    check_choice("conformal_method", method, METHODS)
    if mondrian and method != "class":
        raise ConfigError("--mondrian", True, f"left out with --conformal-method {method} "
                          "(--mondrian is --conformal-method class)")  # fmt: skip
    return method


def conformal_columns(
    folders: list, served: list[Served], scores: np.ndarray, alpha: float, method: str | None,
    domain: dict | None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """``<label>_set`` or ``<label>_low``/``_high`` columns of the ensemble's scores (N, T),
    calibrated on the ensemble's mean validation scores (its models share the validation
    molecules) as ``method`` says (None: :func:`default_method`'s), with
    ``outside_calibration`` (a molecule farther from the training molecules than every
    calibration one), by distance ``conformal_bin`` (0 the farthest) and by difficulty
    ``<label>_difficulty``; a task with too few validation labels for ``alpha`` (in a bin)
    gets the trivial set or an unbounded interval, and a warning that says so
    (:func:`~smiexlm.trust.conformal.say_too_few`)."""
    from smiexlm.trust.conformal import ClassificationCalibrator, RegressionCalibrator
    from smiexlm.trust.shift import method_shift, outside_calibration

    if method is None:
        method = default_method(served[0].meta["task_type"], bool(served[0].members))

    for folder, s in zip(folders, served, strict=True):
        require_reference(folder, s.reference, "--conformal-alpha")
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
    hard_valid, hard = _difficulty(served) if method == "difficulty" else (None, None)
    if hard is not None:
        out |= {f"{n}_difficulty": hard[:, j] for j, n in enumerate(names)}
    if served[0].meta["task_type"] == "classification":
        sets = ClassificationCalibrator(labels, valid, hard_valid, names).sets(
            scores, alpha, method == "class", "full", shift, hard)  # fmt: skip
        return {f"{n}_set": sets.labels()[:, j] for j, n in enumerate(names)} | out
    if method == "class":
        raise ConfigError(
            "conformal_method", "class", "a classification model (sets per class, --mondrian)"
        )
    bounds = RegressionCalibrator(labels, valid, hard_valid, names).intervals(
        scores, alpha, hard, too_small="full", shift=shift)  # fmt: skip
    low = {f"{n}_low": bounds.low[:, j] for j, n in enumerate(names)}
    return low | {f"{n}_high": bounds.high[:, j] for j, n in enumerate(names)} | out


def _difficulty(served: list[Served]) -> tuple[np.ndarray, np.ndarray]:
    """(validation (n, T), served (N, T)) difficulty of each molecule: its blend members'
    disagreement (:func:`~smiexlm.trust.conformal.difficulty`), the mean over the folders;
    ConfigError for folders that serve a model alone."""
    from smiexlm.trust.conformal import difficulty

    if not served[0].members:
        raise ConfigError("conformal_method", "difficulty", "folders that serve a blend (a "
                          "forest beside the model, or an ensemble), whose members' disagreement "
                          "says how hard each molecule is; this one serves its model alone")  # fmt: skip
    return tuple(np.mean([difficulty([getattr(m, part) for m in s.members]) for s in served],
                         axis=0) for part in ("valid", "scores"))  # fmt: skip


def _say_tanimoto_alone() -> None:
    if "tanimoto alone" not in _SAID:
        _SAID.add("tanimoto alone")
        log.warning(
            "in_domain is judged on the ECFP4 Tanimoto alone: this backend gives no embedding "
            "(--backend onnx serves the network's logits), so the cosine columns and their "
            "bound, which the torch backend also asks, are left out"
        )


def _say_no_reference(folder: Path) -> None:
    key = folder.resolve()
    if key not in _NO_REFERENCE:
        _NO_REFERENCE.add(key)
        log.warning(
            "%r has no reference.safetensors (fine-tuned before it was kept): its predictions "
            "come without the applicability-domain columns; fine-tune again to have them",
            str(folder),
        )
