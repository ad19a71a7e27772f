"""Partitioned, resumable outputs of batch jobs: ``smiexlm embed``/``predict`` into a folder.

An input of N rows is cut into parts of ``part_rows`` consecutive rows: part ``i`` holds
input rows ``[i·part_rows, (i+1)·part_rows)``, in input order, whoever writes it. The folder::

    OUT/manifest.json          the job (input sha256, model sha256, settings, part_rows); once
                               complete, also its parts, row and reject counts, per-rank figures
    OUT/part-00000.parquet     the output rows of part 0 (id columns, SMILES, results)
    OUT/part-00000.json        the commit record of part 0: range, counts, bad rows with reasons
    OUT/rejects.csv            every bad row (row, smiles, reason), in input order, at the end

Each part is written under temporary names and renamed into place, the record first and the
Parquet file last: a part counts as finished only when both are there, so a killed job leaves
finished parts whole and nothing half-written under a final name. Running the same command
again resumes: a manifest that matches the input, the model and the settings is taken up, the
finished parts are skipped (never rewritten, never duplicated) and the others are written.
A manifest of another job is refused with the field that differs. Bad rows stay in the
output (NaN results) so that row ``r`` of the table is input row ``r``; their reasons are in
the records and in ``rejects.csv``.

Under ``torchrun`` every rank reads the input and writes the parts ``i`` with
``i % world_size == rank`` (:mod:`smiexlm.workers`); after a barrier rank 0 checks that
every part is there and writes the final manifest. :func:`read_parts` reads the parts back as
one table in input order.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

from smiexlm.data.readers import file_sha256
from smiexlm.errors import DataError
from smiexlm.paths import (
    atomic_paths,
    check_output,
    is_temporary_name,
    read_json_file,
    remove_stale_temporaries,
    write_json,
    write_text_atomic,
)
from smiexlm.workers import Workers, peak_rss_mib

PARTS_FORMAT = "smiexlm-parts/1"
PART_FORMAT = "smiexlm-part/1"
MANIFEST = "manifest.json"
REJECTS = "rejects.csv"
DEFAULT_PART_ROWS = 100_000
FILE_SUFFIXES = (".parquet", ".npy", ".csv", ".tsv")  # an --out with these is one file


def part_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def record_name(index: int) -> str:
    return f"part-{index:05d}.json"


def is_parts_output(out: Path) -> bool:
    """Whether ``--out`` names a folder of parts: a name without a suffix (``emb/``,
    ``runs/emb``) or a folder that already holds parts (its ``manifest.json``), as opposed to a
    file such as ``emb.parquet``. A folder in the way of a file name (a directory ``x.npy``) is
    not taken for parts: the file writer refuses it in one line."""
    out = Path(out)
    return not out.suffix or (out / MANIFEST).is_file()


def wants_parts(out: Path, part_rows: int | None) -> bool:
    """Whether a command writes a folder of parts to ``out`` rather than one file; DataError
    for a file ``out`` given ``--part-rows`` or under torchrun (``WORLD_SIZE`` > 1)."""
    parts = is_parts_output(out)
    if part_rows is not None and not parts:
        raise DataError(
            f"--part-rows {part_rows}: --out {str(out)!r} is a file name; expected a folder "
            "name (no suffix) to hold the parts"
        )
    world = os.environ.get("WORLD_SIZE", "1")
    if not parts and world.isdigit() and int(world) > 1:
        raise DataError(
            f"--out {str(out)!r} is a file name, but a job of {world} processes (torchrun) "
            "writes a folder of parts: expected a folder name (no suffix)"
        )
    return parts


def input_record(path: Path) -> dict[str, Any]:
    path = Path(path)
    return {"path": str(path.resolve()), "sha256": file_sha256(path), "bytes": path.stat().st_size}


def model_record(folders: Iterable[Path]) -> dict[str, Any]:
    """The weights of one or more model folders: each file's sha256 (from ``checksums.json``
    where the folder has one, computed otherwise) and one digest over all of them, in order.
    Paths are kept for the reader but do not take part in the digest (a moved model matches)."""
    from smiexlm.model.integrity import read_checksums

    entries = []
    for folder in map(Path, folders):
        digests = read_checksums(folder)
        if digests is None:
            digests = {p.name: file_sha256(p) for p in sorted(folder.glob("*.safetensors"))}
        entries.append({"path": str(folder.resolve()), "sha256": dict(sorted(digests.items()))})
    joined = json.dumps([e["sha256"] for e in entries], sort_keys=True).encode()
    return {"sha256": hashlib.sha256(joined).hexdigest(), "folders": entries}


@dataclass
class PartsJob:
    """What must be the same for a folder of parts to be resumed."""

    kind: str  # "embed" or "predict"
    input: dict[str, Any]  # input_record()
    model: dict[str, Any]  # model_record()
    settings: dict[str, Any]  # options that change the output (SMILES column, pooling, ...)
    part_rows: int = DEFAULT_PART_ROWS

    def __post_init__(self) -> None:
        if not isinstance(self.part_rows, int) or self.part_rows < 1:
            raise DataError(f"--part-rows {self.part_rows!r}: expected a positive integer")

    @property
    def digest(self) -> str:
        key = [self.kind, self.input["sha256"], self.model["sha256"], self.settings,
               self.part_rows]  # fmt: skip
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()

    def document(self) -> dict[str, Any]:
        return {"format": PARTS_FORMAT, "kind": self.kind, "job": self.digest,
                "complete": False, "input": self.input, "model": self.model,
                "settings": self.settings, "part_rows": self.part_rows}  # fmt: skip


@dataclass
class ChunkOutput:
    """What processing some consecutive input rows gave."""

    table: Any  # pyarrow.Table, one row per input row, in input order
    rejects: list[tuple[int, str, str]] = field(default_factory=list)  # (row, smiles, reason)
    counts: dict[str, int] = field(default_factory=dict)  # summed over parts (e.g. unk_tokens)


Process = Callable[[Any, int], ChunkOutput]  # (DataFrame of rows, index of its first row)


@dataclass
class PartsResult:
    out: Path
    manifest: dict[str, Any]
    parts_written: int  # by this process in this run
    parts_resumed: int  # finished before this run started

    @property
    def n_rows(self) -> int:
        return self.manifest["n_rows"]

    @property
    def n_failed(self) -> int:
        return self.manifest["n_failed"]

    def summary(self) -> str:
        m = self.manifest
        workers = m["last_run"]["world_size"]
        done = (
            "all already there: nothing to do"
            if self.parts_resumed == m["n_parts"]
            else f"{m['last_run']['parts_written']} written by {workers} "
            f"process{'es' if workers > 1 else ''}, {self.parts_resumed} already there"
        )
        return (
            f"{m['n_rows']:,} rows in {m['n_parts']} parts of {m['part_rows']:,} in "
            f"{self.out} ({done}), {m['n_failed']:,} failed (listed in {self.out / REJECTS})"
        )


# ---------------------------------------------------------------------- the folder
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


def finished_parts(out: Path, job: PartsJob) -> dict[int, dict[str, Any]]:
    """index -> commit record of every finished part (record and Parquet file both there)."""
    done = {}
    for path in sorted(out.glob("part-*.json")):
        index = int(path.stem.split("-")[1])
        if not (out / part_name(index)).is_file():
            continue  # killed between the two renames: the part is written again
        _, record = read_json_file(path, "part record", PART_FORMAT)
        if record.get("job") != job.digest:
            raise DataError(
                f"part record {str(path)!r} belongs to job {str(record.get('job'))[:12]}…, not "
                f"to this folder's job {job.digest[:12]}…: the folder mixes two jobs; start a "
                "new --out folder"
            )
        done[index] = record
    return done


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
    done = finished_parts(out, job)
    if manifest.get("complete") and len(done) == manifest.get("n_parts"):
        return PartsResult(out, manifest, 0, len(done))
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
    return PartsResult(out, manifest, len(written), len(done))


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
                  "rejects": [list(r) for r in rejects]}  # fmt: skip
        tmp_record.write_text(json.dumps(record) + "\n", encoding="utf-8")
    return rows


def _finish(
    out: Path, job: PartsJob, n_rows: int, workers: list[dict], seconds: float, resumed: int
) -> None:
    """Check that every part is there, write ``rejects.csv`` and the complete manifest."""
    import pyarrow.parquet as pq

    n_parts = math.ceil(n_rows / job.part_rows)
    done = finished_parts(out, job)
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
                      "stop": record["stop"], "rows": record["rows"], "failed": record["failed"]})  # fmt: skip
        failed += record["failed"]
        lines += record["rejects"]
        for key, value in record["counts"].items():
            counts[key] = counts.get(key, 0) + value
    text = _csv_text(lines)
    write_text_atomic(out / REJECTS, text)
    columns = pq.read_schema(out / part_name(0)).names if n_parts else []
    run = {"world_size": len(workers), "seconds": round(seconds, 2), "parts_resumed": resumed,
           "parts_written": sum(len(w["parts"]) for w in workers), "workers": workers}  # fmt: skip
    manifest = {**job.document(), "complete": True, "n_rows": n_rows, "n_parts": n_parts,
                "n_failed": failed, "counts": counts, "columns": columns, "parts": parts,
                "rejects": REJECTS, "last_run": run}  # fmt: skip
    write_json(manifest, out / MANIFEST)


def _csv_text(rows: list[list[Any]]) -> str:
    import io

    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


# ---------------------------------------------------------------------- reading back
def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a complete folder of parts; DataError for an unfinished one."""
    directory = Path(directory)
    if not (directory / MANIFEST).is_file():
        raise DataError(
            f"{str(directory)!r} has no {MANIFEST}: expected a folder of parts written by "
            "`smiexlm embed`/`predict` with a folder --out"
        )
    _, doc = read_json_file(directory / MANIFEST, "parts manifest", PARTS_FORMAT)
    if not doc.get("complete"):
        have = len(list(directory.glob("part-*.parquet")))
        raise DataError(
            f"parts folder {str(directory)!r} is unfinished ({have} parts written): run the "
            "same command again to resume it"
        )
    return doc


def part_files(directory: Path) -> list[Path]:
    """The Parquet files of a complete folder of parts, in input order."""
    directory = Path(directory)
    files = [directory / p["file"] for p in read_manifest(directory)["parts"]]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise DataError(f"parts folder {str(directory)!r} lacks {missing[:5]}: expected every "
                        "part its manifest lists")  # fmt: skip
    return files


def read_parts(directory: Path, columns: list[str] | None = None) -> Any:
    """The parts of ``directory`` as one ``pyarrow.Table``, in input order (``.to_pandas()``
    for a DataFrame); ``columns`` picks some columns."""
    import pyarrow.dataset as ds

    files = part_files(directory)
    return ds.dataset([str(f) for f in files], format="parquet").to_table(columns=columns)


def iter_parts(directory: Path, columns: list[str] | None = None) -> Iterator[Any]:
    """The parts of ``directory`` one ``pyarrow.Table`` at a time, in input order."""
    import pyarrow.parquet as pq

    for path in part_files(directory):
        yield pq.read_table(path, columns=columns)
