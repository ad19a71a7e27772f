"""``Featurizer``: SMILES in, fixed-size embeddings out.

>>> from smiexlm import Featurizer
>>> feat = Featurizer.from_pretrained()          # the default model shipped in the package
>>> X = feat.featurize(["CCO", "c1ccccc1O"])     # np.ndarray (2, d) float32

How a call runs, in chunks of ``chunk_size`` molecules (memory stays bounded on any input):

1. each SMILES is normalised as the model folder's corpus was (RDKit canonical SMILES by
   default; see :func:`smiexlm.modelio.records.read_normalization`) and tokenized;
2. the chunk is sorted by token length (stable) and cut into batches whose padded size stays
   within ``batch_tokens`` (and within ``batch_size`` molecules when given);
3. each batch goes through ``ExLMModel.encode`` under ``torch.inference_mode`` with the model
   in eval mode, so the same input always gives the same output;
4. the pooled rows are written back at their input positions, whitened with the model's
   corpus whitening where the model folder asks for it (:mod:`smiexlm.whitening`).

Bad input is never dropped silently: ``errors="raise"`` raises on the first bad SMILES with its
index; ``errors="nan"`` fills its row with NaN, logs a warning listing the offenders, and
records them in :attr:`Featurizer.last_report`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Literal

import numpy as np

from smiexlm.data.collate import collate
from smiexlm.data.normalize import NormalizeConfig
from smiexlm.data.sampler import length_batches
from smiexlm.device import resolve_device
from smiexlm.embedding.inputs import refuse_non_sequence, smiles_list
from smiexlm.embedding.report import FeaturizeReport, log_report, progress_bar, release_free_memory
from smiexlm.errors import (
    ConfigError,
    InvalidSmilesError,
    VocabularyMismatchError,
    check_positive_int,
)
from smiexlm.model.encoder import batch_invariant, int8_products
from smiexlm.model.inputs import UnseenTokens
from smiexlm.model.model import ExLMModel
from smiexlm.model.pooling import block_indices, last_blocks, pooling_parts
from smiexlm.modelio.folder import ModelFolder
from smiexlm.modelio.pretrained import Pretrained, load_pretrained
from smiexlm.tokenizer import Tokenizer
from smiexlm.whitening import Whitening, pooling_whitening, served_whitening

Pooling = str  # "cls", "mean", "max", or several joined by "+" ("cls+max")
Errors = Literal["raise", "nan"]
Backend = Literal["torch", "onnx"]

_BACKENDS = ("torch", "onnx")
_ERRORS = ("raise", "nan")
_INT8_PLACES = (("torch", "auto"), ("torch", "cpu"))  # int8 products run on the CPU
__all__ = ["FeaturizeOptions", "Featurizer"]


@dataclass(frozen=True)
class FeaturizeOptions:
    """One call's options, checked and resolved (:meth:`Featurizer.featurize` says what each
    does): the pooling and blocks served (the model's own where the call named none) and the
    whitening applied (None: none)."""

    pooling: Pooling
    layer: int | Sequence[int]
    whitening: Whitening | None
    errors: Errors = "raise"
    batch_tokens: int = 16384
    batch_size: int | None = None
    canonicalize: bool = True
    chunk_size: int = 8192
    index_offset: int = 0


class Featurizer:
    """A pretrained encoder plus its tokenizer and normalisation, in eval mode.

    From a model folder: :meth:`from_pretrained`. From a model in memory (a random
    initialisation, a model being trained): ``Featurizer(Pretrained(model, tokenizer))``,
    served with the default normalisation and cls pooling, unwhitened."""

    def __init__(self, pretrained: Pretrained, device: str = "auto", backend: Backend = "torch",
                 int8: bool = False):  # fmt: skip
        """``pretrained`` holds the model, its tokenizer and the folder it was loaded from
        (:func:`~smiexlm.modelio.pretrained.load_pretrained`), whose ``embedding.json`` gives the
        embedding used when :meth:`featurize` names none (:attr:`pooling`; several joined by
        ``+`` put side by side) and whether its corpus whitening (``whitening.safetensors``)
        is applied by default (:attr:`whiten`). ``backend="onnx"`` runs the encoder with
        onnxruntime on the CPU: the folder's graph (``encoder.onnx``, checked against its
        recorded sha256), or one exported from the model in memory without a folder (and for
        the shipped default model, which has no graph file). ``int8=True`` (CPU, torch) runs
        the encoder's linear layers in int8 (:func:`~smiexlm.model.encoder.int8_linear`):
        faster, still the same for a molecule in any batch, close to but not equal to fp32's.
        See docs/featurizer.md."""
        if backend not in _BACKENDS:
            raise ConfigError("backend", backend, f"one of {_BACKENDS}")
        if not isinstance(int8, bool) or (int8 and (backend, device) not in _INT8_PLACES):
            raise ConfigError("int8", int8, "False, or True with backend='torch' on the CPU")
        if backend == "onnx" and device not in ("auto", "cpu"):
            raise ConfigError("device", device, "'auto' or 'cpu' with backend='onnx'")
        model, tokenizer = pretrained.model, pretrained.tokenizer
        if tokenizer.vocab_size != model.config.vocab_size:
            raise VocabularyMismatchError(
                f"tokenizer has {tokenizer.vocab_size} tokens but the model's vocab_size is "
                f"{model.config.vocab_size}"
            )
        self.pretrained = pretrained
        self.device = resolve_device("cpu" if backend == "onnx" or int8 else device)
        model.to(self.device).eval()
        self.backend, self.int8, self._onnx = backend, int8, None
        self.cut_at: int | None = None  # tokens: a longer molecule is cut (EOS kept), not failed
        if backend == "onnx":
            from smiexlm.embedding.onnx_runtime import OnnxEncoder

            self._onnx = OnnxEncoder.for_model(model, pretrained.folder)
        self.inputs = pretrained.inputs()
        self.pooling: Pooling = pretrained.pooling
        self.whiten = pretrained.embedding.whiten
        self.layers = pretrained.embedding.layers  # the last blocks served, side by side
        last_blocks(self.layers, model.config.n_layers, "layers (in embedding.json)")
        if self.whiten and pooling_whitening(self.whitening, self.pooling, self.layers) is None:
            raise ConfigError("whiten", self.whiten, f"False: no whitening is stored for "
                              f"{self.pooling} pooling of the last {self.layers} block(s)")  # fmt: skip
        self.last_report = FeaturizeReport()

    @classmethod
    def from_pretrained(
        cls, path: str | Path | None = None, device: str = "auto", backend: Backend = "torch",
        int8: bool = False,
    ) -> Featurizer:  # fmt: skip
        """Load a model folder (``config.json``, ``vocab.json``, ``model.safetensors``) or a
        shipped model by name (:func:`~smiexlm.modelio.pretrained.load_pretrained`).

        ``path=None`` loads the default model shipped inside the package; no network is used.
        ``backend="onnx"`` serves the folder's ``encoder.onnx`` (``smiexlm export-onnx``);
        ``int8``: see :class:`Featurizer`."""
        folder = ModelFolder(path)
        folder.check_reads_smiles()
        return cls(load_pretrained(folder), device, backend, int8)

    @property
    def model(self) -> ExLMModel:
        return self.pretrained.model

    @property
    def tokenizer(self) -> Tokenizer:
        return self.pretrained.tokenizer

    @property
    def normalization(self) -> NormalizeConfig:
        """How SMILES are normalised before tokenizing: as the model's corpus was."""
        return self.pretrained.normalization

    @property
    def normalization_source(self) -> str:
        """Where :attr:`normalization` was read from (a file, the card, or ``default``)."""
        return self.pretrained.normalization_source

    @property
    def source(self) -> Path | None:
        """The model folder, or None for a model built in memory."""
        return self.pretrained.path

    @property
    def whitening(self) -> Mapping[str, Whitening]:
        """The model's corpus whitening by pooling (empty without one)."""
        return self.pretrained.whitening or {}

    @property
    def blocks(self) -> tuple[int, ...]:
        """The blocks served when :meth:`featurize` names none: the last :attr:`layers`."""
        return last_blocks(self.layers)

    def last_blocks(self, n: int) -> tuple[int, ...]:
        """The last ``n`` blocks for ``featurize(layer=...)``; ConfigError beyond the model's."""
        return last_blocks(n, self.model.config.n_layers)

    @property
    def dim(self) -> int:
        """Width of the default embedding (:attr:`pooling` of :attr:`blocks`): d, times the
        poolings, times the blocks."""
        return self.width()

    def width(
        self, pooling: Pooling | None = None, layer: int | Sequence[int] | None = None
    ) -> int:
        """Width of the embedding of ``pooling`` (None: :attr:`pooling`) of the blocks
        ``layer`` (None: :attr:`blocks`)."""
        n_blocks = len(
            block_indices(self.blocks if layer is None else layer, self.model.config.n_layers)
        )
        return self.model.config.d_model * len(pooling_parts(pooling or self.pooling)) * n_blocks

    @property
    def max_chars(self) -> int:
        """Longest SMILES (characters) accepted; longer ones fail before any parsing."""
        return self.inputs.max_chars

    def __repr__(self) -> str:
        c = self.model.config
        source = "shipped default model" if self.pretrained.is_default else str(self.source)
        return (
            f"Featurizer(source={source!r}, objective={c.objective!r}, "
            f"d={c.d_model}, layers={c.n_layers}, pooling={self.pooling!r}, blocks={self.layers}, "
            f"whiten={self.whiten}, device={str(self.device)!r}{', int8=True' if self.int8 else ''})"
        )

    # ------------------------------------------------------------------ featurize
    def featurize(
        self,
        smiles: Sequence[str] | Iterable[str],
        pooling: Pooling | None = None,
        layer: int | Sequence[int] | None = None,
        errors: Errors = "raise",
        batch_tokens: int = 16384,
        batch_size: int | None = None,
        canonicalize: bool = True,
        chunk_size: int = 8192,
        progress: bool = False,
        *,
        whiten: bool | None = None,
        index_offset: int = 0,
        log_failures: bool = True,
    ) -> np.ndarray:
        """Embeddings (n, d) float32 of ``smiles`` (a list, tuple, pandas Series or iterable),
        in input order.

        ``pooling``: ``cls`` (first position), ``mean`` or ``max`` over real positions, or
        several joined by ``+`` (``cls+max``: both side by side, (n, 2d), from one pass of the
        encoder); None: the model's own (:attr:`pooling`, from its folder's
        ``embedding.json``).
        ``layer``: encoder block whose output is pooled (−1 = last); several, such as
        ``(-1, -2, -3)``, put side by side in that order, (n, 3·width), from one pass of the
        encoder; None: the model's own (:attr:`blocks`, the last :attr:`layers` of them).
        ``whiten``: apply the model's corpus whitening (:mod:`smiexlm.whitening`, fitted on
        the last block, or on the last few side by side); None: the model's default
        (:attr:`whiten`) where a whitening of these blocks is stored, none elsewhere.
        ``errors``: ``raise`` on the first bad SMILES, or ``nan`` to fill its row with NaN.
        ``batch_tokens``: padded tokens per batch; ``batch_size``: molecules per batch cap.
        ``canonicalize=False`` skips the model folder's normalisation (SMILES used as written).
        ``index_offset`` is added to the input indices in errors and in the report (a caller
        that streams a file in pieces reports file rows); ``log_failures=False`` leaves the
        listing of bad inputs to the caller.
        """
        items = smiles_list(smiles)
        options = self._plan(pooling, layer, whiten, errors, batch_tokens, batch_size,
                             canonicalize, chunk_size, index_offset)  # fmt: skip
        if not isinstance(progress, bool):
            raise ConfigError("progress", progress, "True or False")
        out = np.empty((len(items), self.width(options.pooling, options.layer)), dtype=np.float32)
        bar = progress_bar(len(items)) if progress else None
        start = 0
        for emb in self._chunks(iter(items), options, bar):
            out[start : start + len(emb)] = emb
            start += len(emb)
        if log_failures:
            log_report(self.last_report)
        return out

    __call__ = featurize

    def iter_featurize(
        self,
        smiles: Iterable[str],
        pooling: Pooling | None = None,
        layer: int | Sequence[int] | None = None,
        errors: Errors = "raise",
        batch_tokens: int = 16384,
        batch_size: int | None = None,
        canonicalize: bool = True,
        chunk_size: int = 8192,
        progress: bool = False,
        *,
        whiten: bool | None = None,
        index_offset: int = 0,
        log_failures: bool = True,
    ) -> Iterator[np.ndarray]:
        """The embeddings of ``smiles`` a chunk at a time: (up to ``chunk_size``, d) float32
        arrays, in input order, each as soon as it is computed.

        ``smiles`` is read lazily, ``chunk_size`` at a time, so a generator over a file of
        any length (``(line.split()[0] for line in open(path))``) is embedded in bounded
        memory, and the caller can write each chunk away before the next is read. The rows
        are those :meth:`featurize` gives for the same input and options (the same chunks
        are computed alike); :attr:`last_report` counts what has been read so far and is
        complete, and its warnings logged, once the iterator is exhausted."""
        refuse_non_sequence(smiles)  # as featurize does; the rest is read lazily
        options = self._plan(pooling, layer, whiten, errors, batch_tokens, batch_size,
                             canonicalize, chunk_size, index_offset)  # fmt: skip
        chunks = self._chunks(iter(smiles), options, progress_bar(None) if progress else None)
        return self._streamed(chunks, log_failures)

    def _streamed(self, chunks: Iterator[np.ndarray], log_failures: bool) -> Iterator[np.ndarray]:
        yield from chunks  # the report is logged once the caller has read every chunk
        if log_failures:
            log_report(self.last_report)

    def _chunks(self, items: Iterator[Any], options: FeaturizeOptions,
                bar: Any) -> Iterator[np.ndarray]:  # fmt: skip
        """Each chunk's embeddings, whitened where asked; :attr:`last_report` is the run's
        report from the first chunk on; the progress bar, when given, is closed at the end."""
        self.model.eval()  # dropout off, whatever the caller did to the model since loading
        report = self.last_report = FeaturizeReport(n_inputs=0)
        start = 0
        while chunk := list(islice(items, options.chunk_size)):
            report.n_inputs += len(chunk)
            emb = self._featurize_chunk(chunk, options.index_offset + start, options, report, bar)
            if options.whitening is not None:
                emb = options.whitening(emb, float32=self.int8)
            release_free_memory()
            start += len(chunk)
            yield emb
        if bar is not None:
            bar.close()

    def _plan(self, pooling: Pooling | None, layer, whiten: bool | None, errors: Errors,
              batch_tokens: int, batch_size: int | None, canonicalize: bool, chunk_size: int,
              index_offset: int) -> FeaturizeOptions:  # fmt: skip
        """The call's options, the model's own pooling and blocks where None, with the
        whitening it applies; ConfigError naming the first bad option."""
        pooling = pooling or self.pooling
        layer = self.blocks if layer is None else layer
        pooling_parts(pooling)
        if errors not in _ERRORS:
            raise ConfigError("errors", errors, f"one of {_ERRORS}")
        if not isinstance(canonicalize, bool):
            raise ConfigError("canonicalize", canonicalize, "True or False")
        block_indices(layer, self.model.config.n_layers)
        batch_tokens, batch_size, chunk_size = (
            int(v) if isinstance(v, np.integer) else v
            for v in (batch_tokens, batch_size, chunk_size)
        )  # a numpy integer is as good as an int
        check_positive_int("batch_tokens", batch_tokens)
        check_positive_int("batch_size", batch_size, optional=True)
        check_positive_int("chunk_size", chunk_size)
        whitening = served_whitening(self.whitening, pooling, layer, self.model.config.n_layers,
                                     whiten, self.whiten)  # fmt: skip
        return FeaturizeOptions(pooling, layer, whitening, errors, batch_tokens, batch_size,
                                canonicalize, chunk_size, index_offset)  # fmt: skip

    # ------------------------------------------------------------------ internals
    def prepare(
        self, smiles: Sequence[Any], canonicalize: bool = True
    ) -> tuple[list[list[int] | None], list[str | None], int]:
        """Normalise and tokenize: ids (with BOS/EOS) or None per input, the reason of each
        failure (None where it worked), and how many inputs normalisation rewrote."""
        prepared = self.inputs.prepare(smiles, canonicalize, self.cut_at)
        return prepared.rows, prepared.reasons, prepared.n_changed

    def _featurize_chunk(self, chunk: list[Any], offset: int, options: FeaturizeOptions,
                         report: FeaturizeReport, bar: Any = None) -> np.ndarray:  # fmt: skip
        ids, reasons, changed = self.prepare(chunk, options.canonicalize)
        report.n_changed_by_normalization += changed
        out = np.full((len(chunk), self.width(options.pooling, options.layer)), np.nan,
                      dtype=np.float32)  # fmt: skip
        for i, reason in enumerate(reasons):
            if reason is not None:
                if options.errors == "raise":
                    raise InvalidSmilesError(
                        str(chunk[i]), None, f"input index {offset + i}: {reason}"
                    )
                report.n_failed += 1
                report.failed.append((offset + i, str(chunk[i]), reason))
        good = [i for i, row in enumerate(ids) if row is not None]
        good.sort(key=lambda i: len(ids[i]))  # stable: ties keep input order
        seqs = [ids[i] for i in good]
        report.n_unk_tokens += sum(row.count(self.tokenizer.unk_id) for row in seqs)
        if (unseen := self.inputs.unseen(seqs)) is not None:
            report.unseen = (report.unseen or UnseenTokens()).add(unseen)
        lengths = self.inputs.encoder_lengths(seqs)
        for batch in length_batches(lengths, options.batch_tokens, options.batch_size):
            pooled = self.encode_ids([seqs[j] for j in batch], options.pooling, options.layer)
            out[[good[j] for j in batch]] = pooled
            if bar is not None:
                bar.update(len(batch))
        if bar is not None:
            bar.update(len(chunk) - len(good))  # the failed rows
        return out

    def encode_ids(
        self, rows: list[list[int]], pooling: str = "cls", layer: int | Sequence[int] | None = None
    ) -> np.ndarray:
        """Pooled embeddings (B, n·d) float32 of token-id rows (BOS ... EOS each), unwhitened;
        several layers side by side, (B, layers·n·d); ``layer`` None: :attr:`blocks`."""
        import torch

        layer = self.blocks if layer is None else layer
        if self._onnx is not None:
            return self._onnx.encode(rows, pooling, layer)
        ids, mask = collate(rows, self.tokenizer.pad_id)  # (B, T), True = real token
        input_ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.inference_mode(), batch_invariant(), int8_products(self.int8):
            pooled = self.model.encode(input_ids, mask, pooling=pooling, layer=layer).pooled
        return pooled.float().cpu().numpy()
