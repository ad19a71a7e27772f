"""Pre-training: ``config`` (TrainConfig), ``launch`` (a job, in one process or spread over
the free cores), ``trainer`` (the loop, :func:`pretrain`) with its ``stream`` (who reads which
micro-batch), ``reporting`` (metrics.jsonl, TensorBoard) and ``guards`` (stop requests, out
of memory), ``optim``, ``checkpoint``, ``distributed``, and ``plot`` (loss curves)."""

from smiexlm.training.config import TrainConfig, load_config

__all__ = ["TrainConfig", "load_config", "pretrain"]


def __getattr__(name: str):
    if name == "pretrain":
        from smiexlm.training.trainer import pretrain

        return pretrain
    raise AttributeError(f"module 'smiexlm.training' has no attribute {name!r}")
