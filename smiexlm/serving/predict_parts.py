"""``smiexlm predict`` on a table: into one CSV (:func:`predict_file`) or a folder of Parquet
parts (:func:`predict_parts`: library-scale, resumable, torchrun-ready).

Both give the predictions of :func:`~smiexlm.serving.prediction.predict` with the input's
id columns: one row per input (the id columns, the SMILES, ``valid``, then the label columns,
``<label>_std`` for an ensemble, and the columns of trust that
:mod:`~smiexlm.serving.prediction` lists); bad rows get NaN predictions and are listed with their
reasons (``rejects.csv`` beside the parts, ``<name>.rejects.csv`` beside the CSV).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from smiexlm.data.normalize import kept_names, text_cells
from smiexlm.parts.job import (
    DEFAULT_PART_ROWS,
    ChunkOutput,
    MakeProcess,
    PartsJob,
    PartsResult,
    Process,
)

log = logging.getLogger(__name__)

Reject = tuple[int, str, str]  # (input row, SMILES, reason)
How = dict[str, Any]  # predict's options: backend, tta, calibrate, conformal_alpha, mondrian


@dataclass
class PredictedFile:
    """What :func:`predict_file` wrote: the file, its rows, and the bad rows (also listed in
    ``rejects_path``)."""

    out: Path
    n_rows: int
    rejects: list[Reject]
    rejects_path: Path


def predict_file(
    checkpoint: Path | str | Sequence[Path | str],
    input_path: Path,
    out: Path,
    smiles_col: str = "smiles",
    id_cols: list[str] | None = None,
    how: How | None = None,
) -> PredictedFile:
    """Predict every SMILES of ``input_path`` into the CSV ``out`` (written atomically);
    ``id_cols`` (default: every input column but the SMILES) are kept, under
    ``input_<name>`` where predict writes a column of that name;
    ``how``: the options of :func:`~smiexlm.serving.prediction.predict` (backend, tta,
    calibrate, conformal_alpha, mondrian).
    Every bad row is listed with its reason in ``<name>.rejects.csv``, written with it.
    When no row can be predicted, nothing is written: DataError with the first rows' reasons."""
    from smiexlm.atomic import atomic_paths
    from smiexlm.data.readers import read_table, write_table
    from smiexlm.errors import DataError, every_row_failed
    from smiexlm.paths import check_output, rejects_beside, write_rejects
    from smiexlm.serving.prediction import served_folders

    folders = served_folders(checkpoint)
    out = check_output(out, "--out")
    listed = check_output(rejects_beside(out), "--out rejects file")
    frame = read_table(input_path, smiles_col)  # text cells; a blank cell is ""
    if not _usable(frame[smiles_col]).any():
        raise DataError(f"--input: column {smiles_col!r} has no non-empty SMILES")
    how = how or {}
    outputs = _output_columns(folders, how)
    keep = _id_columns(frame, smiles_col, outputs, id_cols)
    table, rejects = _predict_chunk(folders, frame, smiles_col, keep, outputs, 0, how)
    if len(rejects) == len(table):  # all NaN: nothing under the final name
        raise every_row_failed("predict", smiles_col, input_path, len(table), rejects)
    with atomic_paths(out, listed) as (tmp, tmp_listed):  # a reader never sees half a file
        write_table(table, tmp)
        write_rejects(rejects, tmp_listed)
    return PredictedFile(out, len(table), rejects, listed)


def predict_parts(
    checkpoint: Path | str | Sequence[Path | str],
    input_path: Path,
    out: Path,
    smiles_col: str = "smiles",
    id_cols: list[str] | None = None,
    part_rows: int = DEFAULT_PART_ROWS,
    chunk_rows: int = 8192,
    progress: bool = True,
    threads: int | None = None,
    how: How | None = None,
) -> PartsResult:
    """Predict every SMILES of ``input_path`` with the fine-tuned folder(s) ``checkpoint``
    into the folder ``out``; the same call resumes an interrupted job. ``id_cols`` (default:
    every input column but the SMILES) are kept, under ``input_<name>``
    where predict writes a column of that name; ``how`` as in
    :func:`predict_file`."""
    from smiexlm.data.readers import iter_table
    from smiexlm.parts.job import input_record
    from smiexlm.parts.writing import run_parts
    from smiexlm.paths import check_output
    from smiexlm.serving.prediction import served_folders
    from smiexlm.training.workers import job_workers

    folders = served_folders(checkpoint)
    out, input_path = Path(out), Path(input_path)
    check_output(out, "--out", kind="folder")  # before any compute, not after it
    chunks = iter_table(input_path, smiles_col, chunk_rows)
    first = next(chunks)  # raises DataError for an empty or unreadable input
    with job_workers(threads) as workers:
        job, make = predict_job(folders, input_record(input_path), first, smiles_col, id_cols,
                                part_rows, how or {})  # fmt: skip
        return run_parts(job, out, _chain(first, chunks), make(), workers, progress)


