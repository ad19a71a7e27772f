"""Command-line options derived from a config's settings (:mod:`smiexlm.settings`).

:func:`with_settings` gives a command one option per setting (its flags, type and help from
the dataclass field) and ``--set KEY=VALUE`` for any of them; the command receives those the
user gave as one dict, ``settings``. Only the ones named ``shown`` appear in ``--help``, so
that it lists what people reach for; the others still work by name (``--forest rdkit2d``),
so recorded commands replay. ``smiexlm settings`` prints them all.
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer

from smiexlm.settings import Setting, assignments

SET_HELP = ("Any setting as KEY=VALUE (repeat the option; `smiexlm settings {command}` lists "
            "them with their values); these and the options here win over --config.")  # fmt: skip


def option_type(hint: Any) -> type | None:
    """The plain type a command-line option of ``hint`` takes (int, float, str, bool), or
    None when the setting is only given by ``--set`` (a tuple, a table)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return option_type(args[0]) if len(args) == 1 else None
    if typing.get_origin(hint) is typing.Literal:
        kinds = {type(a) for a in typing.get_args(hint)}
        return kinds.pop() if len(kinds) == 1 else None
    return hint if hint in (int, float, str, bool) else None


def _parameter(spec: Setting, shown: bool) -> inspect.Parameter | None:
    kind = option_type(spec.hint)
    if kind is None:
        return None
    flags = spec.flags
    if kind is bool:  # --freeze / --no-freeze
        flags = (f"{flags[0]}/--no-{flags[0].removeprefix('--')}", *flags[1:])
    info = typer.Option(*flags, help=spec.help, hidden=not shown, show_default=False)
    return inspect.Parameter(spec.key, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[kind | None, info])  # fmt: skip


def with_settings(
    command: Callable[..., Any], specs: Sequence[Setting], shown: Sequence[str], name: str,
) -> Callable[..., Any]:  # fmt: skip
    """``command`` (whose last parameter is ``settings``) taking each of ``specs`` as an
    option and ``--set``; ``name`` is the command's, for the help."""
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values()
           if p.name != "settings"]  # fmt: skip
    taken = {p.name for p in own}
    derived = [p for s in specs if s.key not in taken and (p := _parameter(s, s.key in shown))]
    missing = set(shown) - {p.name for p in derived}
    if missing:
        raise ValueError(f"{name}: shown settings {sorted(missing)} are not options")
    set_option = inspect.Parameter(
        "set_", inspect.Parameter.KEYWORD_ONLY, default=None,
        annotation=Annotated[list[str] | None, typer.Option(
            "--set", metavar="KEY=VALUE", help=SET_HELP.format(command=name),
            show_default=False)],
    )  # fmt: skip
    keys, names = {s.key for s in specs}, {p.name for p in derived}

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        given = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
        given = {k: v for k, v in given.items() if v is not None}
        chosen = assignments(kwargs.pop("set_"), keys)
        for key in chosen.keys() & given.keys():
            flag = "--" + key.replace("_", "-")
            raise typer.BadParameter(f"{key} is given twice (--set {key}=... and {flag})")
        return command(*args, **kwargs, settings=given | chosen)

    params = [*(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) if p.default is not p.empty
                else p for p in own), *derived, set_option]  # fmt: skip
    run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    del run.__wrapped__  # typer reads the signature above, not the command's
    return run


def toml_lines(specs: Sequence[Setting], values: dict[str, Any]) -> list[str]:
    """Each setting as TOML, its help as a comment above; a setting without a value (None,
    its default's meaning given in its help) commented out, so the text reads back as it is
    (``--config FILE``)."""
    import textwrap

    from smiexlm.settings import toml_value

    lines = []
    for spec in specs:
        value = values.get(spec.key)
        if isinstance(value, dict) and not value:
            continue
        lines += textwrap.wrap(spec.help, 86, initial_indent="# ", subsequent_indent="# ")
        text = "(none)" if value is None else toml_value(value)
        lines += [f"{'# ' if value is None else ''}{spec.key} = {text}", ""]
    return lines


def settings(
    command: Annotated[
        str, typer.Argument(help="finetune | hpopt | pretrain.", show_default=False)
    ],
    name: Annotated[
        str | None,
        typer.Argument(
            help="finetune, hpopt: a MoleculeNet set, whose Table 8 row gives the "
            "values (default: the defaults); pretrain: a shipped config or a TOML "
            "file (default: mol_tiny_exlm).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print every setting of a command as TOML, each with its help and the value a run
    starts from. Save it, edit it and pass it back (finetune and hpopt: --config FILE;
    pretrain: --config FILE)."""
    from smiexlm.errors import ConfigError

    makers = {"finetune": _finetune_lines, "hpopt": _hpopt_lines, "pretrain": _pretrain_lines}
    if command not in makers:
        raise ConfigError("COMMAND", command, "finetune, hpopt or pretrain")
    typer.echo("\n".join(makers[command](name)).rstrip())


def _finetune_lines(task: str | None) -> list[str]:
    from smiexlm.finetuning.config import FinetuneConfig, finetune_config

    if task is not None:
        _say_whose(task)
    return toml_lines(FinetuneConfig.settings(), finetune_config(task).to_dict())


def _say_whose(task: str) -> None:
    """One line on stderr where ``task`` has no Table 8 row: the values printed are the
    defaults a table of one's own (``--data``) starts from, and a near name is suggested."""
    import difflib

    from smiexlm.finetuning.config import load_table
    from smiexlm.moleculenet.registry import ALIASES, DATASETS

    rows = [name for name in load_table() if name != "defaults"]
    if task.lower() in rows:
        return
    if task.lower() in {*DATASETS, *ALIASES}:
        typer.echo(f"{task!r} has no Table 8 row: these are the defaults it starts from", err=True)
        return
    near = difflib.get_close_matches(task.lower(), [*DATASETS, *ALIASES], n=1, cutoff=0.75)
    guess = f" (did you mean {near[0]!r}?)" if near else ""
    typer.echo(f"{task!r} is no MoleculeNet set{guess}: these are the defaults a table of your "
               "own (--data) starts from", err=True)  # fmt: skip


def _hpopt_lines(task: str | None) -> list[str]:
    from smiexlm.hpopt.config import HpoptConfig
    from smiexlm.settings import settings_of

    search = settings_of(HpoptConfig)
    own = toml_lines(search, {s.key: s.default for s in search})
    return [*own, "# ---- the base config the search starts from", *_finetune_lines(task)]


def _pretrain_lines(name: str | None) -> list[str]:
    from smiexlm.pretraining.config import TrainConfig, load_config
    from smiexlm.settings import settings_of, to_toml

    cfg = load_config(name or "mol_tiny_exlm")
    model = to_toml({"model": cfg.model.to_table()}).strip()
    return [*toml_lines(settings_of(TrainConfig), cfg.to_dict()), model]


def register(app: typer.Typer) -> None:
    app.command("settings")(settings)
