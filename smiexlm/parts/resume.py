"""Taking up a folder of parts again: its manifest checked against the job, its finished parts
(record and Parquet file both there, of the size and sha256 the record gives) told apart
from the damaged ones, which are written again."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from smiexlm.atomic import is_temporary_name
from smiexlm.errors import DataError
from smiexlm.parts.job import PART_FORMAT, PartsJob, part_name
from smiexlm.parts.reading import MANIFEST, PARTS_FORMAT
from smiexlm.paths import check_output, file_problem, read_json_file, write_json
from smiexlm.training.runlock import LOCK_FILE
from smiexlm.training.workers import Workers

logger = logging.getLogger(__name__)


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
    by rank 0). Every rank checks for itself, so every rank refuses a mismatch alike. A saved
    manifest that cannot be read (cut short, edited) is made again, once the part records,
    which name their job, show that the folder holds this job's parts alone."""
    out = check_output(out, "--out", kind="folder")
    path = out / MANIFEST
    doc = None
    if path.is_file():
        try:
            _, doc = read_json_file(path, "parts manifest", PARTS_FORMAT)
        except DataError as err:
            finished_parts(out, job, verify=False)  # DataError for another job's records
            logger.warning("%s; made again from the part records", err)
        else:
            check_manifest(out, doc, job)
    if doc is None:
        entries = list(out.iterdir()) if out.is_dir() and not path.is_file() else []
        strays = [p.name for p in entries  # the lock is this job's own (training.runlock)
                  if not is_temporary_name(p.name) and p.name != LOCK_FILE]  # fmt: skip
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
