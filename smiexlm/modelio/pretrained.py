"""The one way to load a model folder's weights: :func:`load_pretrained` (and
:func:`load_finetuned` for a fine-tuned folder, which loads its backbone the same way).

Every caller that needs a model with its tokenizer (featurizer, fine-tuning, probe, predict,
export, the analyses, GLUE) loads it here, so a model is always served with the vocabulary
and the SMILES normalisation it was trained with. The public entry points are thin doors to
this path: ``ExLMModel.from_pretrained`` (the weights alone), ``Featurizer.from_pretrained``
and ``Backbone`` (fine-tuning and the probe). What a folder holds is
:mod:`smiexlm.modelio.layout`; its reader is :class:`~smiexlm.modelio.folder.ModelFolder`.

>>> pre = load_pretrained()                      # the shipped default model
>>> prepared = pre.inputs().prepare(["OCC", "CCO"])
>>> prepared.texts                               # the corpus normalisation: canonical SMILES
['CCO', 'CCO']
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smiexlm.modelio.folder import FinetunedFolder, ModelFolder
from smiexlm.modelio.layout import FINETUNE_NAME
from smiexlm.modelio.records import DEFAULT_NORMALIZATION, EmbeddingSettings

if TYPE_CHECKING:  # pragma: no cover
    from smiexlm.data.normalize import NormalizeConfig
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.inputs import ModelInputs
    from smiexlm.model.model import ExLMModel
    from smiexlm.tokenizer import Tokenizer
    from smiexlm.whitening import Whitening


@dataclass(frozen=True)
class Pretrained:
    """A model with its tokenizer and the folder it was loaded from.

    ``folder`` is None for a model built in memory (a random initialisation, or one being
    trained): it is then served with the default normalisation and cls pooling, unwhitened.
    ``Pretrained(model, tokenizer)`` is how such a model reaches the featurizer:
    ``Featurizer(Pretrained(model, tokenizer))``."""

    model: ExLMModel
    tokenizer: Tokenizer
    folder: ModelFolder | None = None

    @property
    def path(self) -> Path | None:
        return None if self.folder is None else self.folder.path

    @property
    def normalization(self) -> NormalizeConfig:
        return DEFAULT_NORMALIZATION if self.folder is None else self.folder.normalization

    @property
    def normalization_source(self) -> str:
        return "default" if self.folder is None else self.folder.normalization_source

    @property
    def embedding(self) -> EmbeddingSettings:
        """The pooling served by default and whether it is whitened (``embedding.json``)."""
        return EmbeddingSettings() if self.folder is None else self.folder.embedding

    @property
    def pooling(self) -> str:
        return self.embedding.pooling

    @property
    def whitening(self) -> dict[str, Whitening] | None:
        """The corpus whitening of each pooling (``whitening.safetensors``), or None."""
        return None if self.folder is None else self.folder.whitening

    @property
    def card(self) -> str | None:
        """The text of the folder's ``MODEL_CARD.md``, or None."""
        return None if self.folder is None else self.folder.card

    @property
    def is_default(self) -> bool:
        return self.folder is not None and self.folder.is_default

    def inputs(self) -> ModelInputs:
        """The input path of this model: SMILES to rows as its corpus was prepared."""
        from smiexlm.model.inputs import ModelInputs

        corpus = None if self.folder is None else self.folder.corpus_tokens
        return ModelInputs(self.tokenizer, self.model.config, self.normalization, corpus)


def load_pretrained(path: str | Path | ModelFolder | None = None) -> Pretrained:
    """The model (eval mode, on the CPU), tokenizer and folder of a model folder (a path, a
    shipped model's name, or a :class:`ModelFolder` already open); ``path=None`` loads the
    shipped default model. No network is used; every file is checked (vocabulary, shapes,
    sha256, finite weights) before the model is allocated, and the whitening and embedding
    settings are read and checked too."""
    from smiexlm.model.model import ExLMModel

    folder = path if isinstance(path, ModelFolder) else ModelFolder(path)
    model = ExLMModel.from_pretrained(folder.path)
    return Pretrained(model, folder.tokenizer, folder.read_records())


def load_finetuned(
    directory: Path | str | FinetunedFolder, device: str = "auto"
) -> tuple[ExLMForSequencePrediction, ModelInputs, dict[str, Any]]:
    """(model, inputs, meta) from a fine-tuned folder: the model in eval mode, its
    :class:`~smiexlm.model.inputs.ModelInputs` (vocabulary and normalisation) and
    ``finetune.json``; each file is checked first (``finetune.json``'s keys and values, the
    weights' shapes, and the sha256 of both)."""
    from smiexlm.device import resolve_device
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.modelio.weights import load_module_weights

    folder = directory if isinstance(directory, FinetunedFolder) else FinetunedFolder(directory)
    meta = folder.meta
    head_type = "multilabel" if meta["task_type"] == "classification" else "regression"
    pre = load_pretrained(folder)
    model = ExLMForSequencePrediction(
        pre.model, meta["n_outputs"], head_type, 0.0, meta["pooling"],
        n_features=meta["n_features"], layers=meta["layers"], head=meta["head"],
    )  # fmt: skip
    load_module_weights(model.head, folder.head_path, f"{FINETUNE_NAME} and the backbone")
    return model.to(resolve_device(device)).eval(), pre.inputs(), meta
