"""Where a fine-tuned or probed encoder comes from: a model folder, or a random init.

A :class:`Backbone` hands fine-tuning and the probe what the featurizer uses for the same
folder (its :class:`~smiexlm.modelio.folder.ModelFolder`, and
:func:`~smiexlm.modelio.pretrained.load_pretrained` for the weights): the vocabulary, the
corpus normalisation and the weights, so a model is fine-tuned on SMILES prepared as it was
pretrained on, and ``predict`` serves them prepared the same way.

Without a model folder the backbone is the shipped default model; a random init of a preset is
used only when asked (``Backbone(random_init=True)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from torch import nn

from smiexlm.data.normalize import NormalizeConfig
from smiexlm.errors import ConfigError, DataError
from smiexlm.model.config import ExLMConfig
from smiexlm.model.inputs import ModelInputs, model_texts
from smiexlm.modelio.folder import ModelFolder
from smiexlm.modelio.pretrained import load_pretrained
from smiexlm.modelio.records import DEFAULT_NORMALIZATION


@dataclass
class Backbone:
    """A model folder, ``checkpoint`` (default: the shipped model), or, only with
    ``random_init=True``, a preset initialised at random (``objective`` is used only then). The
    folder is read once, by its :class:`~smiexlm.modelio.folder.ModelFolder` (:attr:`folder`)."""

    checkpoint: Path | None = None
    preset: str = "tiny"
    objective: str = "mlm"
    random_init: bool = False

    def __post_init__(self) -> None:
        if self.random_init and self.checkpoint is not None:
            raise ConfigError("random_init", True, "no checkpoint (it ignores the weights)")
        if not self.random_init:  # a folder, a shipped model's name, or None: the default
            self.checkpoint = ModelFolder(self.checkpoint).path
            self.folder.check_reads_smiles()

    @cached_property
    def folder(self) -> ModelFolder | None:
        """The model folder's reader (None for a random init)."""
        return None if self.checkpoint is None else ModelFolder(self.checkpoint)

    @property
    def name(self) -> str:
        if self.checkpoint is not None:
            return Path(self.checkpoint).name
        return f"random-init {self.preset} ({self.objective})"

    @cached_property
    def weights_sha256(self) -> str | None:
        """The sha256 of the folder's weights (as its ``checksums.json`` records it, else
        hashed): with :attr:`name`, what identifies the backbone of a result or a kept state,
        so a folder re-exported under the same name is not taken for the one they came from.
        None for a random init."""
        from smiexlm.modelio.integrity import weights_sha256

        return None if self.folder is None else weights_sha256(self.folder.path)

    @property
    def normalization(self) -> NormalizeConfig:
        """The model folder's corpus normalisation (the defaults for a random init)."""
        return DEFAULT_NORMALIZATION if self.folder is None else self.folder.normalization

    @property
    def pooling(self) -> str:
        """The model folder's embedding pooling (``embedding.json``; cls for a random init)."""
        return "cls" if self.folder is None else self.folder.embedding.pooling

    @property
    def layers(self) -> int:
        """The last blocks the model folder's embedding puts side by side (1 for a random
        init)."""
        return 1 if self.folder is None else self.folder.embedding.layers

    def whitening(self, pooling: str, layers: int = 1):
        """The model folder's corpus whitening for ``pooling`` of the last ``layers`` blocks
        (None without one; one block of a combined pooling: its own, or each part by its
        own)."""
        from smiexlm.whitening import pooling_whitening

        if self.folder is None:
            return None
        return pooling_whitening(self.folder.whitening or {}, pooling, layers)

    def model_texts(self, smiles: Sequence[str], canonicalize: bool = True) -> list[str]:
        """What the model reads: each SMILES normalised as the model folder's corpus was (as
        written when not ``canonicalize``). Each must be parsable: a task's table is checked
        when it is read, so a failure here raises, naming the input."""
        return model_texts(smiles, self.normalization, canonicalize)

    def tokenizer(self, corpus: Sequence[str]):
        """The model folder's vocabulary; for random init the shipped one, else one built from
        ``corpus`` (the dataset's SMILES: vocabulary only, no labels)."""
        from smiexlm.tokenizer import SmilesTokenizer

        if self.folder is not None:
            return self.folder.tokenizer
        try:
            return SmilesTokenizer()
        except DataError:
            return SmilesTokenizer.build(corpus)

    def config(self, tokenizer) -> ExLMConfig:
        """The model folder's config (a copy: callers may change it), or the preset's."""
        if self.folder is not None:
            return dataclasses.replace(self.folder.config)
        return ExLMConfig.preset(
            self.preset, vocab_size=tokenizer.vocab_size, objective=self.objective,
            vocab_hash=tokenizer.vocab_hash,
        )  # fmt: skip

    def inputs(self, tokenizer) -> ModelInputs:
        """The input path of this backbone (rows of :meth:`model_texts`)."""
        corpus = None if self.folder is None else self.folder.corpus_tokens
        return ModelInputs(tokenizer, self.config(tokenizer), self.normalization, corpus)

    def build(self, tokenizer, dropout: float):
        """A fresh encoder (weights read again for each seed) with ``dropout`` everywhere."""
        from smiexlm.model.model import ExLMModel

        if self.folder is not None:
            model = load_pretrained(self.folder).model
        else:
            model = ExLMModel(self.config(tokenizer))
        model.config.dropout = dropout
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = dropout
        return model
