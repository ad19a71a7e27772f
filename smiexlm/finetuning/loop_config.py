"""``LoopConfig``: how one fine-tuning run trains, each setting declared once
(:func:`smiexlm.settings.setting`); the task adapters fill it from their own configs.
``FitRun``: how the run is driven beside it (seed, progress, its state, a callback)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from smiexlm.device import Precision, parse_precision
from smiexlm.errors import ConfigError, check_positive_int
from smiexlm.settings import check_settings, setting


@dataclass
class LoopConfig:
    """How one fine-tuning run trains; the fields with a help are settings a user gives
    (``smiexlm finetune --set KEY=VALUE``), the others the adapters' own."""

    epochs: int = setting(help="Epochs of the schedule (Table 8's row per set).")
    batch_size: int = setting(help="Training molecules per update.")
    lr: float = setting(
        help="Peak learning rate (linear warmup, then linear decay to 0).", within="(0, 1]"
    )
    warmup_ratio: float = setting(
        0.06, "Share of the updates that warm the learning rate up.", within="[0, 1)"
    )
    weight_decay: float = setting(0.0, "Decoupled weight decay of AdamW.", within="[0, inf)")
    adam_betas: tuple[float, float] = setting(
        (0.9, 0.98), "AdamW's betas, [b1, b2].", within="[0, 1)"
    )
    adam_eps: float = setting(1e-6, "AdamW's epsilon.", within="(0, inf)")
    clip_norm: float = setting(
        1.0, "Gradient-norm clipping; 0 = none (RoBERTa's GLUE recipe).", within="[0, inf)"
    )
    max_steps: int | None = setting(
        None, "Stop each run after N updates (quick checks; recorded in every report).",
        key="max_train_steps",
    )  # fmt: skip
    patience: int | None = setting(
        None, "Stop after N epochs without a better valid score (default: the whole schedule)."
    )
    select: Literal["best", "last"] = "best"
    higher_is_better: bool = True
    precision: Precision = setting(
        "auto", "auto (bf16 autocast on CUDA and bf16-native CPUs) | fp32 | bf16 (--amp off "
        "= fp32).", flags=("--precision", "--amp"),
    )  # fmt: skip
    bucket_window: int = 50  # batches per length-sorted window; 1 = no bucketing
    eval_batch_size: int = setting(256, "Molecules per evaluation batch.")
    freeze: bool = setting(False, "Train the head only, on the frozen encoder's features.")
    freeze_layers: int = setting(0, "Freeze the embeddings and the first N blocks.")
    ema_half_life: float = setting(
        0.0, "Validate and keep a moving average of the weights whose updates' weight halves "
        "every H epochs (0: the raw weights).", since=0.0, within="[0, inf)",
    )  # fmt: skip
    head_epochs: int = setting(
        0, "First train the head alone for N epochs on the frozen encoder's features, then "
        "the whole model (0: from a random head).", since=0, with_=("head_lr",),
    )  # fmt: skip
    head_lr: float = setting(
        1e-3, "The learning rate of those epochs, decaying linearly to 0.", within="(0, 1]"
    )
    layer_decay: float = setting(
        1.0, "Layer-wise learning rates: each encoder block learns this times as fast as the "
        "one above it (1: all at lr).", since=1.0, within="(0, 1]",
    )  # fmt: skip
    device: str = setting("auto", "auto (CUDA when available) | cpu | cuda[:N].")
    pad_id: int = 0

    def __post_init__(self) -> None:
        check_settings(self)  # types, finite floats, each setting's ``within``
        for name in ("epochs", "batch_size", "eval_batch_size", "bucket_window"):
            check_positive_int(name, getattr(self, name))
        for name in ("max_steps", "patience"):
            check_positive_int(name, getattr(self, name), optional=True)
        if self.select not in ("best", "last"):
            raise ConfigError("select", self.select, "'best' or 'last'")
        self.precision = parse_precision(self.precision)
        if not isinstance(self.freeze_layers, int) or self.freeze_layers < 0:
            raise ConfigError("freeze_layers", self.freeze_layers, "0 or a positive integer")
        if self.head_epochs != 0:  # 0 = off
            check_positive_int("head_epochs", self.head_epochs)
        if self.head_epochs and self.freeze:
            raise ConfigError(
                "head_epochs", self.head_epochs, "0 with freeze (which trains the head alone)"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_lower(self, rate: Literal["lr", "head_lr"] = "lr") -> str:
        """What a run that diverged should lower, with its value: ``lr (now 1e+10)``."""
        unclipped = "" if self.clip_norm > 0 else ", or clip the gradients (clip_norm=1)"
        return f"{rate} (now {getattr(self, rate):g}){unclipped}"


@dataclass(frozen=True)
class FitRun:
    """How one :func:`~smiexlm.finetuning.engine.fit` run is driven, beside what it trains:
    its ``seed``; a progress bar (``progress``) and the name of its bar and log lines
    (``desc``); ``state_dir``, where the state is kept after every epoch and resumed from when
    present; ``identity``, what else (data, backbone, features) a resumed run must share with
    the one that saved the state, beside the loop settings, the seed and the split sizes;
    ``on_epoch(epoch, valid score)``, called after each validation (epochs count from 1)."""

    seed: int = 0
    progress: bool = False
    desc: str = "fine-tune"
    state_dir: Path | None = None
    identity: Mapping[str, Any] | None = None
    on_epoch: Callable[[int, float], None] | None = None
