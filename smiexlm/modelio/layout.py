"""The layout of a model folder: the name of every file in it, where a path or a shipped
model's name resolves to, and which folder is the shipped default.

A pre-trained model folder holds::

    config.json            the model's config (ExLMConfig)
    vocab.json             its tokenizer's vocabulary
    model.safetensors      the weights (or model.safetensors.index.json and its shards)
    checksums.json         the sha256 of each weight file, checked on every load
    normalization.json     how the corpus SMILES were normalised (optional)
    embedding.json         the pooling served by default, and whether it is whitened (optional)
    whitening.safetensors  the corpus whitening of each pooling (optional, `smiexlm whiten`)
    descriptors.json       the descriptor head's statistics (optional)
    corpus_tokens.json     each token's count in what the weights were trained on (optional)
    MODEL_CARD.md          the model card (optional; may hold a normalisation block)
    onnx.json              the ONNX graphs written beside the weights (optional) and
    encoder.onnx           the encoder graph it records

A fine-tuned folder is a model folder (its backbone) plus ``finetune.json`` (task, labels,
target scaling), ``head.safetensors``, ``reference.safetensors`` (applicability domain and
calibration), ``forest.skops`` (with ``finetune --forest``) and, once exported,
``predictor.onnx``.

The names are defined here and nowhere else, so one module says what a folder is; the
folder's reader is :class:`smiexlm.modelio.folder.ModelFolder`. ``vocab.json`` and
``descriptors.json`` are also files of a dataset folder, so their names live lower, beside
the code that reads them there (:mod:`smiexlm.paths`, :mod:`smiexlm.chemistry.descriptor_stats`).
"""

from __future__ import annotations

from pathlib import Path

from smiexlm.chemistry.descriptor_stats import STATS_NAME
from smiexlm.errors import ConfigError, DataError
from smiexlm.paths import ASSETS_DIR, VOCAB_NAME, check_not_a_file

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"  # the index of sharded weights
CHECKSUMS_NAME = "checksums.json"
NORMALIZATION_NAME = "normalization.json"  # how the corpus SMILES were normalised
EMBEDDING_NAME = "embedding.json"  # the pooling the model's embeddings are served with
WHITENING_NAME = "whitening.safetensors"
CARD_NAME = "MODEL_CARD.md"
FINETUNE_NAME = "finetune.json"  # a fine-tuned folder's record
HEAD_NAME = "head.safetensors"
REFERENCE_NAME = "reference.safetensors"
FOREST_NAME = "forest.skops"  # the forest blended with a fine-tuned model (finetune --forest)
KERNELS_NAME = "kernels.safetensors"  # a regression folder's kernel members
EMBEDDER_DIR = "embedder"  # the model folder of their frozen embedding
ONNX_MANIFEST_NAME = "onnx.json"
CORPUS_TOKENS_NAME = "corpus_tokens.json"  # what the weights were trained on, token by token
GRAPH_FILES: dict[str, str] = {"encoder": "encoder.onnx", "predictor": "predictor.onnx"}
# The weight files an ONNX graph is exported from (its record keeps their sha256).
GRAPH_SOURCES = (WEIGHTS_NAME, HEAD_NAME)
# Every file a model folder may hold, in the order of the module docstring.
FILES = (
    CONFIG_NAME, VOCAB_NAME, WEIGHTS_NAME, WEIGHTS_INDEX_NAME, CHECKSUMS_NAME,
    NORMALIZATION_NAME, EMBEDDING_NAME, WHITENING_NAME, STATS_NAME, CORPUS_TOKENS_NAME, CARD_NAME,
    ONNX_MANIFEST_NAME, *GRAPH_FILES.values(), FINETUNE_NAME, HEAD_NAME, REFERENCE_NAME,
    FOREST_NAME,
)  # fmt: skip

DEFAULT_MODEL_DIR = ASSETS_DIR / "default_model"
TWINS_DIR = ASSETS_DIR / "twins"  # the shipped twins of the default model, one per objective


def shipped_models() -> dict[str, Path]:
    """The model folders inside the package, by name: ``default`` and each of ``twins/``
    (``exlm``, ``mlm``, ``maelm``, ...; their cards are in ``smiexlm/assets/README.md``)."""
    folders = (
        sorted(p for p in TWINS_DIR.iterdir() if (p / WEIGHTS_NAME).is_file())
        if TWINS_DIR.is_dir()
        else []
    )
    return {"default": DEFAULT_MODEL_DIR} | {p.name: p for p in folders}


def is_shipped(path: str | Path) -> bool:
    """Whether ``path`` lies inside the package's assets: the shipped models are read-only."""
    return Path(path).expanduser().resolve().is_relative_to(ASSETS_DIR.resolve())


def is_default(path: str | Path | None) -> bool:
    """Whether ``path`` is the shipped default model's folder (None, a model built in memory,
    is not)."""
    return path is not None and Path(path).expanduser().resolve() == DEFAULT_MODEL_DIR.resolve()


def model_folder(path: str | Path | None) -> Path:
    """The folder to load: ``path`` when it exists, else the shipped model of that name
    (:func:`shipped_models`); the shipped default model when None."""
    if path is not None and not isinstance(path, (str, Path)):
        raise ConfigError("checkpoint", path, "a model folder's path, a shipped model's name, "
                          "or None for the default model")  # fmt: skip
    if path is None or (str(path) == "default" and not Path(path).exists()):
        if not (DEFAULT_MODEL_DIR / WEIGHTS_NAME).is_file():
            raise DataError(
                f"the default model is not installed: expected {CONFIG_NAME}, {VOCAB_NAME} and "
                f"{WEIGHTS_NAME} in smiexlm/assets/default_model/ inside the package; "
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
