"""Pre-training: ``config`` (TrainConfig), ``launch`` (a job, in one process or spread over
the free cores), ``trainer`` (the loop, :func:`pretrain`) with its ``stream`` (who reads which
micro-batch), ``batches`` and ``spelling`` (what each micro-batch holds), ``reporting``
(metrics.jsonl, TensorBoard) and ``guards`` (stop requests, out of memory), ``resume``,
``sharded`` and ``warm_start`` (checkpoints read back), ``export`` (a run's model folder) and
``plot`` (loss curves). The optimiser, the run's state on disk, its lock and the process group
are :mod:`smiexlm.training`'s, shared with fine-tuning."""

from smiexlm.pretraining.config import TrainConfig, load_config

__all__ = ["TrainConfig", "load_config", "pretrain"]


def __getattr__(name: str):
    if name == "pretrain":
        from smiexlm.pretraining.trainer import pretrain

        return pretrain
    raise AttributeError(f"module 'smiexlm.pretraining' has no attribute {name!r}")
