"""Entry point of the ``smiexlm`` command.

Command modules must not import torch, RDKit, DeepChem or triton at module level: import
them inside the command body, so that ``smiexlm --help`` answers in a fraction of a second.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

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
    "smiexlm.cli.baselines",
    "smiexlm.cli.cliffs",
    "smiexlm.cli.predict",
    "smiexlm.cli.hpopt",
    "smiexlm.cli.settings",
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

OUTPUT_PARAMETERS = ("out", "output", "save_dir")  # the options that name what a command writes
PARTS_COMMANDS = ("embed", "predict", "widen")  # a folder output goes on when run again
# Commands whose folder output is theirs alone: filled with files of their own names and
# cleared of an unfinished run's, so no input may lie inside it.
FOLDER_OWNERS = (*PARTS_COMMANDS, "preprocess")
# Input folders a command writes inside by design, left out of the check that an output lies
# outside every input folder: plot-run draws RUN/loss.png by default, a picture beside the
# run's metrics that nothing of the run reads.
WRITES_INSIDE = {("plot_run", "run_dirs")}
# Commands that write their report's files (paths.REPORT_FILES) into --out
REPORT_WRITERS = ("finetune", "benchmark", "baseline")
# The outputs a second run at once would mix its results into: each is held with a lock
# while the command runs (:func:`smiexlm.training.runlock.hold_outputs`). pretrain and
# hpopt lock their --out themselves.
LOCKED_OUTPUTS = {"finetune": ("out", "save_dir"), "benchmark": ("out",), "predict": ("out",)}


def _check_paths(command: str, values: dict[str, Any], output_names: set[str],
                 path_names: set[str]) -> None:  # fmt: skip
    """The checks of :func:`_guarded` on a command's paths (option name -> value): no output
    names an input or stands where an output's side file goes; none lies inside an input
    folder; no input lies inside a folder the command owns; and the atomic writers are told
    which files are inputs, never to be written over."""
    from smiexlm.atomic import protect_inputs
    from smiexlm.paths import (
        REPORT_FILES,
        check_inputs_outside,
        check_outputs_apart,
        check_outputs_outside,
        named_paths,
        side_outputs,
    )

    outputs = {k: v for k, v in values.items() if k in output_names}
    inputs = {k: v for k, v in values.items() if k not in output_names}
    _check_writable(outputs)
    sides = side_outputs(outputs)
    if command in REPORT_WRITERS and outputs.get("--out"):  # before the hours of training
        sides["--out report file"] = [Path(outputs["--out"]) / name for name in REPORT_FILES]
    check_outputs_apart(outputs | sides, inputs)
    path_values = {k: v for k, v in values.items() if k in path_names}
    check_outputs_outside(outputs, path_values)
    if command in FOLDER_OWNERS:
        check_inputs_outside(_owned_folders(command, outputs), path_values)
    protect_inputs([p for value in path_values.values() for p in named_paths(value)])


def _owned_folders(command: str, outputs: dict[str, Any]) -> dict[str, Any]:
    """The outputs of ``command`` that are folders it owns: preprocess's always, whatever the
    name (``--out zinc.v2`` too); a parts command's where it writes parts."""
    from smiexlm.parts.job import is_parts_output

    return {k: v for k, v in outputs.items()
            if v and (command == "preprocess" or is_parts_output(Path(v)))}  # fmt: skip


def _check_writable(outputs: dict[str, Any]) -> None:
    """Refuse, before any compute, an output where nothing can be written, or one inside the
    package's shipped models, whichever way the command names its model (the default, a
    shipped name, or their folder): they are read-only."""
    from smiexlm.errors import DataError
    from smiexlm.modelio.layout import is_shipped
    from smiexlm.paths import check_writable, named_paths

    for name, value in outputs.items():
        for path in named_paths(value):
            if is_shipped(path):
                raise DataError(f"{name} {str(path)!r} lies inside the models shipped with "
                                "smiexlm, which are read-only: expected a path of your own")  # fmt: skip
            check_writable(path, name)


