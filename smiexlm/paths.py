"""Where smiexlm finds data and caches.

``SMIEXLM_DATA`` points at a folder laid out like the project's shared data
(``moleculenet/``, ``pretrain/``, ``glue/``, ``text/``). ``SMIEXLM_CACHE`` (default
``~/.cache/smiexlm``) holds downloads made when online.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from smiexlm.atomic import atomic_path, same_place, write_text_atomic
from smiexlm.errors import DataError

log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent
ASSETS_DIR = PACKAGE_DIR / "assets"
VOCAB_NAME = "vocab.json"  # the tokenizer file of a model folder or a dataset


REJECTS_HEADER = ("row", "smiles", "reason")  # every batch job's list of bad input rows
# what finetune, benchmark and baseline write into their --out (moleculenet.report)
REPORT_FILES = ("results.csv", "report.md", "runs.md", "results.json", "report.png")


def write_rejects(rejects, path: str | Path) -> None:
    """``rejects`` (``(row, smiles, reason)`` each) as the CSV in which every batch job lists
    its bad input rows (the header alone when there are none); ``path``: a temporary name of
    the caller's atomic write."""
    import pandas as pd

    pd.DataFrame(list(rejects), columns=list(REJECTS_HEADER)).to_csv(path, index=False)


def rejects_beside(out: str | Path) -> Path:
    """Where a one-file job lists its bad rows: ``emb.parquet`` -> ``emb.rejects.csv``."""
    out = Path(out)
    return out.with_name(out.stem + ".rejects.csv")


def ids_beside(out: str | Path) -> Path:
    """Where a ``.npy`` output keeps its id columns: ``emb.npy`` -> ``emb.ids.csv``."""
    return Path(out).with_suffix(".ids.csv")


def data_dir(required: bool = True) -> Path | None:
    """The folder named by ``SMIEXLM_DATA``, or None when it is unset and not required."""
    value = os.environ.get("SMIEXLM_DATA")
    if not value:
        if required:
            raise DataError(
                "SMIEXLM_DATA is not set: expected the path of a data folder "
                "(moleculenet/, pretrain/, glue/, text/)"
            )
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DataError(f"SMIEXLM_DATA={value!r}: expected an existing directory")
    return path


def cache_dir() -> Path:
    """The cache folder (``SMIEXLM_CACHE``, default ``~/.cache/smiexlm``); not made here:
    :func:`keep_in_cache` makes what it writes."""
    return Path(os.environ.get("SMIEXLM_CACHE", Path.home() / ".cache" / "smiexlm")).expanduser()


_CACHE_REFUSED: set[str] = set()  # cache folders this process has said it cannot write


def keep_in_cache(path: Path, write: Callable[[Path], None]) -> bool:
    """Write a cache file atomically (``write`` fills the temporary name it is given); False
    when the operating system refuses (``SMIEXLM_CACHE`` names a file, a read-only home, a
    full disk). A cache only saves time: the caller goes on with what it computed, and the
    refusal is said once per cache folder on stderr."""
    try:
        with atomic_path(path) as tmp:
            write(tmp)
    except OSError as err:
        folder = str(cache_dir())
        if folder not in _CACHE_REFUSED:
            _CACHE_REFUSED.add(folder)
            why = err.strerror or str(err)
            log.warning("cache %r cannot be written (%s at %r): going on without it; set "
                        "SMIEXLM_CACHE to a writable folder to keep results for the next run",
                        folder, why, err.filename or str(path))  # fmt: skip
        return False
    return True


