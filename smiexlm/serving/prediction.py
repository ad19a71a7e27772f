"""Predictions of fine-tuned folders (one, or the seeds of a run as an ensemble), with what
tells a chemist how far each can be trusted.

Columns of :func:`predict`, in order:

- ``smiles``, ``valid`` (False: unparsable or too long; its other cells are NaN);
- ``<label>``: the probability (classification) or value (regression), the ensemble's mean;
- ``<label>_std``: the spread over the ensemble's models (several folders);
- ``<label>_tta_std``: the spread over the random SMILES of each molecule (``tta``);
- ``<label>_model`` and ``<label>_forest``: folders fine-tuned with a forest beside the model
  (``finetune --forest``, :mod:`smiexlm.forests.forest`) serve their blend as
  ``<label>`` (and its spread as ``<label>_std``), and the model's and the forest's scores
  alone in these two (the ensemble's means);
- ``<label>_<member>`` and ``<label>_members_std``: a wide ensemble's folder (``finetune
  --ensemble wide``, :mod:`smiexlm.finetuning.ensemble`) serves its members' blend as
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
  nearness is rarer among the validation molecules than among those predicted) or
  ``difficulty`` (normalised by the disagreement of a blend's members, their standard
  deviation on their own scale plus :data:`~smiexlm.trust.conformal.DIFFICULTY_FLOOR`:
  where the model and its forest disagree the set widens; ``<label>_difficulty``, the
  molecule's); by default ``difficulty`` for classification folders that serve a blend
  (``finetune``'s default) and ``split`` for a model alone and for regression
  (``benchmarks/results/trust/shift.md``);
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
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from smiexlm.embedding.inputs import smiles_list
from smiexlm.errors import ConfigError, DataError, check_positive_int, check_spellings
from smiexlm.finetuning.folder import finetuned_folders, seed_folders
from smiexlm.modelio.seed_record import check_seeds_kept
from smiexlm.serving.predict_trust import (
    asked_conformal_method,
    conformal_columns,
    domain_columns,
)
from smiexlm.serving.served import Served, serve_ensemble, serve_one
from smiexlm.trust.domain import (
    DEFAULT_QUANTILE,
)

log = logging.getLogger(__name__)


def _checked_options(backend: str, tta: int, conformal_alpha: float | None, mondrian: bool,
                     conformal_method: str | None, domain_quantile: float) -> str | None:  # fmt: skip
    """The conformal method :func:`predict`'s options ask for (None: the default); ConfigError
    naming the first bad one."""
    from smiexlm.trust.arrays import check_alpha
    from smiexlm.trust.domain import check_quantile

    if backend not in ("torch", "onnx"):
        raise ConfigError("backend", backend, "'torch' or 'onnx'")
    check_spellings("tta", tta)
    method = asked_conformal_method(conformal_method, mondrian)
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


def served_folders(checkpoint: Path | str | Sequence[Path | str]) -> list[Path | str]:
    """The fine-tuned folders ``checkpoint`` names (a ``finetune --save-dir`` folder stands
    for its seeds, :func:`~smiexlm.finetuning.folder.finetuned_folders`), once each save-dir
    is checked to hold every seed its record lists
    (:func:`~smiexlm.modelio.seed_record.check_seeds_kept`): an ensemble is served whole or
    refused, never a part of it in its place."""
    given = [checkpoint] if isinstance(checkpoint, (str, Path)) else list(checkpoint)
    for folder in given:
        check_seeds_kept(folder, seed_folders(folder))
    return finetuned_folders(given)


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
    over the models). ``smiles``: a list, tuple, iterator, 1-D array or Series (one SMILES
    or a table is a DataError). A value that is no SMILES RDKit reads (not text, empty,
    whitespace or a character beyond ASCII inside, longer than
    :data:`~smiexlm.data.normalize.MAX_SMILES_CHARS`, unparsable) gets a NaN row and
    ``valid = False``, never silently dropped (every row, when none can be served).
    ``backend="onnx"`` serves each folder's ``predictor.onnx`` with onnxruntime (written by ``smiexlm export-onnx FOLDER``). ``calibrate``,
    ``conformal_alpha``, ``conformal_method`` (one of
    :data:`~smiexlm.trust.shift.METHODS`, :func:`~smiexlm.serving.predict_trust.default_method`'s when None) and
    ``mondrian`` (the same as ``conformal_method="class"``): see the module docstring.
    ``domain_quantile`` q: ``in_domain`` is False below the q-quantile of the validation
    molecules' nearest similarities (0.05 by default; 0: below the least similar of them).
    """
    from smiexlm.finetuning.ensemble import is_ensemble

    method = _checked_options(backend, tta, conformal_alpha, mondrian, conformal_method,
                              domain_quantile)  # fmt: skip
    check_positive_int("batch_size", batch_size)
    folders = served_folders(checkpoint)
    smiles, ok, good = _servable(smiles)
    served = [(serve_ensemble if is_ensemble(f) else serve_one)(f, good, batch_size, backend,
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
    domain = domain_columns(folders, served, domain_quantile)
    for name, values in (domain or {}).items():
        frame[name] = _column_of(values, ok)
    if conformal_alpha is not None:
        mean = final.mean(axis=0)  # (N, T)
        for name, values in conformal_columns(folders, served, mean, conformal_alpha, method, domain).items():  # fmt: skip
            frame[name] = _column_of(values, ok)
    frame.insert(0, "valid", ok)
    frame.insert(0, "smiles", list(smiles))
    return frame


def _servable(smiles) -> tuple[list, list[bool], list[str]]:
    """(the values of ``smiles`` as a list, whether each is served, the SMILES served: those
    stripped that are text, not empty, not too long, with no whitespace or character beyond
    ASCII inside, and parsable)."""
    from smiexlm.model.inputs import readable_smiles

    smiles = smiles_list(smiles, "predict")
    good = [readable_smiles(value)[0] for value in smiles]
    return smiles, [t is not None for t in good], [t for t in good if t is not None]


def _check_agree(folders: list, served: list[Served]) -> None:
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