def _guarded(callback: Callable[..., Any]) -> Callable[..., Any]:
    """``callback`` with the checks and messages every command shares:

    - before any compute, an output path naming one of its input paths (every other
      path-valued parameter) is refused (:func:`smiexlm.paths.check_outputs_apart`), and so
      is one lying inside an input folder (:func:`smiexlm.paths.check_outputs_outside`;
      :data:`WRITES_INSIDE` excepted) and a column named twice in a column option
      (``--label-cols y y``);
    - the outputs of :data:`LOCKED_OUTPUTS` are held for the run, so that a second run into
      one of them is refused naming the first one's process;
    - an OS fault (no space, no permission, a read-only disk, a file where a folder is
      expected) becomes one ``error:`` line naming the path and the errno's words
      (:func:`smiexlm.errors.storage_error`), saying how the command goes on where it does;
    - Ctrl-C and SIGTERM end with one line saying so, and how the command goes on.
    """
    signature = inspect.signature(callback)
    hints = typing.get_type_hints(callback, include_extras=True)
    shown = {name: _shown(name, hints.get(name)) for name in signature.parameters}
    path_inputs = {name for name in signature.parameters if _holds_paths(hints.get(name))
                   and name not in OUTPUT_PARAMETERS
                   and (callback.__name__, name) not in WRITES_INSIDE}  # fmt: skip
    resumes = "the same command with --resume goes on" if "resume" in signature.parameters else ""

    @functools.wraps(callback)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        from smiexlm.atomic import protect_inputs
        from smiexlm.cli.params import distinct_columns
        from smiexlm.errors import storage_error
        from smiexlm.training.runlock import hold_outputs

        values = signature.bind_partial(*args, **kwargs).arguments
        resumable = resumes
        if callback.__name__ in PARTS_COMMANDS and not Path(values.get("out") or "x.csv").suffix:
            resumable = "the same command goes on from its finished parts"
        for name, value in values.items():
            if name.endswith("_cols") and value:
                distinct_columns(shown[name], value)
        _check_paths(callback.__name__, {shown[k]: v for k, v in values.items()},
                     {shown[k] for k in OUTPUT_PARAMETERS if k in shown},
                     {shown[k] for k in path_inputs})  # fmt: skip
        try:
            with hold_outputs(_locked(callback.__name__, values, shown)):
                callback(*args, **kwargs)  # what it returns is not an exit code
        except (KeyboardInterrupt, SystemExit) as stop:
            code = 130 if isinstance(stop, KeyboardInterrupt) else stop.code
            if code in (130, 143):  # Ctrl-C, or SIGTERM (``_terminate``)
                name = "Ctrl-C" if code == 130 else "SIGTERM"
                goes_on = f"; {resumable}" if resumable else ""
                typer.echo(f"interrupted by {name}{goes_on}", err=True)
                raise SystemExit(code) from None
            raise
        except Exception as err:
            fault = storage_error(err, resumable)
            if fault is None:
                raise
            raise fault from None
        finally:
            protect_inputs([])  # the command's inputs, protected while it runs

    return guarded


def _holds_paths(hint: Any) -> bool:
    """Whether a parameter's type holds paths (``Path``, ``Path | None``, ``list[Path]``):
    a text option (a task, a column, a config's name) names no input folder even when a
    folder of that name happens to exist."""
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    return hint is Path or any(_holds_paths(arg) for arg in typing.get_args(hint))


def _locked(
    command: str, values: dict[str, Any], shown: dict[str, str]
) -> list[tuple[str, Path, Literal["file", "folder"]]]:
    """``(option, path, kind)`` of each output of ``command`` held for its run
    (:data:`LOCKED_OUTPUTS`): a folder, or a file for a parts command's output with a suffix
    (``predict --out p.csv``). ``--output`` stands in for ``--out`` where it is given."""
    held = []
    for name in LOCKED_OUTPUTS.get(command, ()):
        if name == "out" and values.get("output") is not None:
            name = "output"
        path = values.get(name)
        if path is not None:
            kind = "file" if command in PARTS_COMMANDS and Path(path).suffix else "folder"
            held.append((shown[name], Path(path), kind))
    return held


def _shown(parameter: str, hint: Any) -> str:
    """How a parameter is named on the command line: its first long flag (``--save-dir``),
    or ``INPUT`` for an argument."""
    for meta in getattr(hint, "__metadata__", ()):
        if isinstance(meta, typer.models.ArgumentInfo):
            return parameter.upper()
        flags = [d for d in getattr(meta, "param_decls", None) or () if d.startswith("--")]
        if flags:
            return flags[0].split("/")[0]
    return "--" + parameter.replace("_", "-")


def _guard_commands(typer_app: typer.Typer) -> None:
    for info in typer_app.registered_commands:
        if info.callback is not None:
            info.callback = _guarded(info.callback)
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _guard_commands(group.typer_instance)


_guard_commands(app)


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C: temporary outputs are removed


#: what a usage error (an unknown option, a value out of range) is raised as, whichever click
#: typer carries
_USAGE_ERRORS = tuple(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _usage_line(err: Exception) -> str:
    """A usage error as one line: the command, what is wrong (with the value given, where the
    message leaves it out) and where its help is."""
    ctx = getattr(err, "ctx", None)
    where = ctx.command_path if ctx is not None else "smiexlm"
    message = err.format_message().rstrip(".")  # type: ignore[attr-defined]
    errors = getattr(err.__cause__, "errors", None)  # a value check's own record
    if callable(errors):
        given = next(iter(errors()), {}).get("input")
        if given is not None and repr(given) not in message:
            message += f" (got {given!r})"
    return f"{where}: {message}; see `{where} --help`"


def main() -> None:
    import signal

    from smiexlm.errors import SmiexlmError

    signal.signal(signal.SIGTERM, _terminate)
    try:
        code = app(standalone_mode=False)
    except SmiexlmError as err:  # bad input: one clear line, no traceback
        typer.echo(f"error: {err}", err=True)
        raise SystemExit(2) from None
    except _USAGE_ERRORS as err:
        if type(err).__name__ == "NoArgsIsHelpError":  # a bare group: its help
            typer.echo(err.ctx.get_help())  # type: ignore[attr-defined]
        else:  # a usage error: one line, as bad input gets
            typer.echo(f"error: {_usage_line(err)}", err=True)
        raise SystemExit(err.exit_code) from None  # type: ignore[attr-defined]
    except typer.Abort:
        typer.echo("aborted", err=True)
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)  # typer.Exit's code, when raised


if __name__ == "__main__":
    main()
