"""Fine-tuning: one training loop (``engine``) and its batches; task adapters live with their
tasks (``smiexlm.moleculenet.finetune``, ``smiexlm.glue.finetune``)."""

from smiexlm.finetuning.batches import Examples
from smiexlm.finetuning.engine import FitResult, LoopConfig, fit
from smiexlm.finetuning.inference import predict, predict_views

__all__ = ["Examples", "FitResult", "LoopConfig", "fit", "predict", "predict_views"]
