"""A model folder and the one way to load it: :func:`load_pretrained`.

A model folder holds ``config.json``, ``vocab.json`` and ``model.safetensors`` (or its
shards), ``checksums.json``, and optionally ``normalization.json`` (how the corpus SMILES were
normalised), ``embedding.json`` (the pooling its embeddings are served with, measured for that
model: ``cls`` when absent, and whether they are whitened), ``whitening.safetensors`` (the
corpus whitening of each pooling, :mod:`smiexlm.whitening`), ``descriptors.json`` (the
descriptor head's statistics) and ``MODEL_CARD.md``.
Every caller that needs a model with its tokenizer (featurizer, fine-tuning, probe, predict,
export, the analyses, GLUE) loads it here, so a model is always served with the vocabulary
and the SMILES normalisation it was trained with.

>>> pre = load_pretrained()                      # the shipped default model
>>> prepared = pre.inputs().prepare(["OCC", "CCO"])
>>> prepared.texts                               # the corpus normalisation: canonical SMILES
['CCO', 'CCO']
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smiexlm.data.normalize import NormalizeConfig
from smiexlm.errors import ConfigError, DataError
from smiexlm.model.checkpoint import (
    CARD_NAME,
    EMBEDDING_NAME,
    NORMALIZATION_NAME,
    VOCAB_NAME,
    WEIGHTS_NAME,
)
from smiexlm.paths import ASSETS_DIR, check_not_a_file, write_text_atomic
from smiexlm.whitening import WHITENING_NAME, Whitening, load_whitening

if TYPE_CHECKING:  # pragma: no cover
    from smiexlm.model.inputs import ModelInputs
    from smiexlm.model.model import ExLMModel
    from smiexlm.tokenizer import Tokenizer

DEFAULT_MODEL_DIR = ASSETS_DIR / "default_model"
# The preprocessing defaults without the corpus' size limits (serving rejects nothing for
# size here; the model's max_positions is checked on its own).
DEFAULT_NORMALIZATION = NormalizeConfig(max_length=None)
# A fenced block in the model card: ```json normalization\n{...}\n```
_CARD_BLOCK = re.compile(r"```json\s+normalization\s*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class EmbeddingSettings:
    """How a model folder serves its embeddings when a caller names nothing (``embedding.json``):
    the pooling (chosen by measurement; cls without a file; several joined by ``+`` are served
    side by side) and whether they are whitened (``whitening.safetensors``, written by ``smiexlm whiten``)."""

    pooling: str = "cls"
    whiten: bool = False


@dataclass(frozen=True)
class Pretrained:
    """A model with what serves it: tokenizer, SMILES normalisation, and where it came from.

    ``path`` is None for a model built in memory (a random initialisation)."""

    model: ExLMModel
    tokenizer: Tokenizer
    normalization: NormalizeConfig = DEFAULT_NORMALIZATION
    normalization_source: str = "default"
    path: Path | None = None
    embedding: EmbeddingSettings = EmbeddingSettings()  # pooling, whiten (embedding.json)
    whitening: dict[str, Whitening] | None = None  # by pooling (whitening.safetensors)

    @property
    def pooling(self) -> str:
        return self.embedding.pooling

    @property
    def card(self) -> str | None:
        """The text of the folder's ``MODEL_CARD.md``, or None."""
        card = None if self.path is None else self.path / CARD_NAME
        return card.read_text(encoding="utf-8") if card is not None and card.is_file() else None

    @property
    def is_default(self) -> bool:
        return self.path is not None and self.path.resolve() == DEFAULT_MODEL_DIR.resolve()

    def inputs(self) -> ModelInputs:
        """The input path of this model: SMILES to rows as its corpus was prepared."""
        from smiexlm.model.inputs import ModelInputs

        return ModelInputs(self.tokenizer, self.model.config, self.normalization)


def shipped_models() -> dict[str, Path]:
    """The model folders inside the package, by name: ``default`` and each of ``twins/``
    (``exlm``, ``mlm``, ``maelm``, ...; their cards are in ``smiexlm/assets/README.md``)."""
    twins = ASSETS_DIR / "twins"
    folders = (
        sorted(p for p in twins.iterdir() if (p / WEIGHTS_NAME).is_file()) if twins.is_dir() else []
    )
    return {"default": DEFAULT_MODEL_DIR} | {p.name: p for p in folders}


def is_shipped(path: str | Path) -> bool:
    """Whether ``path`` lies inside the package's assets: the shipped models are read-only."""
    return Path(path).expanduser().resolve().is_relative_to(ASSETS_DIR.resolve())


