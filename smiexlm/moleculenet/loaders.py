"""Read MoleculeNet CSVs (and users' own CSVs) into a clean :class:`MoleculeTask`.

A task holds the SMILES (stripped of surrounding whitespace), the labels as float (NaN =
missing label), the task type and the file's provenance. Molecules that RDKit cannot parse,
or longer than :data:`~smiexlm.data.normalize.MAX_SMILES_CHARS` characters (never handed to
RDKit), are dropped and counted, never silently: ``n_invalid``, ``invalid`` (the first rows
as ``(row, smiles)``) and ``n_raw``. This is the one place a task's SMILES are validated.

``load_task``/``read_task`` give the task; ``load_dataset`` gives a MoleculeNet set's table as
a plain DataFrame (``smiles`` + label columns) for display (:meth:`MoleculeTask.table`).
"""

from __future__ import annotations

import logging
import os
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from smiexlm.data.normalize import smiles_problem, text_cells
from smiexlm.data.readers import detect_format, read_table
from smiexlm.data.widen.exclusion import EvaluationSet
from smiexlm.errors import DataError, check_distinct, shorten
from smiexlm.moleculenet.registry import DATASETS, DatasetSpec, TaskType, get_spec
from smiexlm.moleculenet.splits import VALID_FROM_TRAIN, carve_valid, read_parts, row_name
from smiexlm.moleculenet.task import MoleculeTask
from smiexlm.paths import cache_dir, check_input_file, data_dir, file_sha256

log = logging.getLogger(__name__)

_MAX_LISTED_INVALID = 20
# Fewer labelled molecules than this cannot be split into train, valid and test at all.
MIN_REGRESSION_LABELS = 3


def download(spec: DatasetSpec, force: bool = False) -> Path:
    """Fetch ``spec.url`` into ``cache_dir()/moleculenet/`` and verify its sha256.

    Entries without a pinned checksum get theirs recorded next to the file on first fetch
    (``<file>.sha256``) and checked against it on every later use.
    """
    folder = cache_dir() / "moleculenet"
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / (spec.filename if spec.sha256 else Path(spec.url).name)
    if force or not target.is_file():
        log.info("downloading %s from %s", spec.name, spec.url)
        partial = target.with_suffix(target.suffix + ".part")
        try:
            with (
                urllib.request.urlopen(spec.url, timeout=60) as response,
                open(partial, "wb") as out,
            ):
                out.write(response.read())
        except OSError as exc:
            raise DataError(
                f"dataset {spec.name!r}: not under SMIEXLM_DATA/moleculenet/ and the download "
                f"from {spec.url} failed ({exc}); expected a reachable URL or a local copy"
            ) from exc
        partial.replace(target)
    _verify(spec, target)
    return target


def _verify(spec: DatasetSpec, path: Path) -> str:
    actual = file_sha256(path)
    expected = spec.sha256
    record = path.with_name(path.name + ".sha256")
    if expected is None and path.parent == cache_dir() / "moleculenet":
        if not record.is_file():
            record.write_text(actual + "\n")
        expected = record.read_text().strip()
    if expected is not None and actual != expected:
        raise DataError(
            f"dataset {spec.name!r}: {path} has sha256 {actual}, expected {expected} "
            "(delete the file to fetch it again)"
        )
    return actual


def dataset_path(spec: DatasetSpec, allow_download: bool = True) -> Path:
    """Where ``spec``'s file is: SMIEXLM_DATA/moleculenet/, then the cache, then the web."""
    root = data_dir(required=False)
    candidates = []
    if root is not None:
        candidates.append(root / "moleculenet" / spec.filename)
    candidates.append(cache_dir() / "moleculenet" / spec.filename)
    candidates.append(cache_dir() / "moleculenet" / Path(spec.url).name)  # unpinned downloads
    for path in candidates:
        if path.is_file():
            return path
    if not allow_download or os.environ.get("SMIEXLM_OFFLINE"):
        searched = ", ".join(dict.fromkeys(str(p.parent) for p in candidates))
        why = (
            "SMIEXLM_OFFLINE is set, so nothing is downloaded"
            if allow_download
            else "no download asked for"
        )
        raise DataError(
            f"dataset {spec.name!r}: file {spec.filename!r} not found in {searched} ({why}); "
            "expected SMIEXLM_DATA to point at a folder with moleculenet/"
        )
    return download(spec)


def load_task(name: str, allow_download: bool = True) -> MoleculeTask:
    """The MoleculeNet dataset ``name`` (see :func:`~smiexlm.moleculenet.registry.get_spec`)."""
    spec = get_spec(name)
    path = dataset_path(spec, allow_download)
    raw = read_table(path, spec.smiles_col, f"dataset {spec.name!r} file", infer_types=True)
    labels = list(spec.label_cols) or [c for c in raw.columns if c != spec.smiles_col]
    task = clean_task(raw, spec.smiles_col, labels, spec.task_type, name=spec.name, strict=False)
    task.source, task.sha256 = str(path), _verify(spec, path)
    return task


