"""Where a fine-tuned or probed encoder comes from: a model folder, or a random init.

A :class:`Backbone` hands fine-tuning and the probe what the featurizer uses for the same
folder (:func:`~smiexlm.model.pretrained.load_pretrained`): the weights, the vocabulary and
the corpus normalisation, so a model is fine-tuned on SMILES prepared as it was pretrained
on, and ``predict`` serves them prepared the same way.

Without a checkpoint the backbone is the shipped default model; a random init of a preset is
used only when asked (``Backbone(random_init=True)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from smiexlm.data.normalize import NormalizeConfig
from smiexlm.errors import ConfigError, DataError
from smiexlm.model.checkpoint import CONFIG_NAME, VOCAB_NAME
from smiexlm.model.config import ExLMConfig
from smiexlm.model.inputs import ModelInputs, model_texts
from smiexlm.model.pretrained import (
    DEFAULT_NORMALIZATION,
    load_pretrained,
    model_folder,
    read_embedding,
    read_normalization,
)


@dataclass
class Backbone:
    """A checkpoint folder (default: the shipped model), or, only with ``random_init=True``,
    a preset initialised at random (``objective`` is used only then)."""

    checkpoint: Path | None = None
    preset: str = "tiny"
    objective: str = "mlm"
    random_init: bool = False

    def __post_init__(self) -> None:
        if self.random_init and self.checkpoint is not None:
            raise ConfigError("random_init", True, "no checkpoint (it ignores the weights)")
        if not self.random_init:  # a folder, a shipped model's name, or None: the default
            self.checkpoint = model_folder(self.checkpoint)

    @property
    def name(self) -> str:
        if self.checkpoint is not None:
            return Path(self.checkpoint).name
        return f"random-init {self.preset} ({self.objective})"

    @property
    def normalization(self) -> NormalizeConfig:
        """The checkpoint's corpus normalisation (the defaults for a random init)."""
        if self.checkpoint is None:
            return DEFAULT_NORMALIZATION
        return read_normalization(Path(self.checkpoint))[0]

    @property
    def pooling(self) -> str:
        """The checkpoint's embedding pooling (``embedding.json``; cls for a random init)."""
        return "cls" if self.checkpoint is None else read_embedding(Path(self.checkpoint)).pooling

    def whitening(self, pooling: str):
        """The checkpoint's corpus whitening for ``pooling`` (None without one; a combined
        pooling: its own, or each part by its own)."""
        from smiexlm.whitening import load_whitening, pooling_whitening

        if self.checkpoint is None:
            return None
        config = ExLMConfig.load(Path(self.checkpoint) / CONFIG_NAME)
        return pooling_whitening(
            load_whitening(Path(self.checkpoint), config.d_model) or {}, pooling
        )

    def model_texts(self, smiles: Sequence[str], canonicalize: bool = True) -> list[str]:
        """What the model reads: each SMILES normalised as the checkpoint's corpus was (as
        written when not ``canonicalize``). Each must be parsable: a task's table is checked
        when it is read, so a failure here raises, naming the input."""
        return model_texts(smiles, self.normalization, canonicalize)

    def tokenizer(self, corpus: Sequence[str]):
        """The checkpoint's vocabulary; for random init the shipped one, else one built from
        ``corpus`` (the dataset's SMILES: vocabulary only, no labels)."""
        from smiexlm.tokenizer import SmilesTokenizer, load_tokenizer

        if self.checkpoint is not None:
            return load_tokenizer(Path(self.checkpoint) / VOCAB_NAME)
        try:
            return SmilesTokenizer()
        except DataError:
            return SmilesTokenizer.build(corpus)

    def config(self, tokenizer) -> ExLMConfig:
        if self.checkpoint is not None:
            return ExLMConfig.load(Path(self.checkpoint) / CONFIG_NAME)
        return ExLMConfig.preset(
            self.preset, vocab_size=tokenizer.vocab_size, objective=self.objective,
            vocab_hash=tokenizer.vocab_hash,
        )  # fmt: skip

    def inputs(self, tokenizer) -> ModelInputs:
        """The input path of this backbone (rows of :meth:`model_texts`)."""
        return ModelInputs(tokenizer, self.config(tokenizer), self.normalization)

    def build(self, tokenizer, dropout: float):
        """A fresh encoder (weights read again for each seed) with ``dropout`` everywhere."""
        from smiexlm.model.model import ExLMModel

        if self.checkpoint is not None:
            model = load_pretrained(self.checkpoint).model
        else:
            model = ExLMModel(self.config(tokenizer))
        model.config.dropout = dropout
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = dropout
        return model
