"""What a pre-training run reports: messages, the progress bar, and ``metrics.jsonl`` (one JSON
record per logged step, mirrored to TensorBoard with ``tensorboard = true``); all from the main
process only."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smiexlm.errors import ConfigError

METRICS_FILE = "metrics.jsonl"


def say(message: str, is_main: bool) -> None:
    """A line on stderr that does not break the progress bar (main process only)."""
    if is_main:
        from tqdm.auto import tqdm

        tqdm.write(message, file=sys.stderr)


def progress_bar(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        disable=not enabled,
        dynamic_ncols=True,
        unit="step",
        file=sys.stderr,
    )


@dataclass
class Window:
    """The sums over the steps since the last logged one, which started at ``t0``."""

    t0: float
    loss: float = 0.0
    micro: float = 0
    tokens: float = 0
    invalid: float = 0
    desc: float = 0.0

    def add(self, loss: float, micro: float, tokens: float, invalid: float, desc: float) -> None:
        self.loss += loss
        self.micro += micro
        self.tokens += tokens
        self.invalid += invalid
        self.desc += desc


class MetricsLog:
    """Appends records to ``out_dir/metrics.jsonl`` and, when asked, TensorBoard scalars;
    does nothing outside the main process."""

    def __init__(self, out_dir: Path, is_main: bool, tensorboard: bool):
        self.path = out_dir / METRICS_FILE
        self.is_main = is_main
        self.writer = _tensorboard(out_dir) if (is_main and tensorboard) else None

    def log(self, record: dict[str, Any]) -> None:
        if not self.is_main:
            return
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _tensorboard(out_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as error:
        raise ConfigError(
            "tensorboard",
            True,
            "false, or install the extra: pip install 'smiexlm[tensorboard]'",
        ) from error
    return SummaryWriter(str(out_dir / "tensorboard"))
