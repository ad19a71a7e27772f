"""Write a model folder's encoder (or fine-tuned predictor) as an ONNX graph beside its weights.

A pre-trained folder gets ``encoder.onnx``: ``input_ids`` (B, T) int64, ``attention_mask``
(B, T) int64 (1 = real token) and ``cls_only`` () int64 in, ``poolings`` (B, n_layers, 3, d)
float32 out (cls, mean and max of every block, the last first, from one pass); B and T are
dynamic. One graph serves every pooling, block and combination: the file holds the weights
once, and with ``cls_only`` the graph runs the last
block for the first positions only (see :class:`~smiexlm.embedding.onnx_graph.EncoderGraph`). A fine-tuned
folder (``finetune.json``) gets ``predictor.onnx``: ids and mask (plus ``features`` (B, F)
float32 for a hybrid head) in, ``logits`` (B, n_outputs) out, the head on the pooling it was
trained with.

``onnx.json`` records, per graph, its file, sha256, inputs, outputs and the sha256 of the
weight files it was exported from; the loader (:mod:`smiexlm.embedding.onnx_runtime`) checks
both before a session starts. How the graphs compute (float32 attention, batch invariance):
:mod:`smiexlm.embedding.onnx_graph`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from smiexlm.atomic import write_bytes_atomic, write_text_atomic
from smiexlm.errors import ConfigError, DataError
from smiexlm.modelio.layout import (
    CONFIG_NAME,
    EMBEDDER_DIR,
    FINETUNE_NAME,
    GRAPH_FILES,
    GRAPH_SOURCES,
    ONNX_MANIFEST_NAME,
    is_shipped,
    shipped_models,
)
from smiexlm.modelio.records import ONNX_MANIFEST_FORMAT, read_onnx_manifest
from smiexlm.paths import check_not_a_file, file_sha256

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel

GraphKind = Literal["encoder", "predictor"]
OPSET = 20  # onnxruntime >= 1.17 runs it; the exporter's Gelu and LayerNormalization need 20
ENCODER_INPUTS = ["input_ids", "attention_mask", "cls_only"]


def sha256_bytes(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def require_exporter() -> None:
    """ConfigError naming the extra when torch's ONNX exporter cannot run here."""
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            "onnx", "export", f"the onnx and onnxscript packages ({err.name} is missing): "
            "pip install 'smiexlm[onnx]'"
        ) from None  # fmt: skip


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's progress lines and deprecation warnings, silenced for one export."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "onnxscript")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(None):
            warnings.simplefilter("ignore")
            yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


def _example_ids(model: ExLMModel) -> tuple[Any, Any]:
    """Two rows (BOS x x x EOS, BOS x x EOS PAD): the shapes the exporter traces with."""
    import torch

    c = model.config
    token = next(i for i in range(c.vocab_size) if i not in (c.pad_id, c.bos_id, c.eos_id, c.mask_id))  # fmt: skip
    ids = torch.tensor(
        [[c.bos_id, token, token, token, c.eos_id], [c.bos_id, token, token, c.eos_id, c.pad_id]]
    )
    return ids, (ids != c.pad_id).long()


def _predictor_inputs(n_features: int) -> list[str]:
    return ["input_ids", "attention_mask"] + (["features"] if n_features else [])


def _on_cpu_fp32(module: nn.Module) -> nn.Module:
    """``module`` itself when its weights are float32 on the CPU, else a CPU float32 copy."""
    import copy

    import torch

    params = list(module.parameters())
    if all(p.device.type == "cpu" and p.dtype == torch.float32 for p in params):
        return module
    return copy.deepcopy(module).cpu().float()


def _export(graph: nn.Module, args: tuple, inputs: list[str], outputs: list[str]) -> bytes:
    """Serialized ONNX model of ``graph`` with dynamic batch and length (torch.export based).

    ``args``: ids and mask (B, T), then ``cls_only`` () or ``features`` (B, F)."""
    import torch

    require_exporter()
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    shapes: list[dict[int, Any] | None] = [{0: batch, 1: length}, {0: batch, 1: length}]
    shapes += [{0: batch} if extra.dim() else None for extra in args[2:]]
    with _quiet_exporter(), torch.inference_mode(False), torch.no_grad():
        program = torch.onnx.export(
            graph.eval(),
            args,
            dynamo=True,
            input_names=inputs,
            output_names=outputs,
            dynamic_shapes=tuple(shapes),
            opset_version=OPSET,
            external_data=False,
            verbose=False,
        )
    proto = program.model_proto
    proto.producer_name = "smiexlm"
    return proto.SerializeToString()