def evaluation_sets() -> list[EvaluationSet]:
    """Every MoleculeNet file under ``SMIEXLM_DATA/moleculenet/`` as an
    :class:`~smiexlm.data.widen.exclusion.EvaluationSet` (what ``smiexlm widen`` never lets
    into a corpus); DataError for a file there that no registry entry names, so that no
    evaluation molecule is missed."""
    folder = data_dir() / "moleculenet"
    if not folder.is_dir():
        raise DataError(f"{str(folder)!r} does not exist: expected the MoleculeNet folder")
    known = {spec.filename: name for name, spec in DATASETS.items()}
    found = sorted(p for p in folder.iterdir() if p.is_file() and ".csv" in p.name)
    unknown = [p.name for p in found if p.name not in known]
    if unknown:
        raise DataError(
            f"MoleculeNet folder {str(folder)!r} holds {unknown!r}: expected only files the "
            "registry names, so that every evaluation molecule is excluded"
        )
    return [EvaluationSet(known[p.name], file_sha256(p),
                          lambda n=known[p.name]: load_task(n, allow_download=False).smiles)
            for p in found]  # fmt: skip


def load_dataset(name: str, allow_download: bool = True) -> pd.DataFrame:
    """The MoleculeNet dataset ``name`` as a plain DataFrame for display: ``smiles`` + float
    label columns. Fine-tuning, the probe and the baseline take the task (:func:`load_task`)."""
    return load_task(name, allow_download).table()


def read_task(
    path: Path | str,
    smiles_col: str,
    label_cols: Sequence[str],
    task_type: TaskType = "classification",
    name: str | None = None,
    split_col: str | None = None,
    valid_from_train: float = VALID_FROM_TRAIN,
) -> MoleculeTask:
    """A user's table (CSV, TSV or Parquet, read by :func:`~smiexlm.data.readers.read_table`),
    checked as strictly as the built-in sets; ``name`` (default: the file name without
    suffix) titles the results. ``split_col`` names a column holding the table's own split
    (``train``, ``valid`` or ``test`` in each row), used by the split ``column:<split_col>``;
    a column with train and test rows but no valid ones (how many public benchmarks ship
    their splits) gets ``valid_from_train`` of its train rows as the validation part
    (:func:`~smiexlm.moleculenet.splits.carve_valid`, said once on stderr; 0 keeps the
    column as it is, which training then refuses).

    Raises DataError for a missing file or column, classification labels other than 0/1
    (``true``/``false`` in any case are read as 1/0), a classification task with no positives
    (or no negatives), or regression labels that are not finite numbers or fewer than
    :data:`MIN_REGRESSION_LABELS` per column.
    """
    path = check_input_file(path, "--data")
    if task_type not in ("classification", "regression"):
        raise DataError(f"task_type {task_type!r}: expected 'classification' or 'regression'")
    if not label_cols:
        raise DataError(f"label_cols of {path.name}: expected at least one label column")
    raw = read_table(path, smiles_col, "--data", infer_types=True)  # CSV, TSV or Parquet
    first_line = None if detect_format(path, "--data") == "parquet" else 2
    task = clean_task(raw, smiles_col, list(label_cols), task_type, name=name or path.stem,
                      strict=True, split_col=split_col, first_line=first_line)  # fmt: skip
    if task.parts is not None and "valid" not in task.parts and valid_from_train:
        task.parts, how = carve_valid(task.smiles, task.parts, valid_from_train)
        log.warning("%s: split column %r has no valid rows: %d of its %d train molecules (%.0f "
                    "%%, %s) are the validation part (--valid-from-train 0 refuses such a "
                    "column)", task.name, split_col, task.parts.count("valid"),
                    task.parts.count("valid") + task.parts.count("train"),
                    100 * valid_from_train, how)  # fmt: skip
    task.source, task.sha256 = str(path), file_sha256(path)
    return task


