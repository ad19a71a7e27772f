"""The encoder core and its objectives: ``config`` (presets), ``rope``, ``encoder``,
``expansion`` (ExLM states), ``transitions`` (DAG edges), ``masking``, ``heads``, ``model``
(``ExLMModel``) and ``checkpoint`` (a model folder's weights, written and read)."""

from smiexlm.model.config import ExLMConfig

__all__ = ["ExLMConfig"]
