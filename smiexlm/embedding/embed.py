"""Embedding whole files (``smiexlm embed``).

``embed_file`` reads a CSV/TSV/Parquet table or a ``.smi`` file, embeds its SMILES column with
a :class:`~smiexlm.embedding.featurizer.Featurizer`, and writes either a Parquet table (the kept id
columns, the SMILES, then ``e0 … e{d-1}``) or a ``.npy`` matrix with the id columns beside it
in ``<name>.ids.csv``. Rows that fail are NaN, and every one of them is listed with its
reason in ``<name>.rejects.csv`` (row, smiles, reason; the header alone when none failed).

``embed_parts`` writes a folder of Parquet parts instead (:mod:`smiexlm.parts`): resumable
part by part, and shared among the processes of a ``torchrun`` job; ``read_parts`` reads them
back as one table in input order.
"""

from __future__ import annotations

import csv
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from smiexlm.atomic import atomic_paths
from smiexlm.data.readers import iter_table
from smiexlm.embedding.featurizer import Featurizer
from smiexlm.embedding.report import FeaturizeReport
from smiexlm.errors import DataError, every_row_failed
from smiexlm.model.inputs import UnseenTokens
from smiexlm.parts.job import DEFAULT_PART_ROWS, ChunkOutput, PartsResult
from smiexlm.paths import REJECTS_HEADER, check_output, ids_beside, rejects_beside

if TYPE_CHECKING:  # pragma: no cover
    from smiexlm.modelio.folder import ModelFolder

OUT_SUFFIXES = (".parquet", ".npy")


@dataclass
class EmbedResult:
    out: Path
    n_rows: int
    dim: int
    id_columns: list[str]
    report: FeaturizeReport  # ``failed`` holds the first SHOWN_FAILURES bad rows only
    rejects_path: Path  # every bad row, with its reason
    ids_path: Path | None = None


logger = logging.getLogger(__name__)
SHOWN_FAILURES = 10  # bad rows kept in the report (all are NaN rows and in the rejects file)


@dataclass(frozen=True)
class EmbedOptions:
    """How a table's SMILES are embedded (the keyword arguments of :func:`embed_file` and
    :func:`embed_parts`): the model folder (None = the shipped one), the pooling, bad rows as
    NaN or an error, the model's normalisation or SMILES as written, padded tokens per batch,
    the device, the backend (``onnx``: onnxruntime on the CPU) and int8 products (CPU, opt-in:
    :class:`~smiexlm.embedding.featurizer.Featurizer`)."""

    checkpoint: Path | None = None
    pooling: str | None = None  # "cls", "mean", "max", "cls+max", ...; None: the folder's own
    errors: Literal["raise", "nan"] = "nan"
    canonicalize: bool = True
    batch_tokens: int = 16384
    device: str = "auto"
    backend: Literal["torch", "onnx"] = "torch"
    whiten: bool | None = None  # None: the model folder's own (embedding.json)
    layers: int | None = None  # the last blocks side by side; None: the folder's own
    int8: bool = False

    def featurizer(self, device: str | None = None) -> Featurizer:
        """The model's featurizer; ConfigError when ``layers`` asks for more blocks than the
        model has (before any row is read or written)."""
        feat = Featurizer.from_pretrained(self.checkpoint, device or self.device, self.backend,
                                          self.int8)  # fmt: skip
        feat.last_blocks(self.chosen_layers())
        return feat

    def embed(self, feat: Featurizer, smiles: Any, index_offset: int) -> np.ndarray:
        """(n, d) rows of ``smiles``; the bad ones are in ``feat.last_report``. ``whiten=None``
        leaves the choice to the featurizer, which applies the folder's own as
        :meth:`chosen_whiten` records it."""
        return feat.featurize(smiles, pooling=self.chosen_pooling(), errors=self.errors,
                              layer=feat.last_blocks(self.chosen_layers()),
                              canonicalize=self.canonicalize, batch_tokens=self.batch_tokens,
                              whiten=self.whiten, index_offset=index_offset,
                              log_failures=False)  # fmt: skip

    @cached_property
    def folder(self) -> ModelFolder:
        """The model folder's reader (each record read once, whatever asks for it)."""
        from smiexlm.modelio.folder import ModelFolder

        return ModelFolder(self.checkpoint)

    def chosen_pooling(self) -> str:
        """``pooling``, or the model folder's own when None (``embedding.json``)."""
        return self.pooling or self.folder.embedding.pooling

    def chosen_layers(self) -> int:
        """``layers``, or the model folder's own when None (``embedding.json``)."""
        return self.folder.embedding.layers if self.layers is None else self.layers

    def chosen_whiten(self) -> bool:
        """``whiten``, or the model folder's own when None: whitened when its
        ``embedding.json`` says so and it stores a whitening for the chosen pooling and blocks
        (or, for one block, for each part of the pooling)."""
        if self.whiten is not None:
            return self.whiten
        return self.folder.serves_whitened(self.chosen_pooling(), self.chosen_layers())

    def settings(self) -> dict[str, Any]:
        """What a folder of parts records, so that a resume cannot mix two kinds of rows."""
        kept = {
            "pooling": self.chosen_pooling(),
            "errors": self.errors,
            "canonicalize": self.canonicalize,
        }
        kept |= {"layers": self.chosen_layers()} if self.chosen_layers() > 1 else {}
        kept |= {"whiten": True} if self.chosen_whiten() else {}
        kept |= {"int8": True} if self.int8 else {}
        return kept | ({"backend": self.backend} if self.backend != "torch" else {})


