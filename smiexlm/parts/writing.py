"""Writing a folder of parts: this rank's unfinished parts, each under temporary names and
renamed into place (record first, Parquet file last), then rank 0's check that every part is
there, ``rejects.csv`` and the complete manifest."""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Iterable, Iterator
from itertools import groupby
from pathlib import Path
from typing import Any

from smiexlm.atomic import atomic_paths, remove_stale_temporaries, write_text_atomic
from smiexlm.errors import DataError, every_row_failed
from smiexlm.parts.job import (
    PART_FORMAT,
    REJECTS,
    PartsJob,
    PartsResult,
    Process,
    part_name,
    record_name,
)
from smiexlm.parts.reading import MANIFEST, PARTS_FORMAT
from smiexlm.parts.resume import finished_parts, prepare_folder
from smiexlm.paths import REJECTS_HEADER, file_record, read_json_file, write_json
from smiexlm.training.workers import Workers, peak_rss_mib


class Slicer:
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
        parts = manifest.get("parts")
        listed = [p.get("sha256") if isinstance(p, dict) else None
                  for p in (parts if isinstance(parts, list) else [])]  # fmt: skip
        if listed == [done[i]["sha256"] for i in sorted(done)]:
            return PartsResult(out, manifest, 0, len(done))
        # a manifest that disagrees with its parts' records: made again from them below
    if damaged and manifest.get("complete") and workers.is_main:
        write_json(job.document(), out / MANIFEST)  # unfinished until they are written again
    bar = None
    if progress and workers.is_main:
        from tqdm.auto import tqdm

        where = f" (rank 0 of {workers.world_size})" if workers.enabled else ""
        bar = tqdm(unit="mol", desc=f"{job.kind}{where}", smoothing=0.05)
    slicer, written, rows = Slicer(chunks, job.part_rows), [], 0
    try:
        for index, pieces in groupby(slicer, key=lambda piece: piece[0]):
            if workers.owns(index) and index not in done:
                rows += write_part(out, job, index, pieces, process, workers.rank, bar)
                written.append(index)
    finally:
        if bar is not None:
            bar.close()
    stats = {"rank": workers.rank, "parts": written, "rows": rows,
             "seconds": round(time.time() - started, 2), "peak_rss_mib": round(peak_rss_mib(), 1),
             "threads": workers.threads, **(worker_info or {})}  # fmt: skip
    everyone = workers.gather(stats)  # also waits for every rank's last part
    if workers.is_main:
        finish_job(out, job, slicer.n_rows, everyone, time.time() - started, len(done))
    workers.barrier()  # the final manifest is there before any rank returns
    _, manifest = read_json_file(out / MANIFEST, "parts manifest", PARTS_FORMAT)
    return PartsResult(out, manifest, len(written), len(done), damaged)


def write_part(
    out: Path, job: PartsJob, index: int, pieces: Iterable[Any], process: Process, rank: int,
    bar: Any,
) -> int:  # fmt: skip
    """Write part ``index`` (its ``(part, start, frame)`` pieces processed chunk by chunk):
    record, then Parquet, each under a temporary name until whole; its rows."""
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


def finish_job(
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
    lines = [list(REJECTS_HEADER)]
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
