"""Blending a fine-tuned model with a random forest on the same split, molecule by molecule.

A balanced forest's probabilities and a network's sigmoid outputs are not on one scale, so a
classification score is first replaced by its quantile among the same model's scores of the
validation molecules (:func:`quantiles`): a per-molecule transform, so a served model can
apply it to one molecule as well as to a test split (``how="quantile"``); ``how="mean"``
averages the probabilities as they are. Regression values are in the label's units already and
are averaged as they are. :func:`blend` gives the model the weight ``weight`` and the forest
the rest; :func:`blend_members` averages any number of members so (``finetune --ensemble``,
:mod:`smiexlm.finetuning.ensemble`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from smiexlm.errors import ConfigError, DataError, check_choice

BLENDS = ("quantile", "mean")
DEFAULT_BLEND = "quantile"


def quantiles(reference: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """(N, T) float64: per column, each score's mid-rank quantile among ``reference``'s
    scores, (number below + number at or below) / (2 x references); 0 below every reference,
    1 above every one."""
    reference, scores = np.asarray(reference), np.asarray(scores)
    if reference.ndim != 2 or scores.ndim != 2 or reference.shape[1] != scores.shape[1]:
        raise DataError(
            f"quantiles: reference of shape {reference.shape} and scores of shape "
            f"{scores.shape}: expected two (N, T) arrays with the same T"
        )
    if len(reference) == 0 or np.isnan(reference).any():
        raise DataError(
            f"quantiles: {len(reference)} reference scores, "
            f"{int(np.isnan(reference).sum())} NaN: expected one or more, none NaN"
        )
    out = np.empty(scores.shape, dtype=np.float64)
    for j in range(scores.shape[1]):
        ref = np.sort(reference[:, j])
        below = np.searchsorted(ref, scores[:, j], side="left")
        at_or_below = np.searchsorted(ref, scores[:, j], side="right")
        out[:, j] = (below + at_or_below) / (2.0 * len(ref))
    return out


def blend(
    task_type: str,
    model_valid: np.ndarray,
    model: np.ndarray,
    forest_valid: np.ndarray,
    forest: np.ndarray,
    weight: float = 0.5,
    how: str = DEFAULT_BLEND,
) -> np.ndarray:
    """(N, T) blended scores of ``model`` and ``forest`` (each (N, T)): the weighted mean of
    the values, of their :func:`quantiles` among their own validation scores
    (``model_valid``, ``forest_valid``) for a classification task blended ``how="quantile"``."""
    check_blend(weight, how)
    return blend_members(task_type, [model_valid, forest_valid], [model, forest],
                         [weight, 1.0 - weight], how)  # fmt: skip


def on_one_scale(task_type: str, valid: np.ndarray, scores: np.ndarray, how: str) -> np.ndarray:
    """(N, T) float64: ``scores`` as a blend averages them: their :func:`quantiles` among the
    same member's validation scores ``valid`` (classification blended ``how="quantile"``), or
    as they are."""
    if task_type == "classification" and how == "quantile":
        return quantiles(valid, scores)
    return np.asarray(scores, np.float64)


def blend_members(
    task_type: str,
    valids: Sequence[np.ndarray],
    scores: Sequence[np.ndarray],
    weights: Sequence[float] | None = None,
    how: str = DEFAULT_BLEND,
) -> np.ndarray:
    """(N, T) the weighted mean of several members' scores of the same molecules (each
    (N, T)), each first put :func:`on_one_scale` with its own validation scores (``valids``,
    one per member); equal weights when None. Two members of weights (w, 1 - w) are
    :func:`blend`."""
    if len(valids) != len(scores) or not scores:
        raise DataError(f"blend_members: {len(valids)} validation and {len(scores)} scored "
                        "arrays: expected one of each per member, at least one member")  # fmt: skip
    weights = [1.0 / len(scores)] * len(scores) if weights is None else list(weights)
    if len(weights) != len(scores) or abs(sum(weights) - 1.0) > 1e-9 or min(weights) < 0:
        raise ConfigError("weights", weights, f"{len(scores)} weights of at least 0 summing to 1")
    check_choice("forest_blend", how, BLENDS)
    out = np.zeros(np.shape(scores[0]), dtype=np.float64)
    for valid, member, w in zip(valids, scores, weights, strict=True):
        out = out + w * on_one_scale(task_type, valid, member, how)
    return out


def check_blend(weight: float, how: str) -> None:
    """ConfigError unless ``weight`` is in [0, 1] and ``how`` one of :data:`BLENDS`."""
    check_choice("forest_blend", how, BLENDS)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 <= weight <= 1.0:
        raise ConfigError(
            "forest_weight", weight, "the model's weight, from 0 (the forest alone) to 1"
        )
