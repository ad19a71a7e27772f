"""Pre-training: ``config`` (TrainConfig), ``optim``, ``checkpoint``, ``distributed``,
``trainer`` (the loop, :func:`pretrain`) and ``plot`` (loss curves)."""

from smiexlm.training.config import TrainConfig, load_config

__all__ = ["TrainConfig", "load_config", "pretrain"]


def __getattr__(name: str):
    if name == "pretrain":
        from smiexlm.training.trainer import pretrain

        return pretrain
    raise AttributeError(f"module 'smiexlm.training' has no attribute {name!r}")
