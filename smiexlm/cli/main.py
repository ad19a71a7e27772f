"""Entry point of the ``smiexlm`` command.

Command modules must not import torch, RDKit, DeepChem or triton at module level: import
them inside the command body, so that ``smiexlm --help`` answers in a fraction of a second.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="smiexlm",
    help="SMILES language models: tokenize, preprocess, pretrain (MLM / ExLM / MAE-LM), "
    "fine-tune on MoleculeNet, embed molecules.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module defines ``register(app)``; the order here is the order in ``--help``.
COMMAND_MODULES = [
    "smiexlm.cli.tokenize",
    "smiexlm.cli.preprocess",
    "smiexlm.cli.widen",
    "smiexlm.cli.pretrain",
    "smiexlm.cli.moleculenet",
    "smiexlm.cli.predict",
    "smiexlm.cli.hpopt",
    "smiexlm.cli.embed",
    "smiexlm.cli.search",
    "smiexlm.cli.serving",
    "smiexlm.cli.analyze",
    "smiexlm.cli.text",
    "smiexlm.cli.glue",
]

for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def _one_line_summaries(typer_app: typer.Typer) -> None:
    """The command lists of ``--help`` show each command's first paragraph as one flowing
    line: typer keeps the docstring's own line breaks there, which leaves ragged rows."""
    for info in typer_app.registered_commands:
        text = info.help or (info.callback.__doc__ if info.callback else None) or ""
        if info.short_help is None and text.strip():
            info.short_help = " ".join(text.strip().split("\n\n")[0].split())
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


_one_line_summaries(app)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: temporary outputs are removed


def main() -> None:
    import signal

    from smiexlm.errors import SmiexlmError

    signal.signal(signal.SIGTERM, _terminate)
    try:
        app()
    except SmiexlmError as err:  # bad input: one clear line, no traceback
        typer.echo(f"error: {err}", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
