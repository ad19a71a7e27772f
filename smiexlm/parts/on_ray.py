"""Parts folders written on a Ray cluster (``smiexlm embed|predict INPUT --out PARTS --ray
ADDRESS``): the engine under :mod:`smiexlm.embedding.on_ray` and :mod:`smiexlm.serving.on_ray`.

``ADDRESS`` is ``local`` (a cluster of this machine, started for the run), ``auto`` (the
cluster this machine belongs to, as ``ray start`` left it) or ``HOST:PORT`` of a head. The
input (one file, a folder, or a glob of CSV, TSV, Parquet or SMILES files, all of one kind)
is read with Ray Data in blocks, in order, and never held whole by one process. The driver
cuts the rows into parts of ``--part-rows`` and hands each unfinished part to one of the
cluster's part writers, one actor a CPU, which builds the job's chunk processor once (embed
loads its model there; predict reads its folders again at each chunk, about 0.3 s) and
writes the part and its record straight into the folder
(which every node must see: a shared file system), each under a temporary name until whole.
The folder is the one a run without Ray writes (manifest, part records with sha256,
``rejects.csv``): ``read_parts``, ``select``, ``search`` and a resume, on Ray or not, work on
it unchanged, and since the served outputs do not depend on the batch a molecule sits in,
its table is bitwise the one-process table. An actor whose process dies is started again by
Ray and its part written again (:class:`_Writers` says how often, and what stops a run).

Ray is an optional extra: ``pip install 'smiexlm[ray]'``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from itertools import chain
from pathlib import Path
from typing import Any

from smiexlm.data.readers import (
    detect_format,
    kept_arrow_type,
    parquet_header,
    smiles_column,
    split_smiles_line,
    table_header,
)
from smiexlm.errors import DataError, SmiexlmError, first_line
from smiexlm.parts.job import MakeProcess, PartsJob, PartsResult, input_record

INSTALL = "pip install 'smiexlm[ray]'"
RESTARTS = 3  # a writer whose process dies is started again, with its part, this many times
NODE_CHECK_S = 10.0  # how often the driver, waiting for a part, checks the cluster's nodes


def import_ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError:
        raise DataError(f"--ray needs Ray, which is not installed: {INSTALL}") from None
    return ray


def connect(address: str) -> None:
    """Join (``auto``, ``HOST:PORT``) or start (``local``) the Ray cluster; a DataError
    naming ``address`` when no cluster answers there."""
    ray = import_ray()
    if ray.is_initialized():
        return
    quiet = {"log_to_driver": False, "include_dashboard": False, "configure_logging": False}
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address not in ("local", "auto"):
        _check_reachable(address)  # Ray itself would wait for the head without end
    try:
        ray.init(**quiet) if address == "local" else ray.init(address=address, **quiet)
    except Exception as err:  # ConnectionError, a timeout, a malformed address...
        raise DataError(f"--ray {address!r}: no Ray cluster answers there "
                        f"({first_line(err, 200)}); "
                        "expected local, auto or the HOST:PORT of a head started with "
                        "`ray start --head`") from None  # fmt: skip


def _check_reachable(address: str, seconds: float = 10.0) -> None:
    """DataError unless something accepts a TCP connection at ``HOST:PORT``."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise DataError(f"--ray {address!r}: expected local, auto or HOST:PORT of a Ray head")
    try:
        with socket.create_connection((host, int(port)), timeout=seconds):
            return
    except OSError as err:
        raise DataError(f"--ray {address!r}: no Ray head answers there ({err.strerror or err}); "
                        "expected the HOST:PORT of a head started with `ray start --head`") from None  # fmt: skip


