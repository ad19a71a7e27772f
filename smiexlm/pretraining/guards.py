"""What ends a pre-training step early: a stop request from a signal, which the loop honours
at the step's end, and an out-of-memory error, turned into a hint at the token budget."""

from __future__ import annotations

import contextlib
import signal
from typing import Any

import torch

from smiexlm.errors import ConfigError
from smiexlm.pretraining.config import TrainConfig


class StopRequest:
    """SIGTERM / SIGINT set a flag; the loop saves a checkpoint and leaves at the step's end."""

    def __init__(self):
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # signals only reach the main thread
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C leaves at once
        self.signal_name = signal.Signals(signum).name

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def is_oom(error: BaseException) -> bool:
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def oom_error(config: TrainConfig, shape: tuple[int, ...], device: torch.device) -> ConfigError:
    return ConfigError(
        "max_tokens",
        config.max_tokens,
        f"a smaller token budget: a micro-batch of shape {shape} ran out of memory on {device}; "
        f"try max_tokens={max(64, config.max_tokens // 2)} (raise update_freq to keep the "
        "global batch)",
    )
