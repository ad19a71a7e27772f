"""List options shared by the commands: ``--seeds 0 1 2``, ``--seeds 0,1,2`` and
``--seeds 0 --seeds 1 --seeds 2`` all mean the same.

Click takes one value per flag; :func:`multi_value` gives a command class that rewrites the
first two spellings into the third before parsing, for the flags it names. Values run until
the next flag, so put positional arguments before a list option.

:func:`given` keeps the options a user gave, so that those left at their defaults do not
override a config file (``finetune --config``).
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand


def spread(args: list[str], names: tuple[str, ...]) -> list[str]:
    """``--k 1 2 4`` / ``--k 1,2,4`` -> ``--k 1 --k 2 --k 4`` for the list options ``names``."""
    out, current = [], None
    for arg in args:
        if arg in names:
            current = arg
            continue
        if current is not None and not arg.startswith("--"):
            out += [x for v in arg.split(",") if v for x in (current, v)]
            continue
        current = None
        out.append(arg)
    return out


def multi_value(*names: str) -> type[TyperCommand]:
    """A command class whose options ``names`` take several values after one flag."""

    class MultiValueCommand(TyperCommand):
        def parse_args(self, ctx, args):
            return super().parse_args(ctx, spread(list(args), names))

    return MultiValueCommand


def given(ctx: Any, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (option name -> value) less the options ``ctx`` (a ``typer.Context``) took
    from their defaults; all of them without a context (a call from Python)."""
    if ctx is None:
        return values
    sources = {k: ctx.get_parameter_source(k) for k in values}
    return {k: v for k, v in values.items() if sources[k] is None or sources[k].name != "DEFAULT"}
