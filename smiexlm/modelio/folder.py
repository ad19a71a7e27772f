"""The one reader of a model folder: :class:`ModelFolder`, and :class:`FinetunedFolder` for a
fine-tuned one (which also reads and checks ``finetune.json``).

A reader resolves its path once (a folder, a shipped model's name, or None for the shipped
default; :func:`smiexlm.modelio.layout.model_folder`) and reads each file when first asked, once:
the config, the tokenizer (its vocabulary checked against the config), the normalisation and
where it was read from, the embedding settings, the whitening, the corpus token counts, the
card and the ONNX record.
Loading the weights is :func:`smiexlm.modelio.pretrained.load_pretrained`'s job, which keeps
the reader beside the model it loaded.

>>> folder = ModelFolder()                       # the shipped default model
>>> folder.is_default, folder.embedding.pooling
(True, 'cls+mean+max')
"""

from __future__ import annotations

import math
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smiexlm.errors import ConfigError, DataError
from smiexlm.model.heads import HEAD_KINDS
from smiexlm.model.pooling import POOLINGS, pooling_parts
from smiexlm.modelio.layout import (
    CARD_NAME,
    CONFIG_NAME,
    FINETUNE_NAME,
    HEAD_NAME,
    NORMALIZATION_NAME,
    WEIGHTS_NAME,
    is_default,
    model_folder,
)
from smiexlm.modelio.records import (
    EmbeddingSettings,
    read_corpus_tokens,
    read_embedding,
    read_normalization,
    read_onnx_manifest,
)
from smiexlm.paths import VOCAB_NAME, check_not_a_file, read_json_file

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from smiexlm.data.normalize import NormalizeConfig
    from smiexlm.model.config import ExLMConfig
    from smiexlm.model.inputs import ModelInputs
    from smiexlm.tokenizer import Tokenizer
    from smiexlm.whitening import Whitening

TASK_TYPES = ("classification", "regression")  # the task_type of a fine-tuned folder


