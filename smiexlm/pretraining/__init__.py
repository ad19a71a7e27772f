"""Pre-training: ``config`` (TrainConfig), ``launch`` (a job, in one process or spread over
the free cores), ``trainer`` (the loop, :func:`pretrain`) with its ``stream`` (who reads which
micro-batch), ``reporting`` (metrics.jsonl, TensorBoard) and ``guards`` (stop requests, out
of memory), ``optim`` (AdamW's decay groups, the schedule), ``run_state``, ``resume`` and
``warm_start`` (checkpoints written and read back), ``distributed``, and ``plot`` (loss
curves)."""

from smiexlm.pretraining.config import TrainConfig, load_config

__all__ = ["TrainConfig", "load_config", "pretrain"]


def __getattr__(name: str):
    if name == "pretrain":
        from smiexlm.pretraining.trainer import pretrain

        return pretrain
    raise AttributeError(f"module 'smiexlm.pretraining' has no attribute {name!r}")
