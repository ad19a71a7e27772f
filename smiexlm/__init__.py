"""smiexlm: a chemistry-first SMILES representation toolkit.

Public names are imported lazily so that ``import smiexlm`` (and the CLI's ``--help``)
stays fast: torch, RDKit and DeepChem load only when something that needs them is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from smiexlm.core import hooks, moved
from smiexlm.core.lazy import lazy_names
from smiexlm.core.version import __version__

moved.install()  # module paths that moved to another layer still import, with a warning
# the network's doors to its folders, a layer above it (ExLMModel.save_/from_pretrained)
hooks.provide("save_model_folder", "smiexlm.modelio.weights:save_model_folder")
hooks.provide("load_model_folder", "smiexlm.modelio.weights:load_model_folder")

# public name -> module that defines it
_LAZY = {
    "SmilesTokenizer": "smiexlm.tokenizer",
    "ExLMConfig": "smiexlm.model.config",
    "ExLMModel": "smiexlm.model.model",
    "Featurizer": "smiexlm.embedding.featurizer",
}

__all__ = ["ExLMConfig", "ExLMModel", "Featurizer", "SmilesTokenizer", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from smiexlm.embedding.featurizer import Featurizer
    from smiexlm.model.config import ExLMConfig
    from smiexlm.model.model import ExLMModel
    from smiexlm.tokenizer import SmilesTokenizer

__getattr__ = lazy_names(__name__, _LAZY)