def check_input_file(path: str | Path, what: str = "input") -> Path:
    """``path`` when it is an existing file; DataError saying it is missing or a directory."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{what} {str(path)!r} is a directory: expected a file")
    if not path.is_file():
        raise DataError(f"{what} {str(path)!r} does not exist")
    return path


def check_not_a_file(path: str | Path, what: str = "checkpoint") -> Path:
    """``path`` unless it names a file where a model folder is expected: DataError naming the
    folder that holds the file (``-c dir/model.safetensors`` for ``-c dir``)."""
    path = Path(path).expanduser()
    if path.is_file():
        raise DataError(
            f"{what} {str(path)!r} is a file: expected a model folder (that file is in the "
            f"folder {str(path.parent)!r})"
        )
    return path


def check_output(
    path: str | Path, what: str = "--out", kind: Literal["file", "folder"] = "file"
) -> Path:
    """``path`` when a ``kind`` can be written there; DataError naming ``what`` otherwise.

    Called before any compute, so that a run cannot fail at its end for want of a place to
    write: ``path`` must not exist as the other kind, and the nearest existing folder on
    the way to it must be a writable folder (not a file).
    """
    path = Path(path).expanduser()
    if kind == "file" and path.is_dir():
        raise DataError(f"{what} {str(path)!r} is a directory: expected a file name")
    if kind == "folder" and path.exists() and not path.is_dir():
        raise DataError(f"{what} {str(path)!r} is a file: expected a folder")
    if path.exists() and not (path.is_file() or path.is_dir()):
        raise DataError(f"{what} {str(path)!r} is not a regular file (a device, a FIFO or a "
                        "socket): expected a file name")  # fmt: skip
    check_writable(path, what)
    return path


def check_writable(path: Path, what: str) -> None:
    """DataError naming ``what`` unless the nearest existing folder on the way to ``path`` is
    a folder (not a file) in which a file can be made: a file or a folder, ``path`` can then
    be written (every command's outputs are checked so before any compute)."""
    path = Path(path).expanduser()
    folder = path if path.is_dir() else path.parent
    while not os.path.lexists(folder) and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise DataError(f"{what} {str(path)!r}: {str(folder)!r} is a file, expected a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise DataError(f"{what} {str(path)!r}: folder {str(folder)!r} is not writable")
    _probe_writable(folder, what, path)


def _probe_writable(folder: Path, what: str, path: Path) -> None:
    """Make and remove a file in ``folder``: the modes say nothing to root, nor of a
    read-only or pseudo file system (``/proc``, ``/sys``), where only a write tells."""
    import tempfile

    try:
        handle, probe = tempfile.mkstemp(prefix=f".{path.name}.tmp-probe-", dir=folder)
    except OSError as err:
        raise DataError(f"{what} {str(path)!r}: nothing can be written in folder "
                        f"{str(folder)!r} ({err.strerror})") from None  # fmt: skip
    os.close(handle)
    os.unlink(probe)


def named_paths(value: Any) -> list[Path]:
    """The paths an option's value names: one path, or each of a list of them."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [Path(v).expanduser() for v in values if isinstance(v, (str, Path))]


def check_outputs_apart(outputs: dict[str, Any], inputs: dict[str, Any]) -> None:
    """DataError when an output (option name -> path, or list of paths) names one of the
    inputs: the file itself, a link to it or a hard link of it. Writing there would replace
    the input with the result (``predict --input t.csv --out t.csv``), so every command
    checks this before any compute."""
    for out_name, out_value in outputs.items():
        for out in named_paths(out_value):
            for in_name, in_value in inputs.items():
                for source in named_paths(in_value):
                    if same_place(out, source):
                        raise DataError(
                            f"{out_name} {str(out)!r} is the input {in_name} {str(source)!r}"
                            f"{'' if out == source else ' (the same file by a link)'}: the "
                            "result would replace it; expected another path"
                        )


def side_outputs(outputs: dict[str, Any]) -> dict[str, list[Path]]:
    """What a one-file job may write beside each output file (option name -> path, or list of
    paths) of ``outputs``: its rejects list (:func:`rejects_beside`) and a ``.npy``'s ids
    (``emb.ids.csv``), each a path an input must not be either."""
    found = {}
    for name, value in outputs.items():
        files = [p for p in named_paths(value) if p.suffix]
        if files:
            found[f"{name} side file"] = [
                side for p in files for side in (rejects_beside(p), ids_beside(p))
            ]
    return found


def check_inputs_outside(folders: dict[str, Any], inputs: dict[str, Any]) -> None:
    """DataError when an input (option name -> path, or list of paths) lies inside one of the
    output ``folders`` a job owns (a parts folder, a preprocessed dataset), which it fills
    with files of its own names and clears of what an unfinished run left: the input could be
    written over or removed."""
    for out_name, out_value in folders.items():
        for out in named_paths(out_value):
            folder = out.resolve()
            for in_name, in_value in inputs.items():
                for source in named_paths(in_value):
                    if source.exists() and source.resolve().is_relative_to(folder):
                        raise DataError(
                            f"the input {in_name} {str(source)!r} lies inside {out_name} "
                            f"{str(out)!r}, a folder the job fills with files of its own: it "
                            "could be written over; expected an input outside it"
                        )


def check_outputs_outside(outputs: dict[str, Any], inputs: dict[str, Any]) -> None:
    """DataError when an output (option name -> path, or list of paths), existing or not
    yet, lies inside an input that is an existing folder (a model, dataset, run or parts
    folder), links resolved on both sides. Writing there would change that input: ``predict
    --checkpoint M --out M/model.safetensors`` replaces the weights, ``--out M/seed3`` adds a
    seed to an ensemble, ``select PARTS --out PARTS/manifest.json`` replaces the parts'
    record. An input named as ``.`` (or ``..``) is that folder all the same: a default
    output such as ``predictions.csv`` would land in it. Every command checks this before
    any compute; inputs that are not folders (files, shipped models' names) are skipped."""
    for in_name, in_value in inputs.items():
        for source in named_paths(in_value):
            if not source.is_dir():
                continue
            folder = source.resolve()
            for out_name, out_value in outputs.items():
                for out in named_paths(out_value):
                    if out.resolve().is_relative_to(folder):
                        raise DataError(
                            f"{out_name} {str(out)!r} lies inside the input {in_name} "
                            f"{str(source)!r} (a folder): writing there would change that "
                            "input; expected a path outside it"
                        )


def read_json_file(
    path: str | Path, what: str, expected_format: str | None = None
) -> tuple[Path, dict[str, Any]]:
    """``(path, document)`` of a JSON file; a folder means its ``vocab.json``.

    ``what`` names the file in errors ("vocabulary file"); a missing or malformed file, or a
    ``format`` other than ``expected_format``, raises DataError."""
    path = Path(path)
    if path.is_dir():
        path = path / VOCAB_NAME
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{what} {str(path)!r} does not exist") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{what} {str(path)!r} is not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise DataError(f"{what} {str(path)!r}: expected a JSON object")
    if expected_format is not None and doc.get("format") != expected_format:
        raise DataError(
            f"{what} {str(path)!r} has format {doc.get('format')!r}: expected {expected_format!r}"
        )
    return path, doc


def json_safe(value: Any) -> Any:
    """JSON-safe values: NaN/inf become null, Paths become strings, tuples become lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def write_json(doc: dict[str, Any], path: str | Path) -> Path:
    """Write ``doc`` (made JSON-safe) as indented UTF-8 JSON, atomically, creating the parent
    folder."""
    return write_text_atomic(path, json.dumps(json_safe(doc), indent=1) + "\n")


def file_sha256(path: Path, each_block: Callable[[bytes], None] | None = None) -> str:
    """sha256 of a file (of ``data.mdb`` for an LMDB folder): the package's one file hasher.

    The file is read in 4 MiB blocks, each also given to ``each_block`` when set, so that a
    caller can learn something else about the file on the same pass. DataError if it cannot
    be read."""
    target = path / "data.mdb" if path.is_dir() else path
    digest = hashlib.sha256()
    try:
        with open(target, "rb") as handle:
            while block := handle.read(1 << 22):
                digest.update(block)
                if each_block is not None:
                    each_block(block)
    except OSError as err:
        raise DataError(f"input {str(path)!r} cannot be read: {err.strerror or err}") from None
    return digest.hexdigest()


def file_record(path: Path) -> dict[str, Any]:
    """``{"bytes": size, "sha256": digest}`` of a file: what an output records of each of its
    files when it is written, for :func:`file_problem` to check when it is read back."""
    return {"bytes": Path(path).stat().st_size, "sha256": file_sha256(Path(path))}


def file_problem(path: Path, record: Any) -> str | None:
    """What is wrong with ``path`` against the :func:`file_record` written with it (missing,
    another size, another sha256, or no record at all), or None when it matches. The size is
    compared first, so that a truncated file is told apart without reading it."""
    path = Path(path)
    if not isinstance(record, dict) or not isinstance(record.get("sha256"), str):
        return "has no recorded sha256 (written by an older smiexlm)"
    if not path.is_file():
        return "is missing"
    size, written = path.stat().st_size, record.get("bytes")
    if size != written:
        written = f"{written:,}" if isinstance(written, int) else repr(written)
        return f"has {size:,} bytes where {written} were written (truncated or replaced)"
    digest = file_sha256(path)
    if digest != record["sha256"]:
        return f"has sha256 {digest[:12]}… where {record['sha256'][:12]}… was written (damaged)"
    return None
