"""Per-task fine-tuning configs (the paper's Table 8), shipped as TOML and overridable."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smiexlm.errors import (
    ConfigError,
    check_choice,
    check_field_types,
    check_fraction,
    check_positive_int,
    check_spellings,
)
from smiexlm.finetuning.engine import LoopConfig
from smiexlm.fingerprints import FEATURE_KINDS
from smiexlm.model.pooling import pooling_parts
from smiexlm.moleculenet.adapt import check_adapt
from smiexlm.moleculenet.blend import DEFAULT_BLEND, check_blend
from smiexlm.moleculenet.splits import check_split_kind
from smiexlm.paths import PACKAGE_DIR

CONFIG_PATH = PACKAGE_DIR / "configs" / "finetune" / "moleculenet.toml"


# The flat keys of the TOML and of the CLI that are the loop's (max_train_steps is the loop's
# max_steps); the others are FinetuneConfig's own fields.
_LOOP_KEYS = {
    "epochs": "epochs", "batch_size": "batch_size", "lr": "lr", "warmup_ratio": "warmup_ratio",
    "weight_decay": "weight_decay", "adam_betas": "adam_betas", "adam_eps": "adam_eps",
    "clip_norm": "clip_norm", "max_train_steps": "max_steps", "patience": "patience",
    "precision": "precision", "eval_batch_size": "eval_batch_size", "device": "device", "freeze": "freeze",
    "freeze_layers": "freeze_layers", "ema_half_life": "ema_half_life",
    "head_epochs": "head_epochs", "head_lr": "head_lr", "layer_decay": "layer_decay",
}  # fmt: skip


CLASS_WEIGHTS = ("none", "balanced")
#: ``ensemble``: "none" (one network, with its forest when ``forest`` says so) or "wide"
#: (smiexlm.moleculenet.ensemble)
ENSEMBLES = ("none", "wide")

# ``forest = "auto"`` (the shipped default): the forest each task type is served with, the
# blend that measured best beside the fine-tuned model (benchmarks/results/table1 for
# classification: 77.3 against 74.9 over seven sets; benchmarks/results/regression for
# regression: mean RMSE 1.351 against 1.527 over ESOL, FreeSolv and Lipophilicity)
AUTO = "auto"
AUTO_FOREST = {"classification": "rdkit2d", "regression": "rdkit2d"}
# the most trees a forest kept beside a model may hold over all its labels: 500 a label up to
# 200 labels; beyond, fewer a label (ToxCast's 617: 162 each), so that the forest costs less
# than the fine-tuning it sits beside (benchmarks/results/forest_cost.md)
FOREST_TREE_BUDGET = 100_000
MIN_FOREST_TREES = 50


def resolve_forest(cfg: FinetuneConfig, task_type: str, n_labels: int) -> FinetuneConfig:
    """``cfg`` as it runs on a task: ``forest = "auto"`` made :data:`AUTO_FOREST`'s kind for
    ``task_type`` (no forest of its own in a wide ensemble, whose members hold theirs), and
    the forest's trees a label capped at :data:`FOREST_TREE_BUDGET` over ``n_labels`` labels
    (never below :data:`MIN_FOREST_TREES`)."""
    forest = AUTO_FOREST[task_type] if cfg.forest == AUTO else cfg.forest
    if cfg.ensemble != "none":
        forest = None
    trees = cfg.forest_trees
    if forest is not None:
        trees = min(trees, max(MIN_FOREST_TREES, FOREST_TREE_BUDGET // max(n_labels, 1)))
    if (forest, trees) == (cfg.forest, cfg.forest_trees):
        return cfg
    return dataclasses.replace(cfg, forest=forest, forest_trees=trees)


def _default_loop() -> LoopConfig:
    return LoopConfig(epochs=40, batch_size=64, lr=1e-4)


@dataclass
class FinetuneConfig:
    """Everything that decides a fine-tuning run besides the checkpoint, data and seed: the
    training loop (a :class:`~smiexlm.finetuning.LoopConfig`: epochs, batch, optimiser,
    ``max_steps``, ``patience``, ``precision``, ``freeze``/``freeze_layers``,
    ``ema_half_life``, ``head_epochs``/``head_lr``, ``layer_decay``) and what the
    MoleculeNet adapter adds (dropouts, pooling, the last ``layers`` blocks the head reads,
    SMILES normalisation, split, truncation, hybrid ``features``: ``ecfp4`` | ``rdkit2d`` |
    ``both``, random-SMILES ``augment`` of the training molecules, test-time ``tta``,
    ``adapt_steps`` of descriptor regression on the training molecules before fine-tuning,
    :mod:`~smiexlm.moleculenet.adapt`, and a random ``forest`` on ``ecfp4`` | ``rdkit2d`` |
    ``both`` kept beside the model and blended with it, :mod:`~smiexlm.moleculenet.forest`,
    or a wide ``ensemble`` of networks and forests, :mod:`~smiexlm.moleculenet.ensemble`;
    ``class_weight="balanced"`` weighs each classification task's two classes inversely to
    their frequency on its training molecules, :func:`~smiexlm.model.heads.balanced_class_weights`).

    The TOML tables, the CLI and :func:`finetune_config` speak flat keys
    (:meth:`from_flat`, :meth:`to_dict`); ``max_train_steps`` is the loop's ``max_steps`` and is
    recorded in every report, so shortened runs are never mistaken for full ones.
    """

    loop: LoopConfig = field(default_factory=_default_loop)
    dropout: float = 0.1
    pooler_dropout: float = 0.1
    pooling: str = "cls"
    # the head reads the pooled outputs of the last this many blocks; None: as many as the
    # backbone serves in its embedding (embedding.json; the default model's last three)
    layers: int | None = None
    canonicalize: bool = True  # as the pretraining corpus; False keeps the SMILES as written
    split: str = "scaffold"
    max_length: int = 256
    features: str | None = None
    augment: int = 0  # random SMILES per training molecule, one drawn per epoch (0 = none)
    tta: int = 0  # random SMILES averaged with the canonical one for the scores kept (0 = none)
    adapt_steps: int = 0  # descriptor-regression updates on the training molecules first
    adapt_lr: float = 1e-4
    forest: str | None = (
        None  # features of a random forest blended with the model (None: no forest)
    )
    forest_trees: int = 500
    forest_blend: str = DEFAULT_BLEND  # how the two are blended (smiexlm.moleculenet.blend)
    forest_weight: float = 0.5  # the model's weight in the blend
    # "balanced": each classification task's classes weighted n / (2 n_class) in the loss
    class_weight: str = "none"
    # "wide": networks and forests fine-tuned side by side and served blended
    # (smiexlm.moleculenet.ensemble); "none": one network (and its forest)
    ensemble: str = "none"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_field_types(self)
        check_positive_int("max_length", self.max_length)
        check_positive_int("layers", self.layers, optional=True)
        check_adapt(self.adapt_steps, self.adapt_lr)
        for name in ("augment", "tta"):
            check_spellings(name, getattr(self, name))
        for name in ("dropout", "pooler_dropout"):
            check_fraction(name, getattr(self, name))
        pooling_parts(self.pooling)  # one of POOLINGS, or several side by side (cls+mean+max)
        check_split_kind(self.split)
        if self.features is not None:
            check_choice("features", self.features, FEATURE_KINDS)
        if self.forest == "none":  # TOML and the command line spell None so
            self.forest = None
        if self.forest is not None:
            check_choice("forest", self.forest, (AUTO, *FEATURE_KINDS))
        check_positive_int("forest_trees", self.forest_trees)
        check_blend(self.forest_weight, self.forest_blend)
        check_choice("class_weight", self.class_weight, CLASS_WEIGHTS)
        check_choice("ensemble", self.ensemble, ENSEMBLES)
        if self.ensemble != "none" and self.features is not None:
            raise ConfigError("features", self.features, "None with ensemble = "
                              f"{self.ensemble!r} (its members choose their own)")  # fmt: skip
        if self.loop.freeze and self.loop.freeze_layers:
            raise ConfigError(
                "freeze_layers",
                self.loop.freeze_layers,
                "0 with freeze (which freezes every layer)",
            )

    @classmethod
    def from_flat(cls, **values: Any) -> FinetuneConfig:
        """A config from flat keys (those of :data:`FLAT_KEYS`)."""
        if "amp" in values:  # the former name of precision ("off" = fp32)
            values["precision"] = values.pop("amp")
        loop = {_LOOP_KEYS[k]: values.pop(k) for k in list(values) if k in _LOOP_KEYS}
        check_positive_int("max_train_steps", loop.get("max_steps"), optional=True)
        if "adam_betas" in loop:
            loop["adam_betas"] = tuple(loop["adam_betas"])
        return cls(loop=dataclasses.replace(_default_loop(), **loop), **values)

    def to_dict(self) -> dict[str, Any]:
        """The flat record (reports, ``finetune.json``)."""
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "loop"}
        return {key: getattr(self.loop, name) for key, name in _LOOP_KEYS.items()} | own


FLAT_KEYS = tuple(_LOOP_KEYS) + tuple(f.name for f in dataclasses.fields(FinetuneConfig) if f.name != "loop")  # fmt: skip


def load_table(path: Path = CONFIG_PATH) -> dict[str, dict[str, Any]]:
    """The raw TOML tables: ``defaults`` and one per task."""
    with open(path, "rb") as handle:
        return tomllib.load(handle)


def read_config_file(path: Path | str) -> dict[str, Any]:
    """The flat FinetuneConfig keys of a TOML file (the shape of ``hpopt``'s ``best.toml``);
    DataError for a missing or malformed file, ConfigError naming the key and the file for a
    key that is not a FinetuneConfig field (a table such as ``[bbbp]`` included)."""
    from smiexlm.errors import DataError
    from smiexlm.paths import check_input_file

    path = check_input_file(path, "--config")
    try:
        with open(path, "rb") as handle:
            values = tomllib.load(handle)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"--config {str(path)!r} is not a TOML file: {err}") from None
    for key, value in values.items():
        if key not in {*FLAT_KEYS, "amp"} or (isinstance(value, dict) and key != "extra"):
            raise ConfigError(key, value, f"a flat FinetuneConfig key in --config {str(path)!r}"
                              f" (one of {', '.join(sorted(FLAT_KEYS))})")  # fmt: skip
    return values


def finetune_config(
    task: str | None, path: Path = CONFIG_PATH, config_file: Path | str | None = None,
    **overrides: Any,
) -> FinetuneConfig:  # fmt: skip
    """Defaults, then the task's Table 8 row (if the task has one), then ``config_file`` (flat
    keys, :func:`read_config_file`), then ``overrides``.

    Overrides whose value is None are ignored, so CLI options can pass their defaults through.
    """
    table = load_table(path)
    values = dict(table.get("defaults", {}))
    if task is not None:
        values.update(table.get(task.lower(), {}))
    if config_file is not None:
        values.update(read_config_file(config_file))
    known = {*FLAT_KEYS, "amp"}
    for key, value in overrides.items():
        if key not in known:
            raise ConfigError(key, value, f"a FinetuneConfig field ({', '.join(sorted(known))})")
        if value is not None:
            values[key] = value
    unknown = set(values) - known
    if unknown:
        raise ConfigError(str(sorted(unknown)), path.name, "only FinetuneConfig fields")
    return FinetuneConfig.from_flat(**values)
