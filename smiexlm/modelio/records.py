"""The small JSON records of a model folder, read and written: ``embedding.json`` (the pooling
served by default and whether it is whitened), ``normalization.json`` (how the corpus SMILES
were normalised, or a block in ``MODEL_CARD.md``), ``corpus_tokens.json`` (how often each
token occurred in what the weights were trained on) and ``onnx.json`` (the ONNX graphs beside
the weights). :class:`smiexlm.modelio.folder.ModelFolder` reads them for a folder; the writers
are the exporters (``smiexlm export``, ``smiexlm whiten``, fine-tuning, ``export-onnx``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.atomic import write_text_atomic
from smiexlm.data.normalize import REWRITES, NormalizeConfig
from smiexlm.errors import ConfigError, DataError
from smiexlm.model.pooling import pooling_parts
from smiexlm.modelio.layout import (
    CARD_NAME,
    CORPUS_TOKENS_NAME,
    EMBEDDING_NAME,
    NORMALIZATION_NAME,
    ONNX_MANIFEST_NAME,
    WHITENING_NAME,
)
from smiexlm.paths import read_json_file

# The preprocessing defaults without the corpus' size limits (serving rejects nothing for
# size here; the model's max_positions is checked on its own).
DEFAULT_NORMALIZATION = NormalizeConfig(max_length=None)
# /2: the encoder returns every pooling of one pass; /3: of every block
ONNX_MANIFEST_FORMAT = "smiexlm-onnx/3"
CORPUS_TOKENS_FORMAT = "smiexlm-corpus-tokens/1"
# A fenced block in the model card: ```json normalization\n{...}\n```
_CARD_BLOCK = re.compile(r"```json\s+normalization\s*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class EmbeddingSettings:
    """How a model folder serves its embeddings when a caller names nothing (``embedding.json``):
    the pooling (chosen by measurement; cls without a file; several joined by ``+`` are served
    side by side), of how many of the last blocks (side by side, the last first), and whether
    they are whitened (``whitening.safetensors``, written by ``smiexlm whiten``)."""

    pooling: str = "cls"
    whiten: bool = False
    layers: int = 1


def read_embedding(folder: Path) -> EmbeddingSettings:
    """The :class:`EmbeddingSettings` of a model folder."""
    path = Path(folder) / EMBEDDING_NAME
    if not path.is_file():
        return EmbeddingSettings()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        pooling, whiten, layers = doc.get("pooling"), doc.get("whiten", False), doc.get("layers", 1)
    except (json.JSONDecodeError, AttributeError):
        raise DataError(
            f'{str(path)!r}: expected a JSON object such as {{"pooling": "mean", "whiten": true}}'
        ) from None
    pooling_parts(pooling, f"pooling (in {path})")
    if not isinstance(whiten, bool):
        raise ConfigError(f"whiten (in {path})", whiten, "true or false")
    if type(layers) is not int or layers < 1:
        raise ConfigError(f"layers (in {path})", layers, "a positive number of last blocks")
    if whiten and not (Path(folder) / WHITENING_NAME).is_file():
        raise DataError(f"{str(path)!r} says whiten, but the folder has no {WHITENING_NAME}: "
                        "run `smiexlm whiten` on it")  # fmt: skip
    return EmbeddingSettings(pooling, whiten, layers)


def write_embedding(folder: Path, pooling: str, whiten: bool = False, layers: int = 1) -> Path:
    """``embedding.json`` of a model folder (what :func:`read_embedding` reads)."""
    pooling_parts(pooling)
    path = Path(folder) / EMBEDDING_NAME
    doc = {"pooling": pooling} | ({"whiten": True} if whiten else {})
    doc |= {"layers": layers} if layers != 1 else {}
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")
    return path


def read_normalization(folder: Path) -> tuple[NormalizeConfig, str]:
    """How a model's corpus was normalised, and where that was read from.

    From ``normalization.json`` in the folder, or from a fenced ````` ```json normalization `````
    block in its ``MODEL_CARD.md``; without either, the preprocessing defaults apply (RDKit
    canonical SMILES, stereo kept, salts kept). Only the steps that rewrite a SMILES
    (``canonicalize``, ``strip_salts``, ``strip_stereo``) are applied when serving; the
    corpus' size limits are not.
    """
    path = Path(folder) / NORMALIZATION_NAME
    if path.is_file():
        return _normalization_from_json(path.read_text(encoding="utf-8"), str(path)), str(path)
    card = Path(folder) / CARD_NAME
    if card.is_file():
        match = _CARD_BLOCK.search(card.read_text(encoding="utf-8"))
        if match:
            source = f"{card} (normalization block)"
            return _normalization_from_json(match.group(1), source), source
    return DEFAULT_NORMALIZATION, "default"


def write_normalization(folder: Path, normalization: NormalizeConfig) -> Path:
    """``normalization.json`` of a model folder (what :func:`read_normalization` reads)."""
    doc = {name: getattr(normalization, name) for name in REWRITES}
    path = Path(folder) / NORMALIZATION_NAME
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")
    return path


def _normalization_from_json(text: str, source: str) -> NormalizeConfig:
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"normalisation record {source!r} is not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise DataError(f"normalisation record {source!r}: expected a JSON object")
    if unknown := sorted(set(doc) - set(REWRITES)):
        raise DataError(
            f"normalisation record {source!r}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"expected {', '.join(REWRITES)}"
        )
    values = {}
    for key in REWRITES:
        value = doc.get(key, getattr(DEFAULT_NORMALIZATION, key))
        if not isinstance(value, bool):
            raise ConfigError(key, value, f"true or false (in {source})")
        values[key] = value
    return dataclasses.replace(DEFAULT_NORMALIZATION, **values)


def write_corpus_tokens(folder: Path, tokens: Sequence[str], counts: np.ndarray, source: str) -> Path:  # fmt: skip
    """``corpus_tokens.json`` of a model folder: how often each vocabulary token (``tokens``,
    in id order) occurred in what its weights were trained on (``counts``, one per token),
    and what that was (``source``). Tokens that never occurred are left out: their embeddings
    are where initialisation put them."""
    counts = np.asarray(counts)
    if counts.shape != (len(tokens),):
        raise DataError(f"corpus token counts: {counts.shape} for {len(tokens)} tokens: "
                        "expected one count per vocabulary token")  # fmt: skip
    doc = {"format": CORPUS_TOKENS_FORMAT, "source": source, "tokens": int(counts.sum()),
           "counts": {t: int(c) for t, c in zip(tokens, counts, strict=True) if c > 0}}  # fmt: skip
    path = Path(folder) / CORPUS_TOKENS_NAME
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")
    return path


def read_corpus_tokens(folder: Path, vocabulary: Mapping[str, int]) -> np.ndarray | None:
    """(V,) int64 counts per token id of a folder's ``corpus_tokens.json``, or None when it
    has none (exported before the record was kept, or without its corpus)."""
    path = Path(folder) / CORPUS_TOKENS_NAME
    if not path.is_file():
        return None
    _, doc = read_json_file(path, "corpus token record", CORPUS_TOKENS_FORMAT)
    listed = doc.get("counts")
    if not isinstance(listed, dict):
        raise DataError(f"corpus token record {str(path)!r}: expected 'counts' to be a JSON "
                        'object such as {"C": 1200, "c": 900}')  # fmt: skip
    counts = np.zeros(len(vocabulary), dtype=np.int64)
    for token, count in listed.items():
        if token not in vocabulary:
            raise DataError(f"corpus token record {str(path)!r}: token {token!r} is not in the "
                            "folder's vocabulary: the record belongs to another model")  # fmt: skip
        if type(count) is not int or count < 0:
            raise ConfigError(f"counts[{token!r}] (in {path})", count, "a count, 0 or more")
        counts[vocabulary[token]] = count
    return counts


def read_onnx_manifest(folder: Path) -> dict[str, Any] | None:
    """``onnx.json`` of a model folder (the graphs :mod:`smiexlm.embedding.onnx_export` wrote),
    or None when it has none."""
    path = Path(folder) / ONNX_MANIFEST_NAME
    if not path.is_file():
        return None
    _, doc = read_json_file(path, "ONNX record")
    if doc.get("format") != ONNX_MANIFEST_FORMAT:
        raise DataError(
            f"ONNX record {str(path)!r} has format {doc.get('format')!r}: expected "
            f"{ONNX_MANIFEST_FORMAT!r}; write the graphs again with `smiexlm export-onnx {folder}`"
        )
    if not isinstance(doc.get("graphs"), dict):
        raise DataError(f"ONNX record {str(path)!r}: expected 'graphs' to be a JSON object")
    return doc