def input_paths(spec: Path | str) -> list[Path]:
    """The files of ``spec``: itself, a folder's files (hidden ones left out) or a glob's
    matches, sorted; a DataError when none, or when their kinds differ."""
    text = str(spec)
    if any(c in text for c in "*?["):
        paths = [Path(p) for p in sorted(glob.glob(text)) if Path(p).is_file()]
    elif Path(text).is_dir():
        paths = sorted(
            p for p in Path(text).iterdir() if p.is_file() and not p.name.startswith(".")
        )
    else:
        paths = [Path(text)]
    if not paths:
        raise DataError(f"input {text!r} matches no file: expected a file, a folder or a glob "
                        "of CSV, TSV, Parquet or SMILES files")  # fmt: skip
    kinds = {detect_format(p, "input", lmdb=False) for p in paths}
    if len(kinds) > 1:
        raise DataError(f"input {text!r} mixes {sorted(kinds)} files: expected one kind")
    if len({p.suffix == ".gz" for p in paths}) > 1:
        raise DataError(f"input {text!r} mixes gzip-compressed and plain files: expected all "
                        "of them compressed or none")  # fmt: skip
    # the cluster's processes read them: each in its own working folder, perhaps another node
    return [p.resolve() for p in paths]


def inputs_record(paths: list[Path]) -> dict[str, Any]:
    """What a parts folder records of its input: the file's own record (so that a run on Ray
    and one without resume each other), or, for several, each file's and one digest."""
    if len(paths) == 1:
        return input_record(paths[0])
    files = [input_record(p) for p in paths]
    digest = hashlib.sha256(json.dumps([f["sha256"] for f in files]).encode()).hexdigest()
    return {"path": str(Path(paths[0]).parent.resolve()), "sha256": digest,
            "bytes": sum(f["bytes"] for f in files), "files": files}  # fmt: skip


def read_dataset(paths: list[Path], smiles_col: str) -> Any:
    """A Ray Data dataset of the rows of ``paths``, in order, typed as ``smiexlm embed``
    reads them: table cells as text (empty cells as empty text), ``.smi`` lines as
    ``smiles`` and ``name``."""
    import_ray()
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.fs
    import ray.data

    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False  # the run's own bar counts the molecules
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    kind = detect_format(paths[0], "input", lmdb=False)
    files = [str(p) for p in paths]
    # reading claims no CPU: the part writers hold one each, and would starve it otherwise
    free = {"num_cpus": 0, "filesystem": pyarrow.fs.LocalFileSystem()}  # the files are local
    gz = {"arrow_open_stream_args": {"compression": "gzip"}} if files[0].endswith(".gz") else {}
    if kind == "parquet":
        smiles_column(parquet_header(paths[0]), smiles_col, paths[0], "input")
        return ray.data.read_parquet(files, **free)
    if kind == "smi":
        from smiexlm.parts.ray_smi import SmiLines

        lines = SmiLines(files, filesystem=free["filesystem"],
                         open_stream_args=gz.get("arrow_open_stream_args"))  # fmt: skip
        return ray.data.read_datasource(lines, num_cpus=0).map_batches(
            _smi_rows, batch_format="pandas", fn_kwargs={"smiles_col": smiles_col}, num_cpus=0
        )
    sep = "\t" if kind == "tsv" else ","
    header = table_header(paths[0], sep)
    smiles_column(header, smiles_col, paths[0], "input")
    convert = pacsv.ConvertOptions(column_types=dict.fromkeys(header, pa.string()),
                                   strings_can_be_null=False)  # fmt: skip
    return ray.data.read_csv(files, parse_options=pacsv.ParseOptions(delimiter=sep),
                             convert_options=convert, **gz, **free)  # fmt: skip


def _smi_rows(batch: Any, smiles_col: str) -> Any:
    import pandas as pd

    rows = [split_smiles_line(line) for line in batch["text"]]
    rows = [row for row in rows if row[0]]
    return pd.DataFrame({smiles_col: [r[0] for r in rows], "name": [r[1] for r in rows]})


def ray_input(input: Path | str, address: str, smiles_col: str,
              chunk_rows: int) -> tuple[list[Path], Any, Iterator[Any]]:  # fmt: skip
    """The files of ``input``, its first chunk of rows (a DataFrame) and every chunk (the
    first among them), read on the cluster at ``address``, which is joined first."""
    paths = input_paths(input)
    connect(address)
    batches = read_dataset(paths, smiles_col).iter_batches(batch_size=chunk_rows,
                                                           batch_format="pyarrow")  # fmt: skip
    chunks = _frames(str(input), batches)
    first = next(chunks, None)
    if first is None:
        raise DataError(f"input {str(input)!r} has no rows: expected at least one SMILES")
    return paths, first, chain([first], chunks)