def predict_job(
    folders: list, input: dict[str, Any], first: Any, smiles_col: str,
    id_cols: list[str] | None, part_rows: int, how: How,
) -> tuple[PartsJob, MakeProcess]:  # fmt: skip
    """The parts job of predicting ``input`` (its record; ``first``: its first rows) with
    ``folders``, and what builds its chunk processor (:func:`chunk_predictor`)."""
    from smiexlm.parts.job import model_record

    keep, make = chunk_predictor(folders, first, smiles_col, id_cols, how)
    settings = {"smiles_col": smiles_col, "id_cols": keep, "backend": how.get("backend", "torch")}
    # a folder of parts is one kind of prediction throughout (options at their default are
    # left out, so that a job started before they existed resumes)
    settings |= {k: v for k, v in how.items() if k != "backend" and v}
    job = PartsJob("predict", input, model_record(map(Path, folders)), settings, part_rows)
    return job, make


def chunk_predictor(folders: list, first: Any, smiles_col: str, id_cols: list[str] | None,
                    how: How) -> tuple[dict[str, str], MakeProcess]:  # fmt: skip
    """The id columns kept (input name -> output name, see :func:`_id_columns`) of a table
    whose first rows are ``first``, and what builds, in the process that runs it, the
    processor of its chunks: ``process(frame, start)`` gives the output rows and bad rows."""
    outputs = _output_columns(folders, how)
    keep = _id_columns(first, smiles_col, outputs, id_cols)
    return keep, partial(_chunk_predictor, folders, smiles_col, keep, outputs, how)


def _chunk_predictor(folders: list, smiles_col: str, keep: dict[str, str],
                     outputs: dict[str, Any], how: How) -> Process:  # fmt: skip
    import pyarrow as pa

    def process(frame: Any, start: int) -> ChunkOutput:
        table, rejects = _predict_chunk(folders, frame, smiles_col, keep, outputs, start, how)
        return ChunkOutput(pa.Table.from_pandas(table, preserve_index=False), rejects)

    return process


def _output_columns(folders: list, how: How) -> dict[str, Any]:
    """The predicted columns (from one molecule), each with its value in a bad row: NaN,
    False for a flag (``in_domain``), "" for text (``<label>_set``)."""
    from smiexlm.serving.prediction import predict

    probe = predict(folders, ["C"], **how)
    fills = {"b": False, "O": ""}
    return {c: fills.get(probe[c].dtype.kind, float("nan"))
            for c in probe.columns if c not in ("smiles", "valid")}  # fmt: skip


def _predict_chunk(
    folders: list, frame: Any, smiles_col: str, keep: dict[str, str], outputs: dict[str, Any],
    start: int, how: How,
) -> tuple[Any, list[Reject]]:  # fmt: skip
    """The output rows of ``frame`` (a DataFrame) and its bad rows (row, SMILES, reason)."""
    import numpy as np
    import pandas as pd

    from smiexlm.model.inputs import readable_smiles
    from smiexlm.serving.prediction import predict

    frame = frame.reset_index(drop=True)
    raw = text_cells(frame[smiles_col])
    texts = raw.str.strip()
    usable = _usable(frame[smiles_col])
    preds = {c: np.full(len(frame), fill, dtype=object if fill == "" else type(fill))
             for c, fill in outputs.items()}  # fmt: skip
    valid = pd.Series(False, index=frame.index)
    if usable.any():
        got = predict(folders, texts[usable].tolist(), **how)
        rows = np.flatnonzero(usable.to_numpy())
        for column in outputs:
            preds[column][rows] = got[column].to_numpy()
        valid[usable] = got["valid"].to_numpy(dtype=bool)
    rejects = []
    for i in np.flatnonzero(~valid.to_numpy()):
        reason = readable_smiles(raw.iloc[i])[1] or "no prediction"
        rejects.append((start + int(i), raw.iloc[i], reason))
    result = frame[list(keep)].rename(columns=keep)
    result["smiles"] = raw
    result["valid"] = valid.to_numpy()
    for column in outputs:
        result[column] = preds[column]
    return result, rejects


def _usable(column: Any) -> Any:
    """True where a cell can be a SMILES: not blank, no whitespace inside."""
    texts = text_cells(column).str.strip()
    return (texts != "") & ~texts.str.contains(r"\s")


def _id_columns(
    first: Any, smiles_col: str, outputs: dict[str, Any], id_cols: list[str] | None
) -> dict[str, str]:
    """The input columns kept, each with its name in the output: its own, or ``input_<name>``
    where predict writes a column of that name (``valid``, a label, ``in_domain``...), so that
    no input column is ever dropped or overwritten (said once on stderr)."""
    from smiexlm.errors import DataError

    if id_cols is None:
        id_cols = [c for c in first.columns if c != smiles_col]
    missing = [c for c in id_cols if c not in first.columns]
    if missing:
        raise DataError(f"--id-cols {missing}: expected columns of the input, among "
                        f"{list(first.columns)}")  # fmt: skip
    names = kept_names(id_cols, {"smiles", "valid", *outputs})
    renamed = {c: n for c, n in names.items() if c != n}
    if renamed:
        log.warning("predict writes columns named like the input's own %s: the input's are "
                    "kept as %s", list(renamed), list(renamed.values()))  # fmt: skip
    return names


def _chain(first: Any, rest: Any) -> Any:
    yield first
    yield from rest