def embed_file(
    input_path: Path,
    out: Path,
    smiles_col: str = "smiles",
    id_cols: list[str] | None = None,
    *,
    progress: bool = True,
    chunk_rows: int = 8192,
    **options: Any,
) -> EmbedResult:
    """Embed the SMILES column of ``input_path`` and write ``out`` (.parquet or .npy);
    ``options`` are :class:`EmbedOptions` fields (``checkpoint``, ``pooling``, ``device``, ...).

    ``id_cols`` (default: every column but the SMILES one) are kept beside the embeddings.
    The input is read ``chunk_rows`` rows at a time and each chunk's rows are appended to the
    output, so memory stays flat whatever the input size. Everything is written under
    temporary names and renamed into place at the end (``.npy`` and its ``.ids.csv``
    together): an interrupted run leaves the previous output whole, and so does a run none of
    whose rows could be embedded (DataError with the first rows' reasons). Every bad row goes
    to :func:`~smiexlm.paths.rejects_beside` with its reason, written in the same step.
    """
    how = EmbedOptions(**options)
    out, input_path = Path(out), Path(input_path)
    _check_file_out(out)  # before any compute, not after it
    chunks = iter_table(input_path, smiles_col, chunk_rows)
    first = next(chunks)  # raises DataError for an empty or unreadable input
    id_cols = id_columns(first, smiles_col, id_cols)
    feat = how.featurizer()
    width = feat.width(how.chosen_pooling(), feat.last_blocks(how.chosen_layers()))
    report = FeaturizeReport()
    ids_path = ids_beside(out) if out.suffix == ".npy" and id_cols else None
    rejects = rejects_beside(out)
    finals = [out] if ids_path is None else [out, ids_path]
    bar = _progress_bar("embed") if progress else None
    with atomic_paths(*finals, rejects) as tmps, open(tmps[-1], "w", newline="") as bad:
        writer = _writer(out.suffix, tmps[:-1], width)
        listed = csv.writer(bad, lineterminator="\n")
        listed.writerow(REJECTS_HEADER)
        try:
            for frame in _chain(first, chunks):
                emb = how.embed(feat, frame[smiles_col], report.n_inputs)  # (n, d)
                _merge(report, feat.last_report)
                listed.writerows(feat.last_report.failed)
                writer.write(frame[[*id_cols, smiles_col]].reset_index(drop=True), emb)
                if bar is not None:
                    bar.update(len(frame))
            writer.close()
            if report.n_failed == report.n_inputs:  # all NaN: nothing under the final name
                raise every_row_failed("embed", smiles_col, input_path, report.n_inputs,
                                       report.failed)  # fmt: skip
        finally:
            writer.abort()
            if bar is not None:
                bar.close()
    feat.last_report = report
    if report.unseen is not None and report.unseen.holding:
        logger.warning("embed: %s", report.unseen.describe())
    return EmbedResult(out, report.n_inputs, width, list(id_cols), report, rejects, ids_path)


