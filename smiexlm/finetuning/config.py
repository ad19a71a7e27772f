"""The fine-tuning config (:class:`FinetuneConfig`) and the per-task rows it starts from
(the paper's Table 8, shipped as TOML data and overridable: :func:`finetune_config`)."""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smiexlm.chemistry.fingerprints import FEATURE_KINDS
from smiexlm.errors import (
    ConfigError,
    check_choice,
    check_positive_int,
    check_spellings,
)
from smiexlm.finetuning.loop_config import LoopConfig
from smiexlm.forests.blend import DEFAULT_BLEND, check_blend
from smiexlm.forests.kernels import KERNELS
from smiexlm.forests.members import COMBINES
from smiexlm.moleculenet.splits import check_split_kind
from smiexlm.paths import PACKAGE_DIR
from smiexlm.settings import Setting, check_settings, recorded, setting, settings_of

if TYPE_CHECKING:  # pragma: no cover
    from smiexlm.finetuning.backbone import Backbone

CONFIG_PATH = PACKAGE_DIR / "configs" / "finetune" / "moleculenet.toml"


CLASS_WEIGHTS = ("none", "balanced")
#: ``ensemble``: "none" (one network, with its forest when ``forest`` says so) or "wide"
#: (smiexlm.finetuning.ensemble)
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
# ``kernels = "auto"``: the kernel members a regression run keeps beside its network and forest
# (smiexlm.forests.members; benchmarks/results/potency); none for classification, where SVCs
# on the same kernels measured no gain beside the default or the wide ensemble
# (benchmarks/results/ensemble.md), and which refuses them
AUTO_KERNELS = {"classification": "none", "regression": "tanimoto,rbf,both"}
DEFAULT_COMBINE = "picked"


