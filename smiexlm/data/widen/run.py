"""Widening a SMILES file: parts in a work folder, then one gzipped SMILES file.

``widen(IN, OUT)`` reads any file :mod:`smiexlm.data.readers` reads and writes

- ``OUT`` (``.smi.gz``): one ``SMILES provenance`` line per molecule, each original (named by
  its input line) followed by its products (``LINE.STEP``), interleaved, so a product sits
  beside the molecule it came from; ``smiexlm preprocess`` reads it as it is and
  deduplicates across molecules;
- ``OUT`` with ``.rejects.csv.gz`` for ``.smi.gz``: ``line,step,smiles,reason`` for each bad
  or evaluation input row (step ``input``) and each product dropped after it was made;
- ``OUT`` with ``.report.json``: the settings, the input's sha256 and the counts per step.

The input is cut into parts of ``part_size`` rows. A part is also the BRICS step's pool of
fragments, so the products depend on ``part_size`` as on the seed. Each finished part is
committed in the work folder ``.NAME.parts`` beside ``OUT`` (its SMILES, its rejects, then
its record with their sha256), so an interrupted run, run again with the same input and
settings, skips the parts it finished; run with others, it says which and starts over. The
three outputs are renamed into place together at the end: a half-written ``OUT`` never
exists.
"""

from __future__ import annotations

import gzip
import logging
import shutil
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from smiexlm.atomic import atomic_paths
from smiexlm.data.readers import detect_format, read_chunks, split_smiles_line
from smiexlm.data.widen.steps import BlockResult, StepCounts, WidenConfig, Widener
from smiexlm.errors import DataError
from smiexlm.paths import check_output, file_problem, file_record, read_json_file, write_json

log = logging.getLogger(__name__)

REPORT_FORMAT = "smiexlm-widen-report/1"


@dataclass(frozen=True)
class WidenPaths:
    """Where a run writes: OUT, its rejects, its report and its work folder."""

    out: Path
    rejects: Path
    report: Path
    work: Path

    @classmethod
    def beside(cls, out: Path) -> WidenPaths:
        if not out.name.endswith(".smi.gz"):
            raise DataError(f"OUT {str(out)!r}: expected a file name ending in .smi.gz")
        stem = out.name.removesuffix(".smi.gz")
        return cls(out, out.with_name(f"{stem}.rejects.csv.gz"),
                   out.with_name(f"{stem}.report.json"), out.with_name(f".{stem}.parts"))  # fmt: skip


def _blocks(path: Path, smiles_col: str | None, part_size: int, limit: int | None):
    """Blocks of ``(line, SMILES)``: the file's own line (a table's row as its line in the
    file), bytes that are not UTF-8 kept as lone surrogates for the widener to reject."""
    rows = (
        (line, split_smiles_line(item.decode("utf-8", "surrogateescape"))[0]
         if isinstance(item, bytes) else (item or "").strip())
        for lines, items in read_chunks(path, 4096, smiles_col)
        for line, item in zip(lines, items, strict=True)
    )  # fmt: skip
    rows = islice(rows, limit) if limit is not None else rows
    while block := list(islice(rows, part_size)):
        yield block


def _job(path: Path, config: WidenConfig, part_size: int, limit: int | None, excluded) -> dict:
    return {"input": file_record(path), "config": config.to_dict(), "part_size": part_size,
            "max_molecules": limit, "exclusion_keys": len(excluded)}  # fmt: skip


def _prepare_work(paths: WidenPaths, job: dict[str, Any]) -> bool:
    """Make the work folder for ``job``; True when an earlier run of the same job is there."""
    record = paths.work / "job.json"
    if record.is_file():
        _, there = read_json_file(record, "widen job record")
        if there == job:
            return True
        changed = sorted(k for k in set(job) | set(there) if job.get(k) != there.get(k))
        log.warning("the finished parts in %s were made with other %s: starting over",
                    paths.work, ", ".join(changed))  # fmt: skip
        shutil.rmtree(paths.work)  # another input or other settings: its parts are not ours
    paths.work.mkdir(parents=True, exist_ok=True)
    write_json(job, record)
    return False


def _part_done(paths: WidenPaths, index: int) -> dict[str, Any] | None:
    record = paths.work / f"part-{index:05d}.json"
    if not record.is_file():
        return None
    _, doc = read_json_file(record, "widen part record")
    for name in ("smiles", "rejects"):
        if file_problem(paths.work / doc["files"][name]["name"], doc["files"][name]) is not None:
            return None
    return doc