def encoder_onnx(model: ExLMModel) -> bytes:
    """The encoder graph of ``model`` as serialized ONNX: ``input_ids``, ``attention_mask``
    (B, T) int64 and ``cls_only`` () int64 in, ``poolings`` (B, n_layers, 3, d) float32 out
    (the last block first; rows: :data:`~smiexlm.embedding.onnx_graph.POOLING_ROWS`)."""
    import torch

    from smiexlm.embedding.onnx_graph import EncoderGraph

    graph = EncoderGraph(_on_cpu_fp32(model))
    args = (*_example_ids(model), torch.tensor(0))
    return _export(graph, args, ENCODER_INPUTS, ["poolings"])


def predictor_onnx(model: ExLMForSequencePrediction) -> bytes:
    """A fine-tuned model's graph: ids, mask (+ ``features``) -> ``logits`` (B, n_outputs)."""
    import torch

    from smiexlm.embedding.onnx_graph import PredictorGraph

    graph = PredictorGraph(_on_cpu_fp32(model))
    args: tuple = _example_ids(model.model)
    if model.n_features:
        args += (torch.zeros(2, model.n_features),)
    return _export(graph, args, _predictor_inputs(model.n_features), ["logits"])


def export_onnx(folder: Path | str, kind: GraphKind | None = None) -> Path:
    """Write the ONNX graph of the model folder ``folder`` into it and record it in
    ``onnx.json``; returns the graph's path.

    ``kind`` defaults to ``predictor`` for a fine-tuned folder (``finetune.json``), else
    ``encoder``; a fine-tuned folder's kernel members get the encoder graph of their frozen
    embedding (``embedder/``) too. Re-exporting replaces the graph and its record; other
    records are kept.
    """
    folder = check_not_a_file(folder)
    if is_shipped(folder):
        raise DataError(f"model folder {str(folder)!r} is shipped with smiexlm and is read-only: "
                        "copy it to a folder of your own and export that")  # fmt: skip
    if not (folder / CONFIG_NAME).is_file():
        shipped = ""
        if str(folder) in shipped_models():
            shipped = " (the shipped models are read-only: copy the folder first)"
        why = f"has no {CONFIG_NAME}" if folder.is_dir() else "does not exist"
        raise DataError(
            f"model folder {str(folder)!r} {why}: expected a folder written by `smiexlm "
            f"export` or `smiexlm finetune --save-dir`{shipped}"
        )
    finetuned = (folder / FINETUNE_NAME).is_file()
    kind = kind or ("predictor" if finetuned else "encoder")
    if kind not in GRAPH_FILES:
        raise ConfigError("kind", kind, f"one of {tuple(GRAPH_FILES)}")
    record: dict[str, Any] = {"file": GRAPH_FILES[kind]}
    if kind == "predictor":
        if not finetuned:
            raise DataError(
                f"model folder {str(folder)!r} has no {FINETUNE_NAME}: a predictor graph "
                "needs a fine-tuned folder (`smiexlm finetune --save-dir`)"
            )
        from smiexlm.modelio.pretrained import load_finetuned

        model, _, meta = load_finetuned(folder, device="cpu")
        payload = predictor_onnx(model)
        record |= {"inputs": _predictor_inputs(model.n_features), "outputs": ["logits"],
                   "pooling": meta["pooling"], "n_features": model.n_features}  # fmt: skip
    else:
        from smiexlm.embedding.onnx_graph import POOLING_ROWS
        from smiexlm.modelio.pretrained import load_pretrained

        payload = encoder_onnx(load_pretrained(folder).model)
        record |= {"inputs": ENCODER_INPUTS, "outputs": ["poolings"], "pooling_rows": POOLING_ROWS}
    record |= {
        "sha256": sha256_bytes(payload),
        "weights_sha256": {
            name: file_sha256(folder / name) for name in GRAPH_SOURCES if (folder / name).is_file()
        },
        "opset": OPSET,
    }
    path = write_bytes_atomic(folder / record["file"], payload)
    manifest = read_onnx_manifest(folder) or {"format": ONNX_MANIFEST_FORMAT, "graphs": {}}
    manifest["graphs"][kind] = record
    write_text_atomic(folder / ONNX_MANIFEST_NAME, json.dumps(manifest, indent=1) + "\n")
    if kind == "predictor" and (folder / EMBEDDER_DIR / CONFIG_NAME).is_file():
        export_onnx(folder / EMBEDDER_DIR, "encoder")  # the kernel members' frozen embedding
    return path
