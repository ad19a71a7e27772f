"""The network: ``config`` (``ExLMConfig`` and its presets), ``encoder`` (attention blocks,
batch-invariant and int8 products), ``rope``, ``dropout``, ``pooling``, ``expansion`` (ExLM's
states), ``transitions`` (DAG edges), ``masking``, ``heads`` (language-model, sequence and
fine-tuning heads), ``inputs`` (SMILES to token rows) and ``model`` (``ExLMModel``). It reads
and writes no file: model folders are :mod:`smiexlm.modelio`'s (``ExLMModel.from_pretrained``
and ``save_pretrained`` call it)."""

from smiexlm.model.config import ExLMConfig

__all__ = ["ExLMConfig"]