def resolve_forest(cfg: FinetuneConfig, task_type: str, n_labels: int,
                   embedding: bool = True) -> FinetuneConfig:  # fmt: skip
    """``cfg`` as it runs on a task: ``forest = "auto"`` made :data:`AUTO_FOREST`'s kind for
    ``task_type`` (no forest of its own in a wide ensemble, whose members hold theirs), and
    the forest's trees a label capped at :data:`FOREST_TREE_BUDGET` over ``n_labels`` labels
    (never below :data:`MIN_FOREST_TREES`); without a pretrained ``embedding`` (a random
    init), ``kernels = "auto"`` keeps the kernels that read none. ConfigError for kernel
    members named on a classification task, or named without the embedding they read."""
    if task_type == "classification" and cfg.kernels not in (AUTO, "none"):
        raise ConfigError("kernels", cfg.kernels, "auto or none for a classification task "
                          "(kernel members serve regression)")  # fmt: skip
    if task_type == "classification" and cfg.combine != DEFAULT_COMBINE:
        raise ConfigError("combine", cfg.combine, f"{DEFAULT_COMBINE} (the default) for a "
                          "classification task (it weighs the regression members)")  # fmt: skip
    forest = AUTO_FOREST[task_type] if cfg.forest == AUTO else cfg.forest
    kernels = AUTO_KERNELS[task_type] if cfg.kernels == AUTO else cfg.kernels
    if not embedding and kernels != "none":
        kept = [k for k in kernels.split(",") if k == "tanimoto"]  # rbf and both read it
        if cfg.kernels != AUTO and kept != kernels.split(","):
            raise ConfigError("kernels", cfg.kernels, "tanimoto alone without a pretrained "
                              "model (rbf and both read its frozen embedding)")  # fmt: skip
        kernels = ",".join(kept) or "none"
    if cfg.ensemble != "none":
        forest, kernels = None, "none"
    trees = cfg.forest_trees
    if forest is not None:
        trees = min(trees, max(MIN_FOREST_TREES, FOREST_TREE_BUDGET // max(n_labels, 1)))
    if (forest, trees, kernels) == (cfg.forest, cfg.forest_trees, cfg.kernels):
        return cfg
    return dataclasses.replace(cfg, forest=forest, forest_trees=trees, kernels=kernels)


def kernel_kinds(cfg: FinetuneConfig) -> list[str]:
    """The kernels of a resolved ``cfg`` (none for ``"none"``)."""
    return [] if cfg.kernels in ("none", AUTO) else cfg.kernels.split(",")


def check_kernels(value: str) -> None:
    """ConfigError unless ``value`` is auto, none or a comma-separated list of kernels."""
    kinds = value.split(",") if isinstance(value, str) else [value]
    if value in (AUTO, "none") or (set(kinds) <= set(KERNELS) and len(set(kinds)) == len(kinds)):
        return
    raise ConfigError("kernels", value, f"auto, none, or a comma-separated list of "
                      f"{', '.join(KERNELS)} (each once)")  # fmt: skip


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
    :mod:`~smiexlm.finetuning.adapt`, and a random ``forest`` on ``ecfp4`` | ``rdkit2d`` |
    ``both`` kept beside the model and blended with it, :mod:`~smiexlm.forests.forest`,
    or a wide ``ensemble`` of networks and forests, :mod:`~smiexlm.finetuning.ensemble`;
    ``class_weight="balanced"`` weighs each classification task's two classes inversely to
    their frequency on its training molecules, :func:`~smiexlm.model.heads.balanced_class_weights`).

    The TOML tables, the CLI and :func:`finetune_config` speak flat keys
    (:meth:`from_flat`, :meth:`to_dict`); ``max_train_steps`` is the loop's ``max_steps`` and is
    recorded in every report, so shortened runs are never mistaken for full ones.
    """

    loop: LoopConfig = field(default_factory=_default_loop)
    dropout: float = setting(0.1, "Dropout of the encoder while it fine-tunes.", within="[0, 1)")
    pooler_dropout: float = setting(0.1, "Dropout of the head's input.", within="[0, 1)")
    pooling: str = setting(
        "cls", "How the head pools each block: cls (Table 8's), mean, max, or several joined "
        "by + (cls+mean+max), side by side.",
    )  # fmt: skip
    layers: int | None = setting(
        None, "The head reads the pooled outputs of the last N blocks side by side, from one "
        "pass (default: the blocks the model serves as its embedding, the default model's "
        "last three; 1 for a folder without embedding.json).", since=1,
    )  # fmt: skip
    canonicalize: bool = setting(
        True, "RDKit canonical SMILES, as the pretraining corpus (--no-canonicalize: as written)."
    )
    split: str = setting(
        "scaffold", "scaffold (DeepChem-equal, no seed) | scaffold_chiral | balanced_scaffold "
        "(seeded) | random (seeded) | column:NAME (your table's own split: its column NAME "
        "says train, valid or test in each row).",
    )  # fmt: skip
    max_length: int = setting(
        256, "Tokens a SMILES is cut to, BOS and EOS included (a warning says how many are "
        "cut where more than a tenth of a set's are).", within="[3, inf)",
    )  # fmt: skip
    features: str | None = setting(
        None, "ecfp4 | rdkit2d | both: concatenate to the pooled embedding (normalised on the "
        "train split)."
    )  # fmt: skip
    augment: int = setting(
        0, "K random SMILES per training molecule; each epoch trains on one of its K + 1 "
        "spellings (0: the canonical one only).",
    )  # fmt: skip
    tta: int = setting(
        0, "Test-time augmentation: score each test molecule as the mean over its canonical and "
        "K random SMILES; epochs are still chosen on the canonical ones.",
    )  # fmt: skip
    adapt_steps: int = setting(
        0, "Before fine-tuning, N updates of the backbone's descriptor regression (MTR) on the "
        "task's training molecules.", since=0, with_=("adapt_lr",),
    )  # fmt: skip
    adapt_lr: float = setting(1e-4, "Learning rate of adapt_steps.", within="(0, 1)")
    forest: str | None = setting(
        None, "auto (the shipped default: rdkit2d, whose blend measured best for "
        "classification and regression) | none | ecfp4 | rdkit2d | both: after training, fit "
        "a random forest on these features of the same training molecules, keep it beside the "
        "model and serve the two blended (each alone reported beside).",
        since=None, with_=("forest_trees", "forest_blend", "forest_weight"),
    )  # fmt: skip
    forest_trees: int = setting(500, "Trees of the forest (capped for sets of many labels).")
    forest_blend: str = setting(
        DEFAULT_BLEND, "quantile (each score's quantile among the validation molecules' "
        "scores, then averaged) | mean (the scores averaged).",
    )  # fmt: skip
    forest_weight: float = setting(0.5, "The model's weight in the blend, 0 to 1.", within="[0, 1]")
    kernels: str = setting(
        "none", "auto (the shipped default: tanimoto,rbf,both for regression, none for "
        "classification) | none | a comma-separated list of tanimoto (ECFP4), rbf (the "
        "backbone's frozen embedding), both: support-vector regressions kept beside the model "
        "and served in its blend, each fitted on the training molecules and tuned in "
        "scaffold-whole folds of them.", since="none", with_=("combine",),
    )  # fmt: skip
    combine: str = setting(
        DEFAULT_COMBINE, "How the members are weighted, without the test molecules: fixed (the model "
        "forest_weight, the forest the rest) | oof-best (the member of the lowest out-of-fold "
        "RMSE on the training molecules) | oof-weights (weights fitted on those out-of-fold "
        "predictions) | gated (oof-weights, and the model joins at forest_weight where it "
        "beats them on the validation molecules) | picked (of fixed, gated, the forest alone "
        "and oof-best, the lowest RMSE on the validation molecules).",
    )  # fmt: skip
    cliff_gap: float = setting(
        1.0, "The least difference of two similar molecules' values, in the labels' units, "
        "that makes them an activity cliff (1: tenfold in a log unit such as a pIC50; 1.36 "
        "for a free energy in kcal/mol at 25 °C): the RMSE on the test molecules that form "
        "cliffs, reported beside a regression set's.", since=1.0, within="(0, inf)",
    )  # fmt: skip
    class_weight: str = setting(
        "none", "none | balanced: weigh each task's two classes in the loss inversely to their "
        "frequency on the training molecules (classification only; Table 8's rows: balanced "
        "for MUV and ToxCast).", since="none",
    )  # fmt: skip
    ensemble: str = setting(
        "none", "none | wide: fine-tune the model alone and with RDKit 2D beside its head, fit "
        "forests on RDKit 2D, on both and on ECFP4, keep the five in one folder a seed and "
        "serve them blended by validation quantiles (about twice the fine-tuning's cost; "
        "forest does not apply).",
    )  # fmt: skip
    extra: dict[str, Any] = setting(help="Free-form keys kept with the run.", factory=dict)

    def __post_init__(self) -> None:
        from smiexlm.finetuning.adapt import check_adapt
        from smiexlm.model.pooling import pooling_parts  # torch: loaded when a run is made

        check_settings(self)  # types, finite floats, each setting's ``within``
        check_positive_int("layers", self.layers, optional=True)
        check_adapt(self.adapt_steps, self.adapt_lr)
        for name in ("augment", "tta"):
            check_spellings(name, getattr(self, name))
        pooling_parts(self.pooling)  # one of POOLINGS, or several side by side (cls+mean+max)
        check_split_kind(self.split)
        if self.features is not None:
            check_choice("features", self.features, FEATURE_KINDS)
        if self.forest == "none":  # TOML and the command line spell None so
            self.forest = None
        if self.forest is not None:
            check_choice("forest", self.forest, (AUTO, *FEATURE_KINDS))
        check_positive_int("forest_trees", self.forest_trees)
        check_kernels(self.kernels)
        check_choice("combine", self.combine, COMBINES)
        check_blend(self.forest_weight, self.forest_blend)
        check_choice("class_weight", self.class_weight, CLASS_WEIGHTS)
        check_choice("ensemble", self.ensemble, ENSEMBLES)
        if self.ensemble != "none":  # its members choose their own features and forests
            for name, free in (
                ("features", (None,)),
                ("forest", (None, AUTO)),
                ("kernels", ("none", AUTO)),
            ):
                if getattr(self, name) not in free:
                    raise ConfigError(name, getattr(self, name), f"none with ensemble = "
                                      f"{self.ensemble!r} (its members choose their own)")  # fmt: skip
        if self.loop.freeze and self.loop.freeze_layers:
            raise ConfigError(
                "freeze_layers",
                self.loop.freeze_layers,
                "0 with freeze (which freezes every layer)",
            )

    @classmethod
    def from_flat(cls, **values: Any) -> FinetuneConfig:
        """A config from flat keys (those of :meth:`flat_keys`)."""
        if "amp" in values:  # the former name of precision ("off" = fp32)
            values["precision"] = values.pop("amp")
        names = {s.key: s.name for s in settings_of(LoopConfig)}
        loop = {names[k]: values.pop(k) for k in list(values) if k in names}
        check_positive_int("max_train_steps", loop.get("max_steps"), optional=True)
        if isinstance(loop.get("adam_betas"), list):  # TOML's array; the type check takes the rest
            loop["adam_betas"] = tuple(loop["adam_betas"])
        return cls(loop=dataclasses.replace(_default_loop(), **loop), **values)

    def to_dict(self) -> dict[str, Any]:
        """The flat record (reports, ``finetune.json``)."""
        loop = {s.key: getattr(self.loop, s.name) for s in settings_of(LoopConfig)}
        return loop | {s.key: getattr(self, s.name) for s in settings_of(type(self))}

    @classmethod
    def settings(cls) -> list[Setting]:
        """Every flat setting: the loop's, then this config's own."""
        return settings_of(LoopConfig) + settings_of(cls)

    @classmethod
    def flat_keys(cls) -> tuple[str, ...]:
        return tuple(s.key for s in cls.settings())

    @classmethod
    def recorded_of(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Flat ``values`` (those that are settings) as a run's identity holds them: a setting
        added later left out where it does what runs before it did
        (:func:`smiexlm.settings.recorded`)."""
        keys = set(cls.flat_keys())
        return recorded({k: v for k, v in values.items() if k in keys}, LoopConfig, cls)

    def recorded(self) -> dict[str, Any]:
        return self.recorded_of(self.to_dict())


def load_table(path: Path = CONFIG_PATH) -> dict[str, dict[str, Any]]:
    """The raw TOML tables: ``defaults`` and one per task."""
    with open(path, "rb") as handle:
        return tomllib.load(handle)


def read_config_file(path: Path | str, also: tuple[str, ...] = ()) -> dict[str, Any]:
    """The flat FinetuneConfig keys of a TOML file (the shape of ``hpopt``'s ``best.toml``),
    and the keys ``also`` (hpopt's own, in what ``smiexlm settings hpopt`` prints);
    DataError for a missing or malformed file, ConfigError naming the key and the file for a
    key that is neither (a table such as ``[bbbp]`` included)."""
    from smiexlm.errors import DataError
    from smiexlm.paths import check_input_file

    path = check_input_file(path, "--config")
    try:
        with open(path, "rb") as handle:
            values = tomllib.load(handle)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"--config {str(path)!r} is not a TOML file: {err}") from None
    keys = (*FinetuneConfig.flat_keys(), *also)
    for key, value in values.items():
        if key not in {*keys, "amp"} or (isinstance(value, dict) and key != "extra"):
            what = "a flat FinetuneConfig key" + (" or hpopt setting" if also else "")
            raise ConfigError(key, value, f"{what} in --config {str(path)!r} (one of "
                              f"{', '.join(sorted(keys))})")  # fmt: skip
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
    known = {*FinetuneConfig.flat_keys(), "amp"}
    for key, value in overrides.items():
        if key not in known:
            raise ConfigError(key, value, f"a FinetuneConfig field ({', '.join(sorted(known))})")
        if value is not None:
            values[key] = value
    unknown = set(values) - known
    if unknown:
        raise ConfigError(str(sorted(unknown)), path.name, "only FinetuneConfig fields")
    return FinetuneConfig.from_flat(**values)