def model_folder(path: str | Path | None) -> Path:
    """The folder to load: ``path`` when it exists, else the shipped model of that name
    (:func:`shipped_models`); the shipped default model when None."""
    if path is None or (str(path) == "default" and not Path(path).exists()):
        if not (DEFAULT_MODEL_DIR / WEIGHTS_NAME).is_file():
            raise DataError(
                "the default model is not installed: expected config.json, vocab.json and "
                "model.safetensors in smiexlm/assets/default_model/ inside the package; "
                "pass a model folder instead (e.g. Featurizer.from_pretrained('path/to/model'))"
            )
        return DEFAULT_MODEL_DIR
    folder = check_not_a_file(path)
    if folder.exists():
        return folder
    shipped = shipped_models()
    if str(path) in shipped:
        return shipped[str(path)]
    raise DataError(
        f"model folder {str(path)!r} does not exist, and it is not the name of a shipped "
        f"model ({', '.join(shipped)}): expected a folder written by `smiexlm export` or "
        "`save_pretrained`"
    )


def load_pretrained(path: str | Path | None = None) -> Pretrained:
    """The model (eval mode, on the CPU), tokenizer and normalisation of a model folder;
    ``path=None`` loads the shipped default model. No network is used; every file is checked
    (vocabulary, shapes, sha256, finite weights) before the model is allocated."""
    from smiexlm.model.model import ExLMModel
    from smiexlm.tokenizer import load_tokenizer

    directory = model_folder(path)
    model = ExLMModel.from_pretrained(directory)
    tokenizer = load_tokenizer(directory / VOCAB_NAME)
    normalization, source = read_normalization(directory)
    whitening = load_whitening(directory, model.config.d_model)
    return Pretrained(model, tokenizer, normalization, source, directory,
                      read_embedding(directory), whitening)  # fmt: skip


def read_embedding(directory: Path) -> EmbeddingSettings:
    """The :class:`EmbeddingSettings` of a model folder."""
    from smiexlm.model.pooling import pooling_parts

    path = Path(directory) / EMBEDDING_NAME
    if not path.is_file():
        return EmbeddingSettings()
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        pooling, whiten = doc.get("pooling"), doc.get("whiten", False)
    except (json.JSONDecodeError, AttributeError):
        raise DataError(
            f'{str(path)!r}: expected a JSON object such as {{"pooling": "mean", "whiten": true}}'
        ) from None
    pooling_parts(pooling, f"pooling (in {path})")
    if not isinstance(whiten, bool):
        raise ConfigError(f"whiten (in {path})", whiten, "true or false")
    if whiten and not (Path(directory) / WHITENING_NAME).is_file():
        raise DataError(f"{str(path)!r} says whiten, but the folder has no {WHITENING_NAME}: "
                        "run `smiexlm whiten` on it")  # fmt: skip
    return EmbeddingSettings(pooling, whiten)


def write_embedding(directory: Path, pooling: str, whiten: bool = False) -> Path:
    """``embedding.json`` of a model folder (what :func:`read_embedding` reads)."""
    from smiexlm.model.pooling import pooling_parts

    pooling_parts(pooling)
    path = Path(directory) / EMBEDDING_NAME
    doc = {"pooling": pooling} | ({"whiten": True} if whiten else {})
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")
    return path


def read_normalization(directory: Path) -> tuple[NormalizeConfig, str]:
    """How a model's corpus was normalised, and where that was read from.

    From ``normalization.json`` in the folder, or from a fenced ````` ```json normalization `````
    block in its ``MODEL_CARD.md``; without either, the preprocessing defaults apply (RDKit
    canonical SMILES, stereo kept, salts kept). Only the steps that rewrite a SMILES
    (``canonicalize``, ``strip_salts``) are applied when serving; the corpus' size limits
    are not.
    """
    path = Path(directory) / NORMALIZATION_NAME
    if path.is_file():
        return _normalization_from_json(path.read_text(encoding="utf-8"), str(path)), str(path)
    card = Path(directory) / CARD_NAME
    if card.is_file():
        match = _CARD_BLOCK.search(card.read_text(encoding="utf-8"))
        if match:
            source = f"{card} (normalization block)"
            return _normalization_from_json(match.group(1), source), source
    return DEFAULT_NORMALIZATION, "default"


def write_normalization(directory: Path, normalization: NormalizeConfig) -> Path:
    """``normalization.json`` of a model folder (what :func:`read_normalization` reads)."""
    doc = {"canonicalize": normalization.canonicalize, "strip_salts": normalization.strip_salts}
    path = Path(directory) / NORMALIZATION_NAME
    write_text_atomic(path, json.dumps(doc, indent=1) + "\n")
    return path


def _normalization_from_json(text: str, source: str) -> NormalizeConfig:
    try:
        doc: Any = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"normalisation record {source!r} is not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise DataError(f"normalisation record {source!r}: expected a JSON object")
    values = {}
    for key in ("canonicalize", "strip_salts"):
        value = doc.get(key, getattr(DEFAULT_NORMALIZATION, key))
        if not isinstance(value, bool):
            raise ConfigError(key, value, f"true or false (in {source})")
        values[key] = value
    return dataclasses.replace(DEFAULT_NORMALIZATION, **values)