class ModelFolder:
    """A model folder, each file read once when first asked for (see the module docstring).

    ``path`` is a folder, the name of a shipped model (``default``, ``exlm``, ...), or None
    for the shipped default model."""

    def __init__(self, path: str | Path | None = None):
        self.path = model_folder(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r})"

    @property
    def is_default(self) -> bool:
        """Whether this is the shipped default model (:func:`~smiexlm.modelio.layout.is_default`)."""
        return is_default(self.path)

    @property
    def is_finetuned(self) -> bool:
        """Whether the folder holds a fine-tuned model (``finetune.json``)."""
        return (self.path / FINETUNE_NAME).is_file()

    @cached_property
    def config(self) -> ExLMConfig:
        """``config.json``; DataError when the folder has none."""
        from smiexlm.model.config import ExLMConfig

        path = self.path / CONFIG_NAME
        if not path.is_file():
            raise DataError(
                f"model folder {str(self.path)!r} has no {CONFIG_NAME}: expected a folder "
                f"written by `smiexlm export` or `save_pretrained` ({CONFIG_NAME}, {VOCAB_NAME}, "
                f"{WEIGHTS_NAME})"
            )
        return ExLMConfig.load(path)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer of ``vocab.json``, its size and token hash checked against the config."""
        from smiexlm.modelio.weights import check_folder_vocabulary
        from smiexlm.tokenizer import load_tokenizer

        check_folder_vocabulary(self.path, self.config)
        return load_tokenizer(self.path / VOCAB_NAME)

    def check_reads_smiles(self) -> None:
        """A ConfigError naming the folder when its model reads text, not SMILES (a GLUE
        model): its vocabulary would cut a SMILES into word pieces it never learned."""
        from smiexlm.tokenizer import SmilesTokenizer

        tokenizer = self.tokenizer
        if not isinstance(tokenizer, SmilesTokenizer):
            raise ConfigError("--checkpoint", str(self.path), "a SMILES model; this one reads "
                              f"text ({type(tokenizer).__name__} vocabulary): `smiexlm glue` "
                              "fine-tunes it")  # fmt: skip

    @cached_property
    def _normalization(self) -> tuple[NormalizeConfig, str]:
        return read_normalization(self.path)

    @property
    def normalization(self) -> NormalizeConfig:
        """How the corpus SMILES were normalised (:func:`~smiexlm.modelio.records.read_normalization`)."""
        return self._normalization[0]

    @property
    def normalization_source(self) -> str:
        """Where :attr:`normalization` was read from: a file, the card's block, or ``default``."""
        return self._normalization[1]

    @cached_property
    def embedding(self) -> EmbeddingSettings:
        """The pooling served by default and whether it is whitened (``embedding.json``)."""
        return read_embedding(self.path)

    @cached_property
    def whitening(self) -> dict[str, Whitening] | None:
        """The corpus whitening of each pooling it stores (None without
        ``whitening.safetensors``), checked against its sha256 and the model's width."""
        from smiexlm.modelio.whitening_file import load_whitening

        return load_whitening(self.path, self.config.d_model)

    def serves_whitened(self, pooling: str, layers: int) -> bool:
        """Whether the folder's own embedding of ``pooling`` of the last ``layers`` blocks is
        whitened: its ``embedding.json`` says so and it stores a whitening of them (or, for
        one block, of each part of the pooling). What a caller naming no ``whiten`` gets."""
        from smiexlm.whitening import can_whiten

        return self.embedding.whiten and can_whiten(self.whitening or {}, pooling, layers)

    @property
    def card(self) -> str | None:
        """The text of ``MODEL_CARD.md``, or None."""
        card = self.path / CARD_NAME
        return card.read_text(encoding="utf-8") if card.is_file() else None

    @cached_property
    def corpus_tokens(self) -> np.ndarray | None:
        """(V,) counts per token id in what the weights were trained on
        (``corpus_tokens.json``), or None when the folder keeps no such record."""
        return read_corpus_tokens(self.path, self.tokenizer.vocab)

    @cached_property
    def onnx_manifest(self) -> dict[str, Any] | None:
        """``onnx.json`` (the ONNX graphs written beside the weights), or None."""
        return read_onnx_manifest(self.path)

    def read_records(self) -> ModelFolder:
        """Itself, with its normalisation, whitening and embedding settings read now: a bad
        file fails here (when the model is loaded) rather than at first use."""
        self._normalization, self.whitening, self.embedding, self.corpus_tokens  # noqa: B018
        return self

    def inputs(self) -> ModelInputs:
        """The input path of this folder's model: SMILES to rows as its corpus was prepared."""
        from smiexlm.model.inputs import ModelInputs

        return ModelInputs(self.tokenizer, self.config, self.normalization, self.corpus_tokens)


class FinetunedFolder(ModelFolder):
    """A fine-tuned folder (a model folder plus ``finetune.json``, ``head.safetensors`` and
    ``reference.safetensors``), written by ``smiexlm finetune --save-dir``. ``what`` names the
    path in errors (the option it came from)."""

    def __init__(self, path: str | Path, what: str = "--checkpoint"):
        folder = check_not_a_file(path, what)
        if not (folder / FINETUNE_NAME).is_file():
            raise DataError(
                f"{what} {str(folder)!r}: no {FINETUNE_NAME}; expected a folder written by "
                "`smiexlm finetune --save-dir DIR` (DIR itself, which serves its seeds as an "
                "ensemble, or one of DIR/seed0, DIR/seed1, ...)"
            )
        self.path = folder

    @cached_property
    def meta(self) -> dict[str, Any]:
        """``finetune.json``, every key checked (:func:`read_finetune_meta`)."""
        return read_finetune_meta(self.path / FINETUNE_NAME)

    @property
    def head_path(self) -> Path:
        return self.path / HEAD_NAME

    @cached_property
    def _normalization(self) -> tuple[NormalizeConfig, str]:
        """``normalization.json`` checked against the sha256 the folder records and against
        the normalisation ``finetune.json`` records (folders saved before either was kept load
        without): the SMILES are served as the model was fine-tuned on them, or not at all."""
        from smiexlm.modelio.integrity import verify_checksum

        path = self.path / NORMALIZATION_NAME
        if path.is_file():
            verify_checksum(path, required=False)
        normalization, source = read_normalization(self.path)
        recorded = self.meta.get("normalization")
        if isinstance(recorded, dict):
            read = {name: getattr(normalization, name) for name in recorded}
            if read != recorded:
                raise DataError(
                    f"{source!r} says {read} but {str(self.path / FINETUNE_NAME)!r} records "
                    f"{recorded}: expected the normalisation the model was fine-tuned with"
                )
        return normalization, source