def _write_part(paths: WidenPaths, index: int, block: BlockResult) -> dict[str, Any]:
    import json

    names = {"smiles": f"part-{index:05d}.smi.gz", "rejects": f"part-{index:05d}.rejects.csv.gz"}
    smiles = "".join(f"{s} {name}\n" for s, name in block.lines)
    rejects = "".join(_csv_row(row) for row in block.rejects)
    doc = {"part": index, "inputs": block.inputs, "originals": block.originals,
           "rejected": len([r for r in block.rejects if r[1] == "input"]),
           "steps": {k: v.to_dict() for k, v in block.steps.items()}}  # fmt: skip
    with atomic_paths(*(paths.work / n for n in names.values())) as (tmp_smiles, tmp_rejects):
        tmp_smiles.write_bytes(gzip.compress(smiles.encode(), mtime=0))
        # a line that was not UTF-8 is listed with its bytes shown as \udcXX escapes
        tmp_rejects.write_bytes(gzip.compress(rejects.encode("utf-8", "backslashreplace"),
                                              mtime=0))  # fmt: skip
    doc["files"] = {key: {"name": n, **file_record(paths.work / n)} for key, n in names.items()}
    with atomic_paths(paths.work / f"part-{index:05d}.json") as (tmp,):
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def _csv_row(row: tuple) -> str:
    import csv
    import io

    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(row)
    return buffer.getvalue()


def widen(
    path: Path,
    out: Path,
    config: WidenConfig,
    excluded: frozenset[str],
    tokens: frozenset[str],
    smiles_col: str | None = None,
    max_molecules: int | None = None,
    part_size: int = 5000,
    progress: bool = True,
) -> dict[str, Any]:
    """Widen the molecules of ``path`` into ``out`` (see the module doc); the report."""
    from tqdm import tqdm

    paths = check_arguments(path, out, part_size, max_molecules)
    job = _job(Path(path), config, part_size, max_molecules, excluded)
    resumed = _prepare_work(paths, job)
    widener, started, docs = Widener(config, tokens, excluded), time.time(), []
    bar = tqdm(desc="widen", unit=" molecules", disable=not progress, total=max_molecules)
    for index, block in enumerate(_blocks(Path(path), smiles_col, part_size, max_molecules)):
        doc = _part_done(paths, index)
        if doc is None:
            doc = _write_part(paths, index, widener.widen_block(block))
        docs.append(doc)
        bar.update(len(block))
    bar.close()
    if not docs:
        raise DataError(f"input {str(path)!r} has no rows: expected at least one SMILES")
    report = _report(paths, job, docs, resumed, time.time() - started)
    _assemble(paths, docs, report)
    shutil.rmtree(paths.work, ignore_errors=True)
    return report


def check_arguments(path: Path, out: Path, part_size: int,
                    max_molecules: int | None) -> WidenPaths:  # fmt: skip
    """Where a run of ``path`` into ``out`` writes; DataError, before any work, for an input
    that cannot be read, an output that cannot be written or a size below 1."""
    paths = WidenPaths.beside(Path(out))
    check_output(paths.out, "OUT")
    detect_format(Path(path))  # a missing file, a folder, a suffix no reader knows
    if part_size < 1 or (max_molecules is not None and max_molecules < 1):
        raise DataError(f"part_size {part_size} / max_molecules {max_molecules}: expected >= 1")
    return paths


def _report(paths: WidenPaths, job: dict, docs: list[dict], resumed: bool, seconds: float):
    steps: dict[str, StepCounts] = {}
    for doc in docs:
        for name, counts in doc["steps"].items():
            steps.setdefault(name, StepCounts()).add(_counts(counts))
    written = sum(doc["originals"] for doc in docs)
    products = sum(c.written for c in steps.values())
    return {"format": REPORT_FORMAT, **job, "output": str(paths.out), "resumed": resumed,
            "seconds": round(seconds, 1), "inputs": sum(d["inputs"] for d in docs),
            "rejected_inputs": sum(d["rejected"] for d in docs), "originals_written": written,
            "products_written": products, "lines_written": written + products,
            "steps": {name: c.to_dict() for name, c in steps.items()}}  # fmt: skip


def _counts(doc: dict[str, Any]) -> StepCounts:
    from collections import Counter

    return StepCounts(doc["made"], doc["written"], doc["duplicate"], doc["excluded"],
                      Counter(doc["failed"]), Counter(doc["skipped"]))  # fmt: skip


def _assemble(paths: WidenPaths, docs: list[dict], report: dict[str, Any]) -> None:
    """OUT, its rejects and its report, renamed into place together."""
    import json

    header = gzip.compress(b"line,step,smiles,reason\n", mtime=0)
    with atomic_paths(paths.out, paths.rejects, paths.report) as (smiles, rejects, doc):
        with open(smiles, "wb") as out_smiles, open(rejects, "wb") as out_rejects:
            out_rejects.write(header)
            for part in docs:  # gzip members concatenated are one gzip stream
                out_smiles.write((paths.work / part["files"]["smiles"]["name"]).read_bytes())
                out_rejects.write((paths.work / part["files"]["rejects"]["name"]).read_bytes())
        doc.write_text(json.dumps(report, indent=1) + "\n")