def clean_task(
    raw: pd.DataFrame,
    smiles_col: str,
    label_cols: list[str],
    task_type: TaskType,
    name: str,
    strict: bool,
    split_col: str | None = None,
    first_line: int | None = 2,
) -> MoleculeTask:
    """Select, type-check and RDKit-filter the columns of a raw CSV (see module docstring).
    Errors name a bad cell by its line in the file, the first data row being ``first_line``
    (a CSV with a header row: 2), or by its row from 0 where ``first_line`` is None
    (Parquet)."""
    check_distinct(f"{name}: label columns", list(label_cols))
    wanted = [smiles_col, *label_cols] + ([] if split_col is None else [split_col])
    missing = [c for c in wanted if c not in raw.columns]
    if missing:
        shown = ", ".join(map(repr, list(raw.columns)[:12]))
        raise DataError(
            f"{name}: column(s) {missing} not found; expected names among the CSV header "
            f"({shown}{', ...' if raw.shape[1] > 12 else ''})"
        )
    smiles = text_cells(raw[smiles_col]).str.strip()
    columns = {col: _label_values(raw[col], col, task_type, name, first_line)
               for col in label_cols}  # fmt: skip
    labels = pd.DataFrame(columns, index=raw.index)
    if task_type == "classification":
        _check_binary(labels, name, strict, first_line)
    problems = [smiles_problem(s) for s in smiles]  # the length is checked before RDKit
    valid = np.array([p is None for p in problems], dtype=bool)
    invalid_rows = np.flatnonzero(~valid)
    if len(invalid_rows):
        reasons = pd.Series([problems[r] for r in invalid_rows]).value_counts()
        where = "line" if first_line is not None else "row"
        first = "; ".join(f"{where} {r + (first_line or 0)} {shorten(smiles.iloc[r], 30)!r}: "
                          f"{problems[r]}" for r in invalid_rows[:3])  # fmt: skip
        log.warning("%s: %d of %d SMILES excluded (%s; %s%s)", name, len(invalid_rows), len(raw),
                    ", ".join(f"{why}: {n}" for why, n in reasons.items()), first,
                    "; ..." if len(invalid_rows) > 3 else "")  # fmt: skip
    if task_type == "regression":
        _check_regression(labels, valid, name, first_line)
    _warn_repeats(smiles[valid], labels[valid], name)
    parts = (None if split_col is None
             else read_parts(raw[split_col], split_col, name, first_line))  # fmt: skip
    return MoleculeTask(
        name=name,
        smiles=smiles[valid].tolist(),
        labels=labels.to_numpy(dtype=float)[valid],
        label_cols=list(label_cols),
        task_type=task_type,
        n_raw=len(raw),
        n_invalid=len(invalid_rows),
        invalid=[(int(r), smiles.iloc[r]) for r in invalid_rows[:_MAX_LISTED_INVALID]],
        split_col=split_col,
        parts=None if parts is None else [p for p, ok in zip(parts, valid, strict=True) if ok],
    )


def _warn_repeats(smiles: pd.Series, labels: pd.DataFrame, name: str) -> None:
    """Say how many SMILES the table holds more than once, and how many of them with labels
    that differ: a random split may put one copy in train and another in test."""
    repeated = smiles.duplicated(keep=False)
    if not repeated.any():
        return
    groups = labels[repeated].fillna(np.inf).groupby(smiles[repeated].to_numpy())
    differ = int((groups.nunique() > 1).any(axis=1).sum())
    log.warning("%s: %d SMILES appear more than once (%d of them with labels that differ); a "
                "random split may put copies of one in train and in test, the scaffold split "
                "keeps them together", name, smiles[repeated].nunique(), differ)  # fmt: skip


def _label_values(
    column: pd.Series, col: str, task_type: TaskType, name: str, first_line: int | None
) -> pd.Series:
    """Float labels of one column, NaN where blank; DataError naming the first bad cell.

    For classification, ``true``/``false`` (any case) are read as 1/0."""
    text = text_cells(column).str.strip()
    blank = text == ""
    if task_type == "classification":
        text = text.str.lower().replace({"true": "1", "false": "0"})
    values = pd.to_numeric(text.where(~blank), errors="coerce").astype(float)
    bad = values.isna() & ~blank
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        kind = "0/1 (or true/false)" if task_type == "classification" else "a number"
        raise DataError(
            f"{name}: label column {col!r} {row_name(row, first_line)} = "
            f"{text_cells(column).iloc[row]!r}: expected {kind}"
        )
    return values


def _check_binary(labels: pd.DataFrame, name: str, strict: bool, first_line: int | None) -> None:
    for col in labels.columns:
        values = labels[col].dropna()
        odd = values[~values.isin([0.0, 1.0])]
        if len(odd):
            row = labels.index.get_loc(odd.index[0])
            raise DataError(
                f"{name}: label column {col!r} has value {odd.iloc[0]:g} "
                f"({row_name(row, first_line)}): "
                "expected 0/1 for classification (blank = missing); use "
                "--task-type regression for continuous targets"
            )
        if strict and (values.sum() == 0 or values.sum() == len(values)):
            which = "positives" if values.sum() == 0 else "negatives"
            raise DataError(
                f"{name}: label column {col!r} has no {which} among {len(values)} labels; "
                "expected both classes for a classification task"
            )


def _check_regression(
    labels: pd.DataFrame, valid: np.ndarray, name: str, first_line: int | None
) -> None:
    """Finite numbers, at least MIN_REGRESSION_LABELS per column on the ``valid`` rows."""
    limit = float(np.finfo(np.float32).max)  # the head trains on float32 targets
    for col in labels.columns:
        values = labels[col].to_numpy()
        beyond = np.flatnonzero(np.isinf(values) | (np.abs(values) > limit))
        if len(beyond):
            raise DataError(
                f"{name}: label column {col!r} {row_name(beyond[0], first_line)} = "
                f"{values[beyond[0]]:g}: expected a finite number of float32's range "
                f"(|y| <= {limit:.4g}) for regression"
            )
        n = int((~np.isnan(values[valid])).sum())
        if n < MIN_REGRESSION_LABELS:
            raise DataError(
                f"{name}: label column {col!r} has {n} labelled molecule(s): expected at "
                f"least {MIN_REGRESSION_LABELS} numbers for a regression task (blank = missing)"
            )
