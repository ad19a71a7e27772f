"""What a folder of parts records about its job: names, the input and model records, the job
itself, and what a chunk and a run give back."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smiexlm.errors import DataError
from smiexlm.parts.reading import MANIFEST, PARTS_FORMAT
from smiexlm.paths import file_sha256
from smiexlm.training.ranks import detect

PART_FORMAT = "smiexlm-part/1"
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
    if part_rows is not None and (isinstance(part_rows, bool) or not isinstance(part_rows, int)
                                  or part_rows < 1):  # fmt: skip
        raise DataError(f"--part-rows {part_rows!r}: expected a positive integer")
    parts = is_parts_output(out)
    if part_rows is not None and not parts:
        raise DataError(
            f"--part-rows {part_rows}: --out {str(out)!r} is a file name; expected a folder "
            "name (no suffix) to hold the parts"
        )
    world = detect().world_size
    if not parts and world > 1:
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
    from smiexlm.modelio.integrity import read_checksums

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
MakeProcess = Callable[[], Process]  # builds one, in the process that runs it (a Ray actor)


@dataclass
class PartsResult:
    out: Path
    manifest: dict[str, Any]
    parts_written: int  # by this process in this run
    parts_resumed: int  # finished before this run started (and found whole)
    parts_damaged: dict[int, str] = field(default_factory=dict)  # index -> what was wrong

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
            + (f", {len(self.parts_damaged)} damaged written again" if self.parts_damaged else "")
        )
        return (
            f"{m['n_rows']:,} rows in {m['n_parts']} parts of {m['part_rows']:,} in "
            f"{self.out} ({done}), {m['n_failed']:,} failed (listed in {self.out / REJECTS})"
        )