def _frames(input: str, batches: Iterator[Any]) -> Iterator[Any]:
    """The batches as DataFrames, typed as a run without Ray reads them (Arrow's own
    conversion, not Ray's; Ray may hand out empty blocks); a file Ray Data cannot read (a
    ragged row, bytes that are not UTF-8) is a DataError naming the input."""
    try:
        for batch in batches:
            if batch.num_rows:
                yield batch.to_pandas(types_mapper=kept_arrow_type)
    except SmiexlmError:
        raise
    except Exception as err:  # Arrow's and the codecs' errors, as Ray's task errors
        cause = getattr(err, "cause", None) or err
        raise DataError(f"input {input!r} cannot be read ({type(cause).__name__}: "
                        f"{first_line(cause, 300)}); "
                        "expected CSV, TSV, Parquet or SMILES files in UTF-8 with one row a "
                        "line") from None  # fmt: skip


class PartWriter:
    """One CPU of the cluster writing parts of a job (a Ray actor). Its chunk processor (the
    model) is built at its first part, so that an error there is the part's, said in one
    line, not the actor's death."""

    def __init__(self, make_process: MakeProcess):
        import torch

        torch.set_num_threads(1)
        self.make_process, self.process = make_process, None
        self.where = f"{socket.gethostname()}:{os.getpid()}"

    def write(self, out: str, job: PartsJob, index: int, frames: list[Any]) -> dict[str, Any]:
        from smiexlm.parts.writing import write_part
        from smiexlm.training.workers import peak_rss_mib

        started = time.time()
        if self.process is None:
            self.process = self.make_process()
        rows = write_part(Path(out), job, index, ((index, None, f) for f in frames), self.process,
                          rank=0, bar=None)  # fmt: skip
        return {"part": index, "rows": rows, "worker": self.where,
                "seconds": round(time.time() - started, 2),
                "peak_rss_mib": round(peak_rss_mib(), 1)}  # fmt: skip


def run_parts_on_ray(job: PartsJob, out: Path, chunks: Iterator[Any], make_process: MakeProcess,
                     *, progress: bool = True, desc: str = "parts (ray)") -> PartsResult:  # fmt: skip
    """Write the parts of ``job`` not yet finished in ``out`` from the input's ``chunks``
    (:func:`ray_input`), on the cluster already joined; the same call resumes."""
    from smiexlm.parts.reading import MANIFEST, PARTS_FORMAT
    from smiexlm.parts.resume import finished_parts, prepare_folder
    from smiexlm.parts.writing import finish_job
    from smiexlm.paths import read_json_file
    from smiexlm.training.workers import detect

    started, out = time.time(), Path(out).resolve()  # the writers' working folders differ
    manifest = prepare_folder(out, job, detect())
    done, damaged = finished_parts(out, job)
    if manifest.get("complete") and len(done) == manifest.get("n_parts"):
        return PartsResult(out, manifest, 0, len(done))
    stats, n_rows = _write_parts(out, job, chunks, done, make_process, _bar(progress, desc))
    finish_job(out, job, n_rows, stats, time.time() - started, len(done))
    _, manifest = read_json_file(out / MANIFEST, "parts manifest", PARTS_FORMAT)
    return PartsResult(out, manifest, sum(len(s["parts"]) for s in stats), len(done), damaged)


def _write_parts(out: Path, job: PartsJob, chunks: Iterator[Any], done: dict,
                 make_process: MakeProcess, bar: Any) -> tuple[list[dict], int]:  # fmt: skip
    """Every unfinished part handed to the cluster's writers, one a writer at a time, as the
    input streams in; (one stats record a writer, input rows)."""
    from itertools import groupby

    from smiexlm.parts.writing import Slicer

    writers = _Writers(out, job, make_process)
    slicer, results = Slicer(chunks, job.part_rows), []
    for index, pieces in groupby(slicer, key=lambda piece: piece[0]):
        frames = [frame for _, _, frame in pieces]
        if index in done:
            continue
        while not writers.idle:
            results.append(writers.take(bar))
        writers.submit(index, frames)
    while writers.running:
        results.append(writers.take(bar))
    if bar is not None:
        bar.close()
    by_worker: dict[str, dict[str, Any]] = {}
    for r in sorted(results, key=lambda r: r["part"]):
        w = by_worker.setdefault(r["worker"], {"rank": len(by_worker), "worker": r["worker"],
                                               "parts": [], "rows": 0, "seconds": 0.0})  # fmt: skip
        w["parts"].append(r["part"])
        w["rows"] += r["rows"]
        w["seconds"] = round(w["seconds"] + r["seconds"], 2)
        w["peak_rss_mib"] = max(w.get("peak_rss_mib", 0.0), r["peak_rss_mib"])
    return list(by_worker.values()) or [{"rank": 0, "parts": [], "rows": 0}], slicer.n_rows