def _check_file_out(out: Path) -> None:
    """DataError unless ``out`` is a writable ``.parquet`` or ``.npy`` file (and, for ``.npy``,
    its ``.ids.csv`` beside it)."""
    if out.suffix not in OUT_SUFFIXES:
        raise DataError(
            f"--out {str(out)!r}: expected a file ending in {OUT_SUFFIXES}, or a folder name "
            "without a suffix for Parquet parts"
        )
    check_output(out, "--out")
    check_output(rejects_beside(out), "--out rejects file")
    if out.suffix == ".npy":
        check_output(ids_beside(out), "--out ids file")


def _progress_bar(desc: str) -> Any:
    """A tqdm bar counting molecules."""
    from tqdm.auto import tqdm

    return tqdm(unit="mol", desc=desc)


def embed_parts(
    input_path: Path,
    out: Path,
    smiles_col: str = "smiles",
    id_cols: list[str] | None = None,
    *,
    progress: bool = True,
    chunk_rows: int = 8192,
    part_rows: int = DEFAULT_PART_ROWS,
    threads: int | None = None,
    **options: Any,
) -> PartsResult:
    """Embed ``input_path`` into the folder ``out`` as Parquet parts of ``part_rows`` rows;
    ``options`` are :class:`EmbedOptions` fields.

    Each part holds the id columns, the SMILES and ``e0 … e{d-1}`` of its input rows (NaN
    rows for bad SMILES, listed with their reasons in ``out/rejects.csv``). Run again after
    an interruption, the same call resumes: finished parts are kept, the others written.
    Under ``torchrun`` each process writes its share of the parts (:mod:`smiexlm.training.workers`;
    ``threads`` per process, default: the cores over the processes of the node).
    """
    from smiexlm.parts.job import PartsJob, input_record, model_record
    from smiexlm.parts.writing import run_parts
    from smiexlm.training.workers import job_workers

    how = EmbedOptions(**options)
    out, input_path = Path(out), Path(input_path)
    check_output(out, "--out", kind="folder")  # before any compute, not after it
    chunks = iter_table(input_path, smiles_col, chunk_rows)
    first = next(chunks)  # raises DataError for an empty or unreadable input
    id_cols = id_columns(first, smiles_col, id_cols)
    with job_workers(threads) as workers:
        feat = how.featurizer(workers.device(how.device))
        settings = {"smiles_col": smiles_col, "id_cols": id_cols, **how.settings()}
        job = PartsJob("embed", input_record(input_path), model_record([feat.source]),
                       settings, part_rows)  # fmt: skip

        process = chunk_embedder(how, feat, smiles_col, id_cols)
        return run_parts(job, out, _chain(first, chunks), process, workers, progress,
                         {"device": str(feat.device)})  # fmt: skip


def chunk_embedder(how: EmbedOptions, feat: Featurizer, smiles_col: str,
                   id_cols: list[str]) -> Callable[[Any, int], ChunkOutput]:  # fmt: skip
    """What a part writer does to each chunk of input rows (a DataFrame whose first row is
    row ``start`` of the input): its table of embeddings, its bad rows and counts."""

    def process(frame: Any, start: int) -> ChunkOutput:
        emb = how.embed(feat, frame[smiles_col], start)
        report = feat.last_report
        counts = {"unk_tokens": report.n_unk_tokens,
                  "changed_by_normalization": report.n_changed_by_normalization}  # fmt: skip
        if report.unseen is not None:
            counts["molecules_with_untrained_tokens"] = report.unseen.holding
        table = _embedding_table(frame[[*id_cols, smiles_col]], emb)
        return ChunkOutput(table, report.failed, counts)

    return process


