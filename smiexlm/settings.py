"""One declaration per setting: a config dataclass's field made with :func:`setting`.

The field is the setting's name, type and default; its check lives in the dataclass's
``__post_init__``; :func:`setting` adds what the rest of the product reads off it:

- ``help``: the sentence the command line shows and ``smiexlm settings`` prints;
- ``key``: its flat name where that differs from the field's (the loop's ``max_steps`` is
  fine-tuning's ``max_train_steps``);
- ``flags``: its command-line spellings (default ``--name-with-dashes``);
- ``since``: for a setting added after runs were first recorded, the value that does what
  those runs did, and ``with_``: the settings that only matter beside it. Where a setting is
  at its ``since`` value it and those are left out of a run's identity (:func:`recorded`), so
  that a state or result saved before the setting existed still matches.

So a new setting is one field: the command line (:mod:`smiexlm.cli.settings`), the
TOML readers and every identity take it with no other edit.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from collections.abc import Iterator
from dataclasses import MISSING, dataclass
from typing import Any

from smiexlm.errors import ConfigError

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

    @property
    def added_later(self) -> bool:
        return self.since is not _ALWAYS


def setting(
    default: Any = MISSING, help: str = "", *, factory: Any = MISSING, key: str | None = None,
    flags: tuple[str, ...] = (), since: Any = _ALWAYS, with_: tuple[str, ...] = (),
) -> Any:  # fmt: skip
    """A dataclass field that is a setting (see the module docstring)."""
    if not help:
        raise ValueError("a setting needs its help")
    meta = {_META: {"help": help, "key": key, "flags": tuple(flags), "since": since,
                    "with_": tuple(with_)}}  # fmt: skip
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
                           meta["since"], meta["with_"]))  # fmt: skip
    return out


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
