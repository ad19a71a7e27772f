"""The encoder core and its objectives: ``config`` (presets), ``rope``, ``encoder``,
``expansion`` (ExLM states), ``transitions`` (DAG edges), ``masking``, ``heads``, ``model``
(``ExLMModel``) and ``checkpoint`` (safetensors folders)."""

from smiexlm.model.config import ExLMConfig

__all__ = ["ExLMConfig"]
