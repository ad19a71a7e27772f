"""``TrainConfig``: everything a pre-training run needs besides the data and the output folder.

A config file is TOML (YAML too when PyYAML is installed). Training keys sit at the top
level; the ``[model]`` table names an :class:`~smiexlm.ExLMConfig` preset plus any field
overrides::

    # Launch: smiexlm pretrain --config mol_tiny_exlm --data data/moses --out runs/tiny
    lr = 1e-3
    max_steps = 20000

    [model]
    preset = "tiny"
    objective = "exlm"
    k = 2

Command-line overrides are ``key=value`` (``lr=3e-4``, ``model.k=4``); values are parsed as
TOML literals and fall back to plain strings. Unknown keys raise :class:`ConfigError` naming
the key and listing the valid ones.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smiexlm.device import Precision, check_device_name, parse_precision
from smiexlm.errors import ConfigError, check_choice
from smiexlm.model.config import PRESETS, ExLMConfig, PresetName
from smiexlm.paths import PACKAGE_DIR
from smiexlm.settings import check_settings, parse_assignment, setting, to_toml

SHIPPED_CONFIG_DIR = PACKAGE_DIR / "configs" / "pretrain"
SPELLINGS = ("canonical", "random")  # how a training molecule is written (``spelling``)


@dataclass(frozen=True)
class ModelSpec:
    """The ``[model]`` table: an :class:`ExLMConfig` preset and the fields the config sets.

    ``overrides`` keeps only what the file or the command line names, so that a run can tell
    a vocabulary the config pins (``vocab_size``, ``vocab_hash``) from the preset's default;
    ``config`` is the resolved, validated :class:`ExLMConfig` (the dataset's vocabulary is
    filled in by :meth:`build` when training starts).
    """

    preset: PresetName = "tiny"
    overrides: dict[str, Any] = field(default_factory=dict)
    config: ExLMConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ConfigError("model.preset", self.preset, f"one of {PRESETS}")
        names = {f.name for f in dataclasses.fields(ExLMConfig)}
        for key, value in self.overrides.items():
            if key not in names:
                known = ["preset", *sorted(names)]
                raise ConfigError(f"model.{key}", value, f"a known model key, one of {known}")
        object.__setattr__(self, "config", ExLMConfig.preset(self.preset, **self.overrides))

    @classmethod
    def from_table(cls, table: Any) -> ModelSpec:
        """From a ``[model]`` table: ``preset`` plus ExLMConfig fields."""
        if isinstance(table, ModelSpec):
            return table
        if not isinstance(table, dict):
            raise ConfigError("model", table, "a table of ExLMConfig fields with 'preset'")
        rest = {k: v for k, v in table.items() if k != "preset"}
        return cls(table.get("preset", "tiny"), rest)

    def to_table(self) -> dict[str, Any]:
        return {"preset": self.preset, **self.overrides}

    def build(self, **fixed: Any) -> ExLMConfig:
        """The run's :class:`ExLMConfig` with ``fixed`` fields (e.g. the dataset's vocab_size)."""
        return dataclasses.replace(self.config, **fixed) if fixed else self.config


@dataclass
class TrainConfig:
    """A pre-training run: model preset and overrides, optimiser, schedule, batching, reporting."""

    # the [model] table: an ExLMConfig preset plus the fields it overrides (objective, k, ...)
    model: ModelSpec = field(default_factory=ModelSpec)
    # --- batching
    max_tokens: int = setting(
        8192, "Token budget of one micro-batch on one process (padded B * T)."
    )
    update_freq: int = setting(1, "Gradient accumulation: micro-batches per update per process.")
    # --- schedule (fairseq's polynomial_decay: linear warmup, then (1 - t)^power decay)
    max_steps: int = setting(1000, "Updates where the run stops (--max-steps overrides it).")
    total_steps: int | None = setting(
        None, "Decay horizon in updates (default: max_steps; stopping early keeps it)."
    )
    warmup_steps: int = setting(100, "Updates of linear warmup.")
    lr: float = setting(5e-4, "Peak learning rate.", within="(0, 1]")
    end_lr: float = setting(0.0, "Learning rate at the decay horizon.", within="[0, 1]")
    lr_power: float = setting(1.0, "Power of the polynomial decay (1: linear).", within="[0, inf)")
    # --- optimiser (Adam with decoupled weight decay, as fairseq's "adam")
    adam_betas: tuple[float, float] = setting(
        (0.9, 0.98), "Adam's betas, [b1, b2].", within="[0, 1)"
    )
    adam_eps: float = setting(1e-6, "Adam's epsilon.", within="(0, inf)")
    weight_decay: float = setting(0.0, "Decoupled weight decay.", within="[0, inf)")
    clip_norm: float = setting(1.0, "Gradient-norm clipping; 0 disables it.", within="[0, inf)")
    # --- what the run starts from and reads
    init: str | None = setting(
        None, "A model folder or shipped model's name whose weights the run starts from "
        "(continued pre-training; its architecture must be the [model] table's); none: random.",
    )  # fmt: skip
    spelling: str = setting(
        "canonical", "canonical (as the dataset stores each molecule) | random (a fresh random "
        "SMILES every time it comes round).",
    )  # fmt: skip
    # --- runtime
    seed: int = setting(1, "Seed of the weights, the batches and the masks.")
    device: str = setting(
        "auto", "auto (CUDA when available; a GPU per process under torchrun) | cpu | cuda[:N]."
    )
    precision: Precision = setting(
        "auto", "auto (bf16 autocast on GPU and on CPUs with native bf16, AVX512-BF16 or AMX; "
        "fp32 elsewhere) | fp32 | bf16.",
    )  # fmt: skip
    num_threads: int = setting(0, "Torch intra-op threads per process; 0: torch's default.")
    num_workers: int = setting(0, "DataLoader workers that collate and mask batches.")
    # --- reporting and checkpoints
    log_every: int = setting(10, "Updates between training-loss lines.")
    valid_every: int = setting(500, "Updates between validations.")
    valid_batches: int = setting(
        50, "Micro-batches of the validation split per evaluation; 0: all."
    )
    save_every: int = setting(1000, "Updates between checkpoints.")
    keep_last: int = setting(3, "Newest step checkpoints kept (best/ and last/ besides).")
    tensorboard: bool = setting(False, "Also write TensorBoard events.")
    progress: bool = setting(True, "Show a progress bar.")

    def __post_init__(self) -> None:
        check_settings(self)  # types, finite floats, each setting's ``within``
        self.model = ModelSpec.from_table(self.model)
        for name in ("max_tokens", "update_freq", "max_steps", "log_every", "valid_every"):
            _require_int(name, getattr(self, name), minimum=1)
        for name in ("save_every", "keep_last"):
            _require_int(name, getattr(self, name), minimum=1)
        for name in ("warmup_steps", "seed", "num_threads", "num_workers", "valid_batches"):
            _require_int(name, getattr(self, name), minimum=0)
        if self.total_steps is not None:
            _require_int("total_steps", self.total_steps, minimum=1)
        if self.end_lr > self.lr:
            raise ConfigError("end_lr", self.end_lr, f"at most lr={self.lr}")
        self.adam_betas = (float(self.adam_betas[0]), float(self.adam_betas[1]))
        check_device_name(self.device)
        self.precision = parse_precision(self.precision)
        check_choice("spelling", self.spelling, SPELLINGS)
        if self.init is not None and (not isinstance(self.init, str) or not self.init.strip()):
            raise ConfigError("init", self.init, "a model folder or a shipped model's name")
        for name in ("tensorboard", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "true or false")

    def check_horizon(self, max_steps: int) -> None:
        """ConfigError when a run to ``max_steps`` goes past the schedule's horizon with
        ``end_lr = 0``: the updates past it would learn nothing (a rate of 0)."""
        if self.end_lr == 0 and max_steps > self.decay_steps:
            raise ConfigError("max_steps", max_steps, f"at most the schedule's horizon "
                              f"total_steps = {self.decay_steps}, where the rate has decayed to "
                              f"end_lr = 0; to train longer set total_steps={max_steps} too (a "
                              "new schedule, so a resumed run takes another path)")  # fmt: skip

    @property
    def decay_steps(self) -> int:
        return self.total_steps if self.total_steps is not None else self.max_steps

    # ------------------------------------------------------------------ model
    def model_config(self, **fixed: Any) -> ExLMConfig:
        """The :class:`ExLMConfig` of this run; ``fixed`` fields (e.g. vocab_size) win."""
        return self.model.build(**fixed)

    # ------------------------------------------------------------ (de)serialise
    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["model"] = self.model.to_table()
        data["adam_betas"] = list(self.adam_betas)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = [f.name for f in dataclasses.fields(cls)]
        for key in data:
            if key not in known:
                raise ConfigError(key, data[key], f"a known config key, one of {sorted(known)}")
        return cls(**data)

    def save(self, path: Path) -> Path:
        """Write the resolved config as TOML (``.toml``) or JSON (anything else)."""
        path = Path(path)
        data = self.to_dict()
        path.write_text(to_toml(data) if path.suffix == ".toml" else json.dumps(data, indent=2))
        return path


def valid_keys() -> list[str]:
    """Every key a config file or a ``key=value`` override accepts (model keys as model.*)."""
    keys = [f.name for f in dataclasses.fields(TrainConfig) if f.name != "model"]
    return sorted(keys) + ["model.preset"] + [f"model.{k}" for k in _model_field_names()]


def _model_field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(ExLMConfig)]


def _require_int(name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(name, value, f"an integer >= {minimum}")


# ------------------------------------------------------------------------ loading
def shipped_configs() -> dict[str, Path]:
    """Name -> path of every config shipped in ``smiexlm/configs/pretrain``."""
    return {
        p.stem: p
        for p in sorted(SHIPPED_CONFIG_DIR.iterdir())
        if p.suffix in (".toml", ".yaml", ".yml")
    }


def describe_shipped_configs() -> list[str]:
    """One line per shipped config: its name and the first line of its own description."""
    return [
        f"{name:18s} {path.read_text().splitlines()[1].lstrip('# ')}"
        for name, path in sorted(shipped_configs().items())
    ]


def resolve_config_path(name_or_path: str | Path) -> Path:
    """A config file path, or the path of a shipped config named without a path."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = shipped_configs()
    if str(name_or_path) in shipped:
        return shipped[str(name_or_path)]
    raise ConfigError(
        "config", str(name_or_path), f"an existing TOML/YAML file or one of {sorted(shipped)}"
    )


