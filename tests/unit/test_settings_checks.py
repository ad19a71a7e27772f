"""Every setting checked where it is declared: a float is finite, and each number lies in
the interval its field declares (``setting(..., within=...)``), for every config alike."""

from __future__ import annotations

import dataclasses
import math

import pytest

from smiexlm.errors import ConfigError
from smiexlm.finetuning.config import FinetuneConfig, finetune_config
from smiexlm.finetuning.loop_config import LoopConfig
from smiexlm.hpopt.config import HpoptConfig
from smiexlm.pretraining.config import TrainConfig
from smiexlm.settings import Interval, settings_of

BASE = {
    LoopConfig: dict(epochs=1, batch_size=2, lr=1e-4),
    FinetuneConfig: {},
    TrainConfig: {},
    HpoptConfig: dict(trials=1),
}


def _floats(cls):
    """(class, setting) for every setting whose values are floats (a list of floats too)."""

    def is_float(hint) -> bool:
        return hint is float or float in getattr(hint, "__args__", ())

    return [(cls, s) for s in settings_of(cls) if is_float(s.hint)]


FLOATS = [pair for cls in BASE for pair in _floats(cls)]
IDS = [f"{cls.__name__}.{spec.key}" for cls, spec in FLOATS]


def _named(cls, spec) -> str:
    """How an error names the setting: hpopt's by their flags, as its options are."""
    return spec.flags[0] if cls is HpoptConfig else spec.key


def _build(cls, name: str, value):
    if cls is FinetuneConfig:  # its loop's settings go through the flat keys
        loop = {s.name for s in settings_of(LoopConfig)}
        if name in loop:
            return FinetuneConfig(loop=LoopConfig(**BASE[LoopConfig] | {name: value}))
    return cls(**BASE[cls] | {name: value})


def test_every_float_setting_is_declared_with_its_interval():
    """A float setting without ``within`` would take any finite value to the library below;
    each says what it takes (a budget may be None)."""
    bare = [f"{cls.__name__}.{s.name}" for cls, s in FLOATS if s.within is None]
    assert bare == []


@pytest.mark.parametrize(("cls", "spec"), FLOATS, ids=IDS)
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_no_float_setting_takes_inf_or_nan(cls, spec, bad):
    value = (bad, 0.9) if isinstance(spec.default, tuple) else bad
    with pytest.raises(ConfigError, match=_named(cls, spec)) as err:
        _build(cls, spec.name, value)
    assert "finite" in str(err.value)


@pytest.mark.parametrize(("cls", "spec"), FLOATS, ids=IDS)
def test_each_float_setting_refuses_just_outside_its_interval_and_takes_its_ends(cls, spec):
    within = spec.within
    outside = []
    if math.isfinite(within.low):
        outside.append(within.low if within.low_open else math.nextafter(within.low, -math.inf))
    if math.isfinite(within.high):
        outside.append(within.high if within.high_open else math.nextafter(within.high, math.inf))
    for value in outside:
        value = (value, 0.9) if isinstance(spec.default, tuple) else value
        with pytest.raises(ConfigError, match=f"'{_named(cls, spec)}'.*{re_escape(str(within))}"):
            _build(cls, spec.name, value)


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


def test_interval_parse_admits_and_describes():
    half_open = Interval.parse("(0, 1]")
    assert [half_open.admits(x) for x in (0, 1e-300, 1, 1.0000001)] == [False, True, True, False]
    assert str(half_open) == "(0, 1]" and str(Interval.parse("[0, inf]")) == "[0, inf)"
    assert not Interval.parse("[0, inf)").admits(math.inf)
    for bad in ("0, 1", "[1, 0]", "(a, 1)"):
        with pytest.raises(ValueError):
            Interval.parse(bad)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("adam_betas", 0.9, "a list"),  # a TypeError in the config reader before
        ("adam_betas", [0.9, 2], "in [0, 1) each"),
        ("adam_eps", -1, "in (0, inf)"),
        ("weight_decay", -1, "in [0, inf)"),
        ("lr", 1e10, "in (0, 1]"),
        ("lr", float("inf"), "finite"),
        ("max_length", 1, "in [3, inf)"),
    ],
)
def test_finetune_and_pretrain_refuse_optimiser_settings_alike(key, value, expected):
    with pytest.raises(ConfigError, match=re_escape(expected)):
        finetune_config("bbbp", **{key: value})
    if key in {f.name for f in dataclasses.fields(TrainConfig)}:
        with pytest.raises(ConfigError, match=re_escape(expected)):
            TrainConfig(**{key: value})


def test_hpopt_budget_in_minutes_is_finite():
    with pytest.raises(ConfigError, match="'--cpu-minutes' = inf: expected a finite number"):
        HpoptConfig(cpu_minutes=math.inf)
    assert HpoptConfig(cpu_minutes=0.5).cpu_minutes == 0.5