def read_finetune_meta(path: Path) -> dict[str, Any]:
    """``finetune.json`` as a dict; DataError naming the file, the key and what was expected.

    Every key ``predict`` reads is present and of the right kind, and the sizes agree (one
    label, target mean and target std per output; a feature scaler exactly when the head takes
    features), each target std is positive, and the file matches the sha256 its folder's
    ``checksums.json`` records (folders saved before the record covered it load without)."""
    from smiexlm.modelio.integrity import verify_checksum

    path, meta = read_json_file(path, "fine-tuned model record")

    def bad(key: str, expected: str) -> DataError:
        value = meta.get(key, "missing")
        return DataError(f"{str(path)!r}: key {key!r} is {value!r}: expected {expected}")

    if meta.get("task_type") not in TASK_TYPES:
        raise bad("task_type", f"one of {TASK_TYPES}")
    try:
        pooling_parts(meta.get("pooling"))
    except ConfigError:
        raise bad("pooling", f"one of {POOLINGS}, or several joined by '+'") from None
    n = meta.get("n_outputs")
    if type(n) is not int or n < 1:
        raise bad("n_outputs", "a positive integer")
    labels = meta.get("label_cols")
    if (
        not isinstance(labels, list)
        or len(labels) != n
        or not all(isinstance(x, str) for x in labels)
    ):
        raise bad("label_cols", f"a list of n_outputs = {n} column names")
    for key in ("target_mean", "target_std"):
        values = meta.get(key)
        if not isinstance(values, list) or len(values) != n or not all(_finite(v) for v in values):
            raise bad(key, f"a list of n_outputs = {n} finite numbers")
    if not all(v > 0 for v in meta["target_std"]):  # 0 makes every prediction the mean
        raise bad("target_std", f"a list of n_outputs = {n} positive numbers")
    if not isinstance(meta.get("config"), dict):
        raise bad("config", "an object (the fine-tuning config)")
    n_features = meta.setdefault("n_features", 0)
    if type(n_features) is not int or n_features < 0:
        raise bad("n_features", "a non-negative integer")
    layers = meta.setdefault("layers", 1)  # folders from before the option: the last block
    if type(layers) is not int or layers < 1:
        raise bad("layers", "a positive integer (the last blocks the head reads)")
    if meta.setdefault("head", "mlp") not in HEAD_KINDS:  # folders from before: fine-tuning's
        raise bad("head", f"one of {HEAD_KINDS} (the head's form)")
    scaler = meta.get("feature_scaler")
    if (n_features > 0) != isinstance(scaler, dict):
        raise bad("feature_scaler", f"an object exactly when n_features ({n_features}) > 0")
    if scaler and not _scaler_fits(scaler, n_features):
        raise DataError(
            f"{str(path)!r}: key 'feature_scaler' is not a scaler of {n_features} features: "
            "expected 'kind', 'clip' and 'median', 'mean', 'std' lists of that length"
        )
    verify_checksum(path, required=False)  # older folders record the weights only
    return meta


def _scaler_fits(scaler: dict, n_features: int) -> bool:
    arrays = [scaler.get(key) for key in ("median", "mean", "std")]
    sized = all(isinstance(a, list) and len(a) == n_features for a in arrays)
    return sized and isinstance(scaler.get("kind"), str) and _finite(scaler.get("clip"))


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
