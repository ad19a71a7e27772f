"""One declaration per setting: a config dataclass's field made with :func:`setting`.

The field is the setting's name, type and default; its check lives in the dataclass's
``__post_init__``; :func:`setting` adds what the rest of the product reads off it:

- ``help``: the sentence the command line shows and ``smiexlm settings`` prints;
- ``key``: its flat name where that differs from the field's (the loop's ``max_steps`` is
  fine-tuning's ``max_train_steps``);
- ``flags``: its command-line spellings (default ``--name-with-dashes``);
- ``within``: the interval a number (each number of a list) must lie in, written as in
  mathematics (``"(0, 1]"``, ``"[0, inf)"``); :func:`check_settings` holds every value to it,
  and every float to being finite, so that nothing below (torch's optimiser, a forest, a
  schedule) ever sees a value its config did not check;
- ``since``: for a setting added after runs were first recorded, the value that does what
  those runs did, and ``with_``: the settings that only matter beside it. Where a setting is
  at its ``since`` value it and those are left out of a run's identity (:func:`recorded`), so
  that a state or result saved before the setting existed still matches.

So a new setting is one field: its check, the command line (:mod:`smiexlm.cli.settings`), the
TOML readers and every identity take it with no other edit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
import typing
from collections.abc import Iterator
from dataclasses import MISSING, dataclass
from typing import Any

from smiexlm.errors import ConfigError, check_field_types

_META = "smiexlm.setting"
_ALWAYS = object()  # no ``since``: the setting is part of every identity


@dataclass(frozen=True)
class Setting:
    """What :func:`setting` declared of one field, with its resolved type and default."""

    name: str  # the dataclass field
    key: str  # the flat name (TOML, ``--set``, records)
    hint: Any  # the resolved annotation
    default: Any  # MISSING when the field has none (or a factory)
    help: str
    flags: tuple[str, ...]
    since: Any = _ALWAYS
    with_: tuple[str, ...] = ()
    within: Interval | None = None

    @property
    def added_later(self) -> bool:
        return self.since is not _ALWAYS


@dataclass(frozen=True)
class Interval:
    """The numbers a setting accepts: ``low`` to ``high``, each end open or closed (an end at
    infinity is open: a setting is always finite)."""

    low: float
    high: float
    low_open: bool
    high_open: bool

    @classmethod
    def parse(cls, text: str) -> Interval:
        """``"(0, 1]"`` -> Interval(0, 1, True, False); ValueError for anything else."""
        found = re.fullmatch(r"\s*([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])\s*", text)
        if found is None:
            raise ValueError(f"an interval such as '(0, 1]', not {text!r}")
        low, high = float(found[2]), float(found[3])
        if not low < high:
            raise ValueError(f"an interval whose low end is below its high end, not {text!r}")
        return cls(low, high, found[1] == "(" or low == -math.inf,
                   found[4] == ")" or high == math.inf)  # fmt: skip

    def admits(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        def end(x: float) -> str:
            return "inf" if x == math.inf else "-inf" if x == -math.inf else f"{x:g}"

        return (f"{'(' if self.low_open else '['}{end(self.low)}, {end(self.high)}"
                f"{')' if self.high_open else ']'}")  # fmt: skip

    def expected(self) -> str:
        """The words of a :class:`ConfigError`: ``a finite number in (0, 1]``."""
        return f"a finite number in {self}"


def setting(
    default: Any = MISSING, help: str = "", *, factory: Any = MISSING, key: str | None = None,
    flags: tuple[str, ...] = (), since: Any = _ALWAYS, with_: tuple[str, ...] = (),
    within: str | None = None,
) -> Any:  # fmt: skip
    """A dataclass field that is a setting (see the module docstring)."""
    if not help:
        raise ValueError("a setting needs its help")
    interval = Interval.parse(within) if within is not None else None
    meta = {_META: {"help": help, "key": key, "flags": tuple(flags), "since": since,
                    "with_": tuple(with_), "within": interval}}  # fmt: skip
    if factory is not MISSING:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def settings_of(cls: type) -> list[Setting]:
    """The settings of the dataclass ``cls``, in field order (its other fields are not)."""
    hints = typing.get_type_hints(cls)
    out = []
    for spec in dataclasses.fields(cls):
        meta = spec.metadata.get(_META)
        if meta is None:
            continue
        key = meta["key"] or spec.name
        flags = meta["flags"] or ("--" + key.replace("_", "-"),)
        out.append(Setting(spec.name, key, hints[spec.name], spec.default, meta["help"], flags,
                           meta["since"], meta["with_"], meta["within"]))  # fmt: skip
    return out


def check_settings(instance: Any, prefix: str = "", as_flags: bool = False) -> None:
    """ConfigError naming the first setting of the dataclass ``instance`` whose value is not
    of its type (:func:`~smiexlm.errors.check_field_types`, which also holds every float to
    being finite) or lies outside its declared ``within`` (each number of a list, such as
    ``adam_betas``); named by its command-line flag with ``as_flags`` (a command whose
    settings are all options, such as ``hpopt``'s ``--cpu-minutes``). Called first in
    ``__post_init__`` of every config."""
    specs = settings_of(type(instance))
    try:
        check_field_types(instance, prefix)
        for spec in specs:
            value = getattr(instance, spec.name)
            if spec.within is None or value is None:
                continue
            numbers = value if isinstance(value, (list, tuple)) else [value]
            if not all(spec.within.admits(v) for v in numbers):
                many = " each" if isinstance(value, (list, tuple)) else ""
                raise ConfigError(prefix + spec.key, value, spec.within.expected() + many)
    except ConfigError as err:
        flag = {prefix + s.name: s.flags[0] for s in specs} | {
            prefix + s.key: s.flags[0] for s in specs
        }
        if not as_flags or err.field not in flag:
            raise
        raise ConfigError(flag[err.field], err.value, err.expected) from None


def recorded(values: dict[str, Any], *classes: type) -> dict[str, Any]:
    """``values`` (flat settings) as an identity holds them: each setting of ``classes``
    added later left out where it is at its ``since`` value, with the settings that go with
    it."""
    out = dict(values)
    for spec in (s for cls in classes for s in settings_of(cls) if s.added_later):
        if spec.key in out and out[spec.key] == spec.since:
            for key in (spec.key, *spec.with_):
                out.pop(key, None)
    return out


def parse_value(text: str) -> Any:
    """A value as a command line writes it: a TOML literal (``3``, ``1e-4``, ``true``,
    ``[0.9, 0.99]``, ``"x"``), else the text itself (``rdkit2d``)."""
    try:
        return tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def parse_assignment(item: str, option: str = "--set") -> tuple[str, Any]:
    """``"lr=3e-4"`` -> ("lr", 0.0003); ConfigError naming ``option`` without ``=``."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(option, item, "KEY=VALUE, such as lr=3e-4")
    return key.strip(), parse_value(raw)


def assignments(items: list[str] | None, known: Iterator[str] | set[str],
                option: str = "--set") -> dict[str, Any]:  # fmt: skip
    """The ``KEY=VALUE`` items as a dict; ConfigError naming an unknown key or one given
    twice, with the keys there are."""
    names, out = set(known), {}
    for item in items or []:
        key, value = parse_assignment(item, option)
        if key not in names:
            raise ConfigError(option, item, f"a known setting ({', '.join(sorted(names))})")
        if key in out:
            raise ConfigError(option, item, f"{key} once")
        out[key] = value
    return out


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise ConfigError("value", value, "a string, number, boolean or list")


def to_toml(data: dict[str, Any]) -> str:
    """Flat keys first, then one table per nested dict; ``None`` values are left out."""
    flat = [
        f"{k} = {toml_value(v)}"
        for k, v in data.items()
        if v is not None and not isinstance(v, dict)
    ]
    tables = []
    for name, table in data.items():
        if isinstance(table, dict):
            body = [f"{k} = {toml_value(v)}" for k, v in table.items() if v is not None]
            tables.append(f"\n[{name}]\n" + "\n".join(body))
    return "\n".join(flat) + "\n" + "\n".join(tables) + "\n"
