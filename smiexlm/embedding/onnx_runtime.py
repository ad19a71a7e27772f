"""Run exported graphs with onnxruntime: the featurizer's ``backend="onnx"`` and
``predict(..., backend="onnx")``.

A graph is read from its model folder once, checked against the sha256 that ``onnx.json``
records for it and against the weight files it was exported from, and handed to
onnxruntime's CPU provider as bytes (what was checked is what runs). onnxruntime uses
``torch.get_num_threads()`` intra-op threads, so ``torch.set_num_threads`` (or
``OMP_NUM_THREADS``) sets both backends alike.

Outputs match the torch path to about 2e-6 (max abs; tested at 1e-5) and, like it, do not
depend on the batch a molecule sits in: onnxruntime's float32 softmax and matmul give a row
the same result whatever the padding and the batch size (tested bitwise), so the graph needs
no grouping by length, which the torch path does under ``batch_invariant``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from smiexlm.embedding.onnx_export import encoder_onnx, sha256_bytes
from smiexlm.embedding.onnx_graph import POOLING_ROWS
from smiexlm.errors import ConfigError, DataError
from smiexlm.model.pooling import pooling_parts
from smiexlm.modelio.layout import GRAPH_FILES, ONNX_MANIFEST_NAME
from smiexlm.paths import file_sha256
from smiexlm.tokenizer.padding import pad_rows

if TYPE_CHECKING:  # pragma: no cover
    from smiexlm.model.config import ExLMConfig
    from smiexlm.model.model import ExLMModel
    from smiexlm.modelio.folder import ModelFolder

logger = logging.getLogger(__name__)


def _onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError(
            "backend", "onnx", "onnxruntime installed (pip install 'smiexlm[onnx]')"
        ) from None
    return onnxruntime


def open_session(payload: bytes, threads: int | None = None) -> Any:
    """An onnxruntime CPU session over a serialized graph; ``threads`` intra-op threads
    (default ``torch.get_num_threads()``)."""
    ort = _onnxruntime()
    if threads is None:
        import torch

        threads = torch.get_num_threads()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # errors only
    return ort.InferenceSession(payload, options, providers=["CPUExecutionProvider"])


def read_graph(folder: ModelFolder, kind: str) -> tuple[bytes, dict[str, Any]]:
    """The bytes of a folder's ``kind`` graph and its record (its ``onnx.json``), both checks
    passed.

    DataError (one line) when the folder has no such graph, when the file's sha256 differs from
    the record, or when a weight file changed since the graph was exported."""
    manifest = folder.onnx_manifest
    record = None if manifest is None else manifest["graphs"].get(kind)
    if record is None:
        raise DataError(
            f"model folder {str(folder.path)!r} has no ONNX {kind} graph ({GRAPH_FILES[kind]} "
            f"recorded in {ONNX_MANIFEST_NAME}): write it with `smiexlm export-onnx {folder.path}`"
        )
    path = folder.path / str(record.get("file"))
    try:
        payload = path.read_bytes()
    except OSError as err:
        raise DataError(f"ONNX graph {str(path)!r} cannot be read: {err.strerror}") from None
    actual, expected = sha256_bytes(payload), str(record.get("sha256"))
    if actual != expected:
        raise DataError(
            f"ONNX graph {str(path)!r} does not match the sha256 recorded in {ONNX_MANIFEST_NAME} "
            f"(file {actual[:12]}…, recorded {expected[:12]}…): re-export it with "
            f"`smiexlm export-onnx {folder.path}`"
        )
    for name, digest in record.get("weights_sha256", {}).items():
        if not (folder.path / name).is_file() or file_sha256(folder.path / name) != digest:
            raise DataError(
                f"ONNX graph {str(path)!r} was exported from another {name} than the one in "
                f"{str(folder.path)!r}: re-export it with `smiexlm export-onnx {folder.path}`"
            )
    return payload, record


def padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The graph's inputs: (B, T) int64 ids and (B, T) int64 mask, 1 = real token."""
    ids, mask = pad_rows(rows, pad_id)
    return ids, mask.astype(np.int64)


def check_rows(ids: np.ndarray, mask: np.ndarray, config: ExLMConfig) -> None:
    """DataError unless each row is BOS … EOS with no [MASK] inside (and, for ExLM, no other
    BOS or EOS): the graphs expand exactly one BOS and one EOS per row."""
    c = config
    real = mask.astype(bool)
    lengths = real.sum(1)
    inner = real.copy()
    inner[:, 0] = False
    inner[np.arange(len(ids)), np.maximum(lengths - 1, 0)] = False  # (B, T) between BOS and EOS
    ends = ids[np.arange(len(ids)), np.maximum(lengths - 1, 0)]
    specials = [c.mask_id] + ([c.bos_id, c.eos_id] if c.objective == "exlm" else [])
    bad = (ids[:, 0] != c.bos_id) | (ends != c.eos_id) | (lengths < 2)
    bad |= (np.isin(ids, specials) & inner).any(1)
    if bad.any():
        row = int(np.argmax(bad))
        raise DataError(
            f"token row {row} of the batch ({ids[row, : lengths[row]].tolist()[:12]}…): expected "
            f"BOS={c.bos_id} … EOS={c.eos_id} with no [MASK]={c.mask_id}"
            + (" and no other BOS or EOS inside" if c.objective == "exlm" else "")
        )


class OnnxEncoder:
    """The pooled features of token rows from an encoder graph (see :class:`EncoderGraph`)."""

    def __init__(self, payload: bytes, config: ExLMConfig, threads: int | None = None):
        self.config = config
        self.session = open_session(payload, threads)

    @classmethod
    def from_folder(cls, folder: ModelFolder, threads: int | None = None) -> OnnxEncoder:
        """The folder's checked ``encoder.onnx``."""
        payload, _ = read_graph(folder, "encoder")
        return cls(payload, folder.config, threads)

    @classmethod
    def from_model(cls, model: ExLMModel, threads: int | None = None) -> OnnxEncoder:
        """A graph exported from ``model`` in memory (no file written)."""
        return cls(encoder_onnx(model), model.config, threads)

    @classmethod
    def for_model(cls, model: ExLMModel, folder: ModelFolder | None) -> OnnxEncoder:
        """The graph of the folder ``model`` was loaded from; exported in memory when there
        is no folder, or for the shipped default model (the package holds no graph file)."""
        if folder is None or (folder.is_default and folder.onnx_manifest is None):
            logger.info("exporting the encoder to ONNX in memory (about 10 s)")
            return cls.from_model(model)
        return cls.from_folder(folder)

    def encode(
        self, rows: Sequence[Sequence[int]], pooling: str = "cls", layer: int | Sequence[int] = -1
    ) -> np.ndarray:
        """Pooled features (B, n·d) float32 of token-id rows (BOS ... EOS each): ``pooling``
        is one of cls, mean and max, or several joined by ``+``, of the block ``layer`` (−1 =
        last), or of several side by side (each block's poolings in turn), all from one run."""
        parts = pooling_parts(pooling)
        n = self.config.n_layers
        blocks = [layer] if isinstance(layer, int) else list(layer)
        ids, mask = padded(rows, self.config.pad_id)
        check_rows(ids, mask, self.config)
        cls_only = np.array(int(parts == ("cls",)), dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask, "cls_only": cls_only}
        poolings = self.session.run(["poolings"], feeds)[0]  # (B, n_layers, 3, d), last first
        return np.concatenate([poolings[:, n - 1 - b % n, POOLING_ROWS[part]]
                               for b in blocks for part in parts], axis=1)  # fmt: skip