def variant_name(backbone: Backbone, cfg: FinetuneConfig) -> str:
    """The report's row name: the backbone plus how it was fine-tuned."""
    name = backbone.name
    if cfg.adapt_steps:
        name += f" + adapt {cfg.adapt_steps}"
    if cfg.loop.head_epochs:
        name += f", head first ({cfg.loop.head_epochs} epochs)"
    if cfg.loop.layer_decay != 1.0:
        name += f", layer decay {cfg.loop.layer_decay:g}"
    if cfg.loop.freeze:
        name += " frozen"
    elif cfg.loop.freeze_layers:
        name += f" ({cfg.loop.freeze_layers} layers frozen)"
    if cfg.layers not in (None, backbone.layers):
        blocks = f"last {cfg.layers} blocks" if cfg.layers > 1 else "last block"
        name += f", head on the {blocks}"
    name += f" + {cfg.features}" if cfg.features else ""
    if cfg.class_weight == "balanced":
        name += ", classes balanced"
    if cfg.loop.ema_half_life:
        name += f", weights averaged (half-life {cfg.loop.ema_half_life:g} epochs)"
    if cfg.ensemble != "none":
        name += f", {cfg.ensemble} ensemble"
    name += f" + RF-{cfg.forest}" if cfg.forest else ""
    return name + (f" + SVR-{cfg.kernels} ({cfg.combine})" if kernel_kinds(cfg) else "")