def id_columns(first: Any, smiles_col: str, id_cols: list[str] | None) -> list[str]:
    """The id columns to keep (default: every column but the SMILES, which is kept in any
    case: naming it adds nothing), checked."""
    id_cols = [c for c in (first.columns if id_cols is None else id_cols) if c != smiles_col]
    missing = [c for c in id_cols if c not in first.columns]
    if missing:
        raise DataError(
            f"id columns {missing} are not in the input: expected some of {list(first.columns)}"
        )
    clash = [str(c) for c in [*id_cols, smiles_col] if re.fullmatch(r"e\d+", str(c))]
    if clash:  # a table with two columns of one name cannot be read back
        raise DataError(f"input column(s) {clash} are named like the embedding columns e0, e1, "
                        "... the output holds: rename them, or leave them out with --id-cols")  # fmt: skip
    return list(id_cols)


def _embedding_table(ids: Any, emb: np.ndarray) -> Any:
    """A pyarrow table: the columns of the DataFrame ``ids``, then ``e0 … e{d-1}`` (float32)."""
    import pyarrow as pa

    table = pa.Table.from_pandas(ids.reset_index(drop=True), preserve_index=False)
    arrays = [*table.columns, *(pa.array(emb[:, i], type=pa.float32()) for i in range(emb.shape[1]))]  # fmt: skip
    names = [*table.column_names, *(f"e{i}" for i in range(emb.shape[1]))]
    return pa.Table.from_arrays(arrays, names=names)


def _chain(first: Any, rest: Any) -> Any:
    yield first
    yield from rest


def _merge(total: FeaturizeReport, part: FeaturizeReport) -> None:
    total.n_inputs += part.n_inputs
    total.n_failed += part.n_failed
    total.n_unk_tokens += part.n_unk_tokens
    total.n_changed_by_normalization += part.n_changed_by_normalization
    total.failed += part.failed[: SHOWN_FAILURES - len(total.failed)]
    if part.unseen is not None:
        total.unseen = (total.unseen or UnseenTokens()).merge(part.unseen)


def _writer(suffix: str, tmps: list[Path], dim: int) -> Any:
    if suffix == ".npy":
        return NpyRowWriter(tmps[0], dim, ids_path=tmps[1] if len(tmps) > 1 else None)
    return ParquetRowWriter(tmps[0])


class NpyRowWriter:
    """A float32 ``(n, d)`` ``.npy`` file written row block by row block.

    The header is reserved at the start with room for any row count and rewritten with the
    final shape by :meth:`close`; the id columns go to a CSV beside it, chunk by chunk."""

    HEADER = 128  # bytes: magic, version, length and the padded header dict

    def __init__(self, path: Path, dim: int, ids_path: Path | None = None):
        self.path, self.dim, self.ids_path, self.rows = path, dim, ids_path, 0
        self.handle = open(path, "wb")  # noqa: SIM115 - closed by close()/abort()
        self.handle.write(self._header(0))

    def _header(self, rows: int) -> bytes:
        text = repr({"descr": "<f4", "fortran_order": False, "shape": (rows, self.dim)})
        body = text.encode("latin1").ljust(self.HEADER - 10 - 1) + b"\n"
        return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body

    def write(self, ids: Any, emb: np.ndarray) -> None:
        self.handle.write(np.ascontiguousarray(emb, dtype="<f4").tobytes())
        if self.ids_path is not None:
            ids.to_csv(self.ids_path, mode="a" if self.rows else "w", header=not self.rows,
                       index=False)  # fmt: skip
        self.rows += len(emb)

    def close(self) -> None:
        self.handle.seek(0)
        self.handle.write(self._header(self.rows))
        self.handle.close()

    def abort(self) -> None:
        self.handle.close()


class ParquetRowWriter:
    """A Parquet table (id columns, SMILES, ``e0 … e{d-1}``), one row group per chunk."""

    def __init__(self, path: Path):
        self.path, self.writer, self.schema = path, None, None

    def write(self, ids: Any, emb: np.ndarray) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(ids, preserve_index=False)
        for i in range(emb.shape[1]):
            table = table.append_column(f"e{i}", pa.array(emb[:, i], type=pa.float32()))
        if self.writer is None:
            self.schema = table.schema
            self.writer = pq.ParquetWriter(self.path, self.schema)
        self.writer.write_table(table.cast(self.schema))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def abort(self) -> None:
        self.close()
