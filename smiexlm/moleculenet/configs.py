"""Per-task fine-tuning configs (the paper's Table 8), shipped as TOML and overridable."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smiexlm.errors import ConfigError, check_choice, check_fraction, check_positive_int
from smiexlm.finetuning.engine import AMP_CHOICES
from smiexlm.fingerprints import FEATURE_KINDS
from smiexlm.model.model import POOLINGS
from smiexlm.moleculenet.splits import SPLIT_KINDS
from smiexlm.paths import PACKAGE_DIR

CONFIG_PATH = PACKAGE_DIR / "configs" / "finetune" / "moleculenet.toml"


@dataclass
class FinetuneConfig:
    """Everything that decides a fine-tuning run besides the checkpoint, data and seed.

    ``max_train_steps`` (None = no limit) stops each run early for quick CPU checks; the
    report records it, so shortened runs are never mistaken for full ones. ``patience``
    (None = the whole Table 8 schedule) stops after that many epochs without a better valid
    score. ``freeze`` trains the head only, ``freeze_layers`` freezes the embeddings and the
    first N blocks; ``features`` (``ecfp4`` | ``rdkit2d``) makes the head hybrid.
    """

    epochs: int = 40
    batch_size: int = 64
    lr: float = 1e-4
    warmup_ratio: float = 0.06
    dropout: float = 0.1
    pooler_dropout: float = 0.1
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.98)
    adam_eps: float = 1e-6
    clip_norm: float = 1.0
    pooling: str = "cls"
    canonicalize: bool = True  # as the pretraining corpus; False keeps the SMILES as written
    split: str = "scaffold"
    max_length: int = 256
    max_train_steps: int | None = None
    eval_batch_size: int = 256
    device: str = "auto"
    patience: int | None = None
    freeze: bool = False
    freeze_layers: int = 0
    features: str | None = None
    amp: str = "auto"  # bf16 on CUDA and on bf16-native CPUs; "bf16" always, "off" never
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.adam_betas = tuple(self.adam_betas)  # type: ignore[assignment]
        for name in ("epochs", "batch_size", "max_length", "eval_batch_size"):
            check_positive_int(name, getattr(self, name))
        if not self.lr > 0:
            raise ConfigError("lr", self.lr, "a positive number")
        for name in ("warmup_ratio", "dropout", "pooler_dropout"):
            check_fraction(name, getattr(self, name))
        check_positive_int("max_train_steps", self.max_train_steps, optional=True)
        check_choice("pooling", self.pooling, POOLINGS)
        if self.split not in SPLIT_KINDS:
            raise ConfigError("split", self.split, f"one of {', '.join(SPLIT_KINDS)}")
        check_positive_int("patience", self.patience, optional=True)
        if not isinstance(self.freeze_layers, int) or self.freeze_layers < 0:
            raise ConfigError("freeze_layers", self.freeze_layers, "0 or a positive integer")
        if self.freeze and self.freeze_layers:
            raise ConfigError(
                "freeze_layers", self.freeze_layers, "0 with freeze (which freezes every layer)"
            )
        if self.features is not None and self.features not in FEATURE_KINDS:
            raise ConfigError("features", self.features, f"one of {', '.join(FEATURE_KINDS)}")
        check_choice("amp", self.amp, AMP_CHOICES)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_table(path: Path = CONFIG_PATH) -> dict[str, dict[str, Any]]:
    """The raw TOML tables: ``defaults`` and one per task."""
    with open(path, "rb") as handle:
        return tomllib.load(handle)


def finetune_config(task: str | None, path: Path = CONFIG_PATH, **overrides: Any) -> FinetuneConfig:
    """Defaults, then the task's Table 8 row (if the task has one), then ``overrides``.

    Overrides whose value is None are ignored, so CLI options can pass their defaults through.
    """
    table = load_table(path)
    values = dict(table.get("defaults", {}))
    if task is not None:
        values.update(table.get(task.lower(), {}))
    known = {f.name for f in dataclasses.fields(FinetuneConfig)}
    for key, value in overrides.items():
        if key not in known:
            raise ConfigError(key, value, f"a FinetuneConfig field ({', '.join(sorted(known))})")
        if value is not None:
            values[key] = value
    unknown = set(values) - known
    if unknown:
        raise ConfigError(str(sorted(unknown)), path.name, "only FinetuneConfig fields")
    return FinetuneConfig(**values)
