"""Which molecules to test next: ranking ``predict``'s rows by an acquisition score.

A batch of molecules for the next round of assays, chosen from a table of predictions (the
output of ``smiexlm predict``, one row per molecule) by one of these scores, highest first:

- ``uncertainty``: closeness of a predicted probability to 0.5, ``1 - |2p - 1|`` (the model
  cannot tell the classes apart there); classification only, the column must hold
  probabilities. A blend's column (``finetune``'s default) holds a quantile score that ranks
  molecules, not a probability: there ``p`` is the mean of its members' probabilities
  (``<task>_model``, ``<task>_forest``...);
- ``std``: the ensemble's spread ``<task>_std`` (``predict`` with several folders);
- ``tta_std``: the spread over random SMILES ``<task>_tta_std`` (``predict --tta K``);
- ``novelty``: ``1 - nearest_tanimoto``, distance from the training molecules;
- ``value``: the prediction itself (the most active first; ``lowest=True`` for the least);
- ``ucb``: the upper confidence bound ``value + kappa * spread``, the spread being the
  ensemble's ``<task>_std``, else the random SMILES' ``<task>_tta_std``: the promising and
  the unsure first, ``kappa`` (default 1) weighing the one against the other (0 is
  ``value``); with ``lowest=True``, ``-value + kappa * spread``, for a property wanted low.

A batch of near-copies teaches little, so the walk down the ranking skips a molecule whose
ECFP4 Tanimoto similarity to one already picked exceeds ``max_similarity`` (1 keeps every
molecule). Rows that cannot be scored (``valid`` False, or a NaN score) are never picked;
every exclusion is counted in the :class:`Selection`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from smiexlm.data.normalize import kept_names, text_cells
from smiexlm.errors import ConfigError, DataError
from smiexlm.trust.columns import MEMBER_PROBABILITIES

Acquisition = Literal["uncertainty", "std", "tta_std", "novelty", "value", "ucb"]
ACQUISITIONS: tuple[str, ...] = ("uncertainty", "std", "tta_std", "novelty", "value", "ucb")
DEFAULT_MAX_SIMILARITY = 0.7  # ECFP4 Tanimoto: above it, two molecules are of one series
_RANKS_BY = {"uncertainty": "the closeness of a probability to 0.5", "std": "the ensemble's "
             "spread", "tta_std": "the spread over random SMILES", "novelty": "the distance "
             "from the training molecules", "value": "the prediction"}  # fmt: skip


@dataclass
class Selection:
    """The picked rows (input columns, then ``acquisition`` and ``pick``, 1 first) and the
    counts of what was left out."""

    picks: Any  # pandas DataFrame
    n_rows: int
    n_unscored: int  # invalid rows or NaN scores
    n_too_similar: int  # skipped on the way down for being near a molecule already picked

    def summary(self) -> str:
        return (
            f"{len(self.picks):,} picked of {self.n_rows:,} rows ({self.n_unscored:,} without "
            f"a score, {self.n_too_similar:,} skipped as too similar to a pick)"
        )


def task_column(frame: Any, task: str | None) -> str:
    """The predicted column ``task`` names, or the table's only label column when ``task`` is
    None (:func:`~smiexlm.trust.columns.label_columns`); DataError for a column that is not
    there or holds no numbers."""
    from smiexlm.trust.columns import label_columns

    if task is None:
        tasks = label_columns(frame.columns)
        if len(tasks) != 1:
            raise DataError(
                f"the table holds {len(tasks)} predicted columns {tasks}: name one with --task"
                if tasks
                else "the table holds no predicted column after 'valid' (is it "
                "predict's output?): name the column to rank by with --task"
            )
        task = tasks[0]
    if task not in frame.columns:
        raise DataError(f"--task {task!r}: no such column; the table has {list(frame.columns)}")
    column = frame[task]
    try:  # numbers kept as text: a CSV read as written, an input column of parts
        _numbers(frame, task)
    except DataError:
        raise DataError(
            f"--task {task!r}: the column holds text (e.g. {column.iloc[0]!r}): "
            "expected numbers, a predicted label"
        ) from None
    return task


def acquisition(
    frame: Any, task: str, by: Acquisition, lowest: bool = False, kappa: float = 1.0
) -> np.ndarray:
    """(n,) float64 score per row, higher picked first; NaN where the row cannot be scored."""
    _check_options(by, lowest, kappa)
    if by == "ucb":
        spread = next((c for c in (f"{task}_std", f"{task}_tta_std") if c in frame.columns), None)
        if spread is None:
            raise DataError(
                f"--by ucb needs a spread beside {task!r}: the column {task + '_std'!r} "
                f"(predict with several --checkpoint folders) or {task + '_tta_std'!r} "
                "(predict --tta K)"
            )
        value = acquisition(frame, task, "value", lowest)
        return value + kappa * _numbers(frame, spread)
    column = {"uncertainty": task, "std": f"{task}_std", "tta_std": f"{task}_tta_std",
              "novelty": "nearest_tanimoto", "value": task}[by]  # fmt: skip
    if column not in frame.columns:
        why = {"std": "predict with several --checkpoint folders (an ensemble) writes it",
               "tta_std": "predict --tta K writes it",
               "novelty": "predict writes it from a folder that keeps its training molecules"}  # fmt: skip
        raise DataError(f"--by {by} needs the column {column!r}: {why.get(by, 'not found')}")
    members = [f"{task}{m}" for m in MEMBER_PROBABILITIES if f"{task}{m}" in frame.columns]
    if by == "uncertainty" and members:  # a blend: its score ranks, its members' are odds
        column = f"the mean of {members}"
        values = np.mean([_numbers(frame, m) for m in members], axis=0)
    else:
        values = _numbers(frame, column)
    if "valid" in frame.columns:
        values = np.where(_flags(frame["valid"]), values, np.nan)
    if by == "uncertainty":
        finite = values[np.isfinite(values)]
        if finite.size and (finite.min() < 0 or finite.max() > 1):
            raise DataError(
                f"--by uncertainty: column {column!r} holds values outside [0, 1] ("
                f"{finite.min():.3g} to {finite.max():.3g}); expected probabilities (a "
                "classification task); for regression rank by --by std or tta_std"
            )
        return 1.0 - np.abs(2.0 * values - 1.0)
    if by == "novelty":
        return 1.0 - values
    return -values if by == "value" and lowest else values


def _numbers(frame: Any, column: str) -> np.ndarray:
    """(n,) float64 values of ``column``: numbers as they are, text (a CSV read as written)
    parsed, a blank cell NaN; DataError naming the column and a cell that is no number."""
    import pandas as pd

    values = frame[column]
    if values.dtype.kind in "fiub":
        return values.to_numpy(dtype=np.float64)
    cells = text_cells(values).str.strip()
    parsed = pd.to_numeric(cells.where(cells != ""), errors="coerce")
    bad = parsed.isna() & (cells != "")
    if bad.any():
        raise DataError(f"column {column!r} row {int(np.argmax(bad.to_numpy()))} holds "
                        f"{cells[bad].iloc[0]!r}: expected a number")  # fmt: skip
    return parsed.to_numpy(dtype=np.float64)


def _flags(values: Any) -> np.ndarray:
    """(n,) bool of predict's ``valid`` column, as written (bool) or read as text."""
    if values.dtype.kind == "b":
        return values.to_numpy()
    return text_cells(values).str.strip().str.lower().isin(("true", "1")).to_numpy()