def read_config_file(path: Path) -> dict[str, Any]:
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as error:
            raise ConfigError(
                "config", str(path), "a TOML file (PyYAML is not installed)"
            ) from error
        data = yaml.safe_load(text) or {}
    else:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise ConfigError("config", str(path), f"valid TOML ({error})") from error
    if not isinstance(data, dict):
        raise ConfigError("config", str(path), "a table of key = value pairs")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    """``"lr=3e-4"`` -> ("lr", 0.0003); ``"model.objective=mlm"`` -> ("model.objective", "mlm")."""
    return parse_assignment(item, "override")


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``data`` (a config file's tables) with ``key=value`` overrides applied; ConfigError for
    a ``model`` that is not a table (``model = "tiny"``, an empty ``model:``, ``model=foo``)."""
    model = data.get("model", {})
    if not isinstance(model, dict):
        raise ConfigError("model", model, "a table of model settings ([model] in the file)")
    data = {**data, "model": dict(model)}
    for item in overrides:
        key, value = parse_override(item)
        if key == "model":
            raise ConfigError("model", value, "model.KEY=VALUE overrides, one setting each")
        if key.startswith("model."):
            data["model"][key.removeprefix("model.")] = value
        else:
            data[key] = value
    return data


def load_config(name_or_path: str | Path, overrides: list[str] | None = None) -> TrainConfig:
    """Read a config file (or a shipped config by name) and apply ``key=value`` overrides."""
    data = read_config_file(resolve_config_path(name_or_path))
    return TrainConfig.from_dict(apply_overrides(data, list(overrides or [])))
