"""Fine-tuning: one training loop (``engine``) with its settings (``loop_config``; a run's
whole config, ``config``: ``FinetuneConfig`` and ``finetune_config``, Table 8's rows read from
``smiexlm/configs/finetune/moleculenet.toml``), its
batches, its weight average (``averaging``), its frozen-encoder modes (``frozen``), its state
(``state``), data parallel processes (``parallel``) and inference (``inference``). On
molecules: ``adapter`` (``run_finetune``: a MoleculeNet set or a user's CSV, seed by seed),
``backbone`` (where the encoder comes from), ``adapt`` (task-adaptive descriptor regression),
``targets`` (a run's labels and scores), ``outputs`` (what a finished seed keeps), ``folder``
(the fine-tuned folder written), ``ensemble`` (a wide ensemble) and ``probe`` (the linear
probe). Text's adapter is ``smiexlm.glue.finetune``. Names load lazily, so reading the
settings needs no torch."""

from __future__ import annotations

from smiexlm.core.lazy import lazy_names

_LAZY = {
    "Examples": "smiexlm.finetuning.batches",
    "FinetuneConfig": "smiexlm.finetuning.config",
    "FitResult": "smiexlm.finetuning.engine",
    "FitRun": "smiexlm.finetuning.loop_config",
    "LoopConfig": "smiexlm.finetuning.loop_config",
    "fit": "smiexlm.finetuning.engine",
    "finetune_config": "smiexlm.finetuning.config",
    "predict": "smiexlm.finetuning.inference",
    "predict_views": "smiexlm.finetuning.inference",
}

__all__ = list(_LAZY)

__getattr__ = lazy_names(__name__, _LAZY)