def _check_options(by: str, lowest: bool, kappa: float) -> None:
    """ConfigError for a bad ``by`` or ``kappa``, or an option that would do nothing with
    ``by``: ``lowest`` orders the predictions (value, ucb) and ``kappa`` weighs ucb's spread;
    neither changes another score."""
    if by not in ACQUISITIONS:
        raise ConfigError("--by", by, "one of " + ", ".join(ACQUISITIONS))
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not 0 <= kappa < math.inf:
        raise ConfigError("--kappa", kappa, "a finite non-negative number (0 ranks by value alone)")
    if lowest and by not in ("value", "ucb"):
        raise ConfigError("--lowest", lowest, f"it only with --by value or ucb (the lowest "
                          f"predictions first); --by {by} ranks by {_RANKS_BY[by]}, highest "
                          "first")  # fmt: skip
    if kappa != 1.0 and by != "ucb":
        raise ConfigError("--kappa", kappa, f"it only with --by ucb (the spread's weight "
                          f"against the value); --by {by} ranks by {_RANKS_BY[by]} alone")  # fmt: skip


def select(
    frame: Any,
    n: int,
    by: Acquisition = "uncertainty",
    task: str | None = None,
    max_similarity: float = DEFAULT_MAX_SIMILARITY,
    smiles_col: str = "smiles",
    lowest: bool = False,
    kappa: float = 1.0,
) -> Selection:
    """The ``n`` rows of ``frame`` to test next: highest ``by`` score first (ties in input
    order), none more similar than ``max_similarity`` (ECFP4 Tanimoto) to one picked before
    it; ``kappa`` weighs the spread in ``ucb``. An option that would do nothing with ``by``
    (``lowest`` beyond value and ucb, ``kappa`` beyond ucb, ``task`` with novelty) is a
    ConfigError naming it."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError("-n", n, "a positive integer")
    if not 0 < max_similarity <= 1:
        raise ConfigError("--max-similarity", max_similarity, "a Tanimoto similarity in (0, 1]")
    if smiles_col not in frame.columns:
        raise DataError(f"--smiles-col {smiles_col!r}: no such column in {list(frame.columns)}")
    _check_options(by, lowest, kappa)  # before the columns are looked for
    if by == "novelty" and task is not None:  # nearest_tanimoto is one column for every task
        raise ConfigError("--task", task, "none with --by novelty, which ranks by the distance "
                          "from the training molecules, the same for every task")  # fmt: skip
    column = "" if by == "novelty" else task_column(frame, task)
    score = acquisition(frame, column, by, lowest, kappa)
    scored = np.flatnonzero(np.isfinite(score))
    order = scored[np.argsort(-score[scored], kind="stable")]  # ties: input order
    picked, skipped = _diverse(order, frame[smiles_col].tolist(), n, max_similarity)
    picks = frame.iloc[picked].copy()
    names = kept_names(list(picks.columns), {"acquisition", "pick"})
    if renamed := {c: n for c, n in names.items() if c != n}:
        logging.getLogger(__name__).warning(
            "select writes columns named like the input's own %s: the input's are kept as %s",
            list(renamed), list(renamed.values()))  # fmt: skip
    picks = picks.rename(columns=renamed)
    picks["acquisition"] = score[picked]
    picks["pick"] = np.arange(1, len(picked) + 1)
    return Selection(picks, len(frame), len(frame) - len(scored), skipped)


def _diverse(order: np.ndarray, smiles: list, n: int, max_similarity: float) -> tuple[list, int]:
    """Walk ``order`` and keep up to ``n`` rows, skipping any whose ECFP4 Tanimoto to a kept
    one exceeds ``max_similarity``; (kept rows, skipped count)."""
    if max_similarity >= 1:
        return [int(i) for i in order[:n]], 0
    from smiexlm.chemistry.fingerprints import ecfp4_packed
    from smiexlm.trust.domain import tanimoto_from_counts, unpack_ecfp4

    kept: list[int] = []
    kept_bits = np.zeros((n, 2048), dtype=np.float32)  # the picks' fingerprints, row by row
    kept_counts = np.zeros(n, dtype=np.float32)
    skipped, block = 0, max(4 * n, 256)  # fingerprints are made a block of the ranking at a time
    for start in range(0, len(order), block):
        rows = order[start : start + block]
        for row, fp in zip(rows, unpack_ecfp4(ecfp4_packed([smiles[i] for i in rows])), strict=True):  # fmt: skip
            if len(kept) == n:
                return kept, skipped
            m = len(kept)
            similar = tanimoto_from_counts(kept_bits[:m] @ fp, kept_counts[:m], fp.sum())
            if m and similar.max() > max_similarity:
                skipped += 1
                continue
            kept_bits[m], kept_counts[m] = fp, fp.sum()
            kept.append(int(row))
    return kept, skipped