class _Writers:
    """The part writers, one a CPU free when the run starts (a shared cluster's busy CPUs
    are left to their jobs), and the parts they write. Ray starts a writer whose process
    died again and gives it its part again, :data:`RESTARTS` times; past that, an error
    raised in a writer, or a node that leaves the cluster, stops the run in one line (the
    finished parts are kept, and the same command resumes)."""

    def __init__(self, out: Path, job: PartsJob, make_process: MakeProcess):
        self.ray, self.out, self.job = import_ray(), str(out), job
        n = max(1, int(self._free_cpus()))
        actor = self.ray.remote(num_cpus=1, max_restarts=RESTARTS,
                                max_task_retries=RESTARTS)(PartWriter)  # fmt: skip
        self.idle = [actor.remote(make_process) for _ in range(n)]
        self.running: dict[Any, tuple[Any, int]] = {}  # a part's future: (writer, part)
        self.nodes = self._alive()

    def submit(self, index: int, frames: list[Any]) -> None:
        writer = self.idle.pop()
        self.running[writer.write.remote(self.out, self.job, index, frames)] = (writer, index)

    def take(self, bar: Any) -> dict[str, Any]:
        """The next part written (waiting for it, and watching the nodes meanwhile)."""
        ready: list[Any] = []
        while not ready:
            ready, _ = self.ray.wait(list(self.running), num_returns=1, timeout=NODE_CHECK_S)
            self._check_nodes()
        writer, index = self.running.pop(ready[0])
        try:
            result = self.ray.get(ready[0])
        except self.ray.exceptions.RayTaskError as err:  # the writer raised: say what
            cause = getattr(err, "cause", None)
            if isinstance(cause, SmiexlmError):
                raise cause from None
            raise DataError(f"part {index}: {type(cause).__name__}: {cause}") from None
        except self.ray.exceptions.RayActorError:  # its process died, RESTARTS + 1 times
            self._check_nodes()
            raise DataError(f"part {index}: its writer died {RESTARTS + 1} times (killed, or "
                            "out of memory: try a smaller --part-rows); the finished parts are "
                            "kept: run the same command again to resume") from None  # fmt: skip
        self.idle.append(writer)
        if bar is not None:
            bar.update(result["rows"])
        return result

    def _free_cpus(self, settle_s: float = 10.0) -> float:
        """The cluster's free CPUs, once those of a job that just ended are back (a few
        seconds at most: a shared cluster's busy CPUs are not waited for longer)."""
        total, deadline = self.ray.cluster_resources().get("CPU", 1.0), time.time() + settle_s
        while (free := self.ray.available_resources().get("CPU", 0.0)) < total:
            if time.time() > deadline:
                break
            time.sleep(0.25)
        return free

    def _alive(self) -> dict[str, str]:
        return {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in self.ray.nodes()
                if n.get("Alive")}  # fmt: skip

    def _check_nodes(self) -> None:
        """DataError when a node alive at the start has left (its writers would wait for a
        CPU without end)."""
        lost = sorted(self.nodes[n] for n in set(self.nodes) - set(self._alive()))
        if lost:
            raise DataError(f"node {', '.join(lost)} left the Ray cluster mid-run; the "
                            "finished parts are kept: run the same command again to resume on "
                            "the nodes left")  # fmt: skip


def _bar(progress: bool, desc: str) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(unit="mol", desc=desc, smoothing=0.05)
