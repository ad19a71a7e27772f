"""Partitioned, resumable outputs of batch jobs: ``smiexlm embed``/``predict`` into a folder.

An input of N rows is cut into parts of ``part_rows`` consecutive rows: part ``i`` holds
input rows ``[i·part_rows, (i+1)·part_rows)``, in input order, whoever writes it. The folder::

    OUT/manifest.json          the job (input sha256, model sha256, settings, part_rows); once
                               complete, also its parts, row and reject counts, per-rank figures
    OUT/part-00000.parquet     the output rows of part 0 (id columns, SMILES, results)
    OUT/part-00000.json        the commit record of part 0: range, counts, bad rows with reasons,
                               the Parquet file's size and sha256
    OUT/rejects.csv            every bad row (row, smiles, reason), in input order, at the end

Each part is written under temporary names and renamed into place, the record first and the
Parquet file last: a part counts as finished only when both are there, so a killed job leaves
finished parts whole and nothing half-written under a final name. Running the same command
again resumes: a manifest that matches the input, the model and the settings is taken up, the
finished parts are checked against the size and sha256 of their records and skipped (never
rewritten, never duplicated), and the others are written; a damaged part (changed in place,
truncated) is written again, and the run says so. A manifest of another job is refused with
the field that differs. Bad rows stay in the output (NaN results) so that row ``r`` of the
table is input row ``r``; their reasons are in the records and in ``rejects.csv``. A job none
of whose rows succeeded (the wrong ``--smiles-col``) keeps nothing: its parts are removed and
it fails with the first rows' reasons.

Under ``torchrun`` every rank reads the input and writes the parts ``i`` with
``i % world_size == rank`` (:mod:`smiexlm.workers`); after a barrier rank 0 checks that
every part is there and writes the final manifest. :func:`read_parts` reads the parts back as
one table in input order (:mod:`smiexlm.parts.reading`).
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Iterable, Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

from smiexlm.errors import DataError, every_row_failed
from smiexlm.parts.job import (
    DEFAULT_PART_ROWS,
    PART_FORMAT,
    REJECTS,
    ChunkOutput,
    PartsJob,
    PartsResult,
    Process,
    input_record,
    model_record,
    part_name,
    record_name,
    wants_parts,
)
from smiexlm.parts.reading import (  # the reading half, re-exported here
    MANIFEST,
    PARTS_FORMAT,
    iter_parts,
    part_files,
    read_manifest,
    read_parts,
)
from smiexlm.paths import (
    atomic_paths,
    check_output,
    file_problem,
    file_record,
    is_temporary_name,
    read_json_file,
    remove_stale_temporaries,
    write_json,
    write_text_atomic,
)
from smiexlm.workers import Workers, peak_rss_mib

__all__ = ["DEFAULT_PART_ROWS", "MANIFEST", "REJECTS", "ChunkOutput", "PartsJob", "PartsResult",
           "input_record", "iter_parts", "model_record", "part_files", "read_manifest",
           "read_parts", "run_parts", "wants_parts"]  # fmt: skip


def _mismatch(out: Path, field_name: str, there: Any, here: Any) -> DataError:
    return DataError(
        f"--out {str(out)!r} holds parts of another job: {field_name} is {there!r} there and "
        f"{here!r} here; rerun with the same input, model and options to resume, or choose a "
        "new --out folder"
    )


def check_manifest(out: Path, doc: dict[str, Any], job: PartsJob) -> None:
    """DataError naming the first field where the saved job ``doc`` differs from ``job``."""
    if doc.get("kind") != job.kind:
        raise _mismatch(out, "the command", doc.get("kind"), job.kind)
    if doc.get("input", {}).get("sha256") != job.input["sha256"]:
        raise _mismatch(out, "the input sha256", doc.get("input", {}).get("sha256"),
                        f"{job.input['sha256']} ({job.input['path']})")  # fmt: skip
    if doc.get("model", {}).get("sha256") != job.model["sha256"]:
        raise _mismatch(out, "the model sha256", doc.get("model", {}).get("sha256"),
                        job.model["sha256"])  # fmt: skip
    saved = doc.get("settings", {})
    for key in sorted(set(saved) | set(job.settings)):
        if saved.get(key) != job.settings.get(key):
            raise _mismatch(out, f"setting {key!r}", saved.get(key), job.settings.get(key))
    if doc.get("part_rows") != job.part_rows:
        raise _mismatch(out, "--part-rows", doc.get("part_rows"), job.part_rows)


def prepare_folder(out: Path, job: PartsJob, workers: Workers) -> dict[str, Any]:
    """The folder's manifest: the saved one when it matches ``job``, else a new one (written
    by rank 0). Every rank checks for itself, so every rank refuses a mismatch alike."""
    out = check_output(out, "--out", kind="folder")
    path = out / MANIFEST
    if path.is_file():
        _, doc = read_json_file(path, "parts manifest", PARTS_FORMAT)
        check_manifest(out, doc, job)
    else:
        strays = [p.name for p in out.iterdir() if not is_temporary_name(p.name)] if out.is_dir() else []  # fmt: skip
        if strays:
            raise DataError(
                f"--out {str(out)!r} is a folder with {len(strays)} entries ({strays[0]!r}, ...) "
                f"and no {MANIFEST}: expected a new or empty folder, or a folder of parts to resume"
            )
        doc = job.document()
        if workers.is_main:
            write_json(doc, path)
    workers.barrier()  # the other ranks start once the folder and its manifest exist
    return doc


def finished_parts(
    out: Path, job: PartsJob, verify: bool = True
) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
    """index -> commit record of every finished part (record and Parquet file both there and,
    with ``verify``, the file of the size and sha256 its record gives), and index -> what is
    wrong with each damaged part (to be written again)."""
    done, damaged = {}, {}
    for path in sorted(out.glob("part-*.json")):
        index = int(path.stem.split("-")[1])
        if not (out / part_name(index)).is_file():
            continue  # killed between the two renames: the part is written again
        try:
            _, record = read_json_file(path, "part record", PART_FORMAT)
        except DataError as err:
            damaged[index] = str(err)
            continue
        if record.get("job") != job.digest:
            raise DataError(
                f"part record {str(path)!r} belongs to job {str(record.get('job'))[:12]}…, not "
                f"to this folder's job {job.digest[:12]}…: the folder mixes two jobs; start a "
                "new --out folder"
            )
        problem = file_problem(out / part_name(index), record) if verify else None
        if problem:
            damaged[index] = f"{part_name(index)} {problem}"
            continue
        done[index] = record
    return done, damaged


# ---------------------------------------------------------------------- running a job
class _Slicer:
    """(part, first row, DataFrame) pieces of ``chunks``, never across a part boundary."""

    def __init__(self, chunks: Iterable[Any], part_rows: int):
        self.chunks, self.part_rows, self.n_rows = chunks, part_rows, 0

    def __iter__(self) -> Iterator[tuple[int, int, Any]]:
        for frame in self.chunks:
            offset = 0
            while offset < len(frame):
                start = self.n_rows
                part = start // self.part_rows
                take = min(len(frame) - offset, (part + 1) * self.part_rows - start)
                yield part, start, frame.iloc[offset : offset + take]
                offset += take
                self.n_rows += take


def run_parts(
    job: PartsJob,
    out: Path,
    chunks: Iterable[Any],
    process: Process,
    workers: Workers,
    progress: bool = True,
    worker_info: dict[str, Any] | None = None,
) -> PartsResult:
    """Write this rank's unfinished parts of ``chunks`` (DataFrames of input rows, in order)
    through ``process``; then rank 0 writes the final manifest. Returns it on every rank."""
    out, started = Path(out), time.time()
    manifest = prepare_folder(out, job, workers)
    done, damaged = finished_parts(out, job)
    workers.barrier()  # every rank has checked the parts before any rank writes one again
    if manifest.get("complete") and len(done) == manifest.get("n_parts"):
        return PartsResult(out, manifest, 0, len(done))
    if damaged and manifest.get("complete") and workers.is_main:
        write_json(job.document(), out / MANIFEST)  # unfinished until they are written again
    bar = None
    if progress and workers.is_main:
        from tqdm.auto import tqdm

        where = f" (rank 0 of {workers.world_size})" if workers.enabled else ""
        bar = tqdm(unit="mol", desc=f"{job.kind}{where}", smoothing=0.05)
    slicer, written, rows = _Slicer(chunks, job.part_rows), [], 0
    try:
        for index, pieces in groupby(slicer, key=lambda piece: piece[0]):
            if workers.owns(index) and index not in done:
                rows += _write_part(out, job, index, pieces, process, workers.rank, bar)
                written.append(index)
    finally:
        if bar is not None:
            bar.close()
    stats = {"rank": workers.rank, "parts": written, "rows": rows,
             "seconds": round(time.time() - started, 2), "peak_rss_mib": round(peak_rss_mib(), 1),
             "threads": workers.threads, **(worker_info or {})}  # fmt: skip
    everyone = workers.gather(stats)  # also waits for every rank's last part
    if workers.is_main:
        _finish(out, job, slicer.n_rows, everyone, time.time() - started, len(done))
    workers.barrier()  # the final manifest is there before any rank returns
    _, manifest = read_json_file(out / MANIFEST, "parts manifest", PARTS_FORMAT)
    return PartsResult(out, manifest, len(written), len(done), damaged)


def _write_part(
    out: Path, job: PartsJob, index: int, pieces: Iterable[Any], process: Process, rank: int,
    bar: Any,
) -> int:  # fmt: skip
    """Write part ``index`` (its pieces processed chunk by chunk): record, then Parquet."""
    import pyarrow.parquet as pq

    started = time.time()
    rejects: list[tuple[int, str, str]] = []
    counts: dict[str, int] = {}
    rows, writer, schema = 0, None, None
    with atomic_paths(out / record_name(index), out / part_name(index)) as (tmp_record, tmp_part):
        try:
            for _, _, frame in pieces:
                result = process(frame, index * job.part_rows + rows)
                if writer is None:
                    schema = result.table.schema
                    writer = pq.ParquetWriter(tmp_part, schema)
                writer.write_table(result.table.cast(schema))
                rejects += result.rejects
                for key, value in result.counts.items():
                    counts[key] = counts.get(key, 0) + int(value)
                rows += len(frame)
                if bar is not None:
                    bar.update(len(frame))
        finally:
            if writer is not None:
                writer.close()
        start = index * job.part_rows
        record = {"format": PART_FORMAT, "job": job.digest, "index": index, "start": start,
                  "stop": start + rows, "rows": rows, "failed": len(rejects), "counts": counts,
                  "rank": rank, "seconds": round(time.time() - started, 2),
                  **file_record(tmp_part), "rejects": [list(r) for r in rejects]}  # fmt: skip
        tmp_record.write_text(json.dumps(record) + "\n", encoding="utf-8")
    return rows


def _finish(
    out: Path, job: PartsJob, n_rows: int, workers: list[dict], seconds: float, resumed: int
) -> None:
    """Check that every part is there, write ``rejects.csv`` and the complete manifest."""
    import pyarrow.parquet as pq

    n_parts = math.ceil(n_rows / job.part_rows)
    done, _ = finished_parts(out, job, verify=False)  # each was checked or written by now
    missing = [i for i in range(n_parts) if i not in done]
    if missing:
        raise DataError(
            f"--out {str(out)!r}: parts {missing[:10]} of {n_parts} are missing after every "
            "rank finished; run the same command again to write them"
        )
    for index in range(n_parts):  # what killed writers left under temporary names
        remove_stale_temporaries(out / part_name(index))
        remove_stale_temporaries(out / record_name(index))
    parts, counts, failed = [], {}, 0
    lines = [["row", "smiles", "reason"]]
    for index in range(n_parts):
        record = done[index]
        parts.append({"file": part_name(index), "start": record["start"],
                      "stop": record["stop"], "rows": record["rows"], "failed": record["failed"],
                      "bytes": record["bytes"], "sha256": record["sha256"]})  # fmt: skip
        failed += record["failed"]
        lines += record["rejects"]
        for key, value in record["counts"].items():
            counts[key] = counts.get(key, 0) + value
    if n_rows and failed == n_rows:
        _remove_job(out, n_parts)
        raise every_row_failed(job.kind, job.settings["smiles_col"], job.input["path"], n_rows,
                               [r for i in range(n_parts) for r in done[i]["rejects"][:3]])  # fmt: skip
    text = _csv_text(lines)
    write_text_atomic(out / REJECTS, text)
    columns = pq.read_schema(out / part_name(0)).names if n_parts else []
    run = {"world_size": len(workers), "seconds": round(seconds, 2), "parts_resumed": resumed,
           "parts_written": sum(len(w["parts"]) for w in workers), "workers": workers}  # fmt: skip
    manifest = {**job.document(), "complete": True, "n_rows": n_rows, "n_parts": n_parts,
                "n_failed": failed, "counts": counts, "columns": columns, "parts": parts,
                "rejects": REJECTS, "last_run": run}  # fmt: skip
    write_json(manifest, out / MANIFEST)


def _remove_job(out: Path, n_parts: int) -> None:
    """Remove the manifest, parts and records of a job that gave nothing (and ``out`` if it
    is left empty), so that no useless output stays under the final name."""
    for index in range(n_parts):
        (out / part_name(index)).unlink(missing_ok=True)
        (out / record_name(index)).unlink(missing_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    if not any(out.iterdir()):
        out.rmdir()


def _csv_text(rows: list[list[Any]]) -> str:
    import io

    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()
