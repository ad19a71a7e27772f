"""Exceptions raised for bad user input. Each names the field, the value and what was expected."""

from __future__ import annotations

import errno
import os
import re


def shorten(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters for a message, saying how long it was."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text):,} characters)"


class SmiexlmError(Exception):
    """Base class of every error smiexlm raises on purpose."""


class InvalidSmilesError(SmiexlmError, ValueError):
    """A SMILES string that cannot be tokenized (or parsed) without losing characters."""

    def __init__(self, smiles: str, position: int | None = None, reason: str = ""):
        self.smiles = smiles
        self.position = position
        self.reason = reason
        where = f" at character {position} ({smiles[position]!r})" if position is not None else ""
        detail = f": {reason}" if reason else ""
        super().__init__(f"invalid SMILES {shorten(smiles)!r}{where}{detail}")


class ConfigError(SmiexlmError, ValueError):
    """A configuration field with a value outside what it accepts."""

    def __init__(self, field: str, value: object, expected: str):
        self.field, self.value, self.expected = field, value, expected
        super().__init__(f"config field {field!r} = {value!r}: expected {expected}")


def check_choice(field: str, value: object, choices: tuple) -> None:
    """ConfigError unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(field, value, "one of " + ", ".join(repr(c) for c in choices))


def check_spellings(field: str, value: object) -> None:
    """ConfigError unless ``value`` is a number of random SMILES: 0 (none) or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(field, value, "0 (none) or a positive number of random SMILES")


def check_positive_int(field: str, value: object, optional: bool = False) -> None:
    """ConfigError unless ``value`` is an integer >= 1 (or None when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(field, value, "a positive integer" + (" or None" if optional else ""))


def check_distinct(field: str, names: list, what: str = "column") -> None:
    """DataError naming ``field`` when a name of ``names`` (columns, or ``what`` they are) is
    given twice."""
    twice = sorted({str(c) for c in names if names.count(c) > 1})
    if twice:
        raise DataError(f"{field} {list(names)}: names {twice} more than once; expected each "
                        f"{what} once")  # fmt: skip


def check_fraction(field: str, value: object) -> None:
    """ConfigError unless ``value`` is a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(field, value, "a number in [0, 1)")


class VocabularyMismatchError(SmiexlmError, ValueError):
    """Two artefacts (dataset, checkpoint, config) were built with different vocabularies."""


class DataError(SmiexlmError, ValueError):
    """An input file or column that is missing, unreadable or malformed."""


def every_row_failed(
    kind: str, smiles_col: str, path: object, n_rows: int, rejects: list, shown: int = 3
) -> DataError:
    """The error of an ``embed``/``predict`` job none of whose ``n_rows`` input rows gave a
    result: the first ``shown`` of ``rejects`` ((row, SMILES, reason) triples) with their
    reasons. Its output is not kept: all NaN, it would only look like a result."""
    first = "; ".join(f"row {row} {shorten(str(text), 30)!r}: {reason}"
                      for row, text, reason in list(rejects)[:shown])  # fmt: skip
    more = "; ..." if n_rows > shown else ""
    verb = {"embed": "embedded", "predict": "predicted"}.get(kind, "processed")
    return DataError(
        f"--smiles-col {smiles_col!r}: none of the {n_rows:,} rows of {str(path)!r} could be "
        f"{verb}, so nothing was written ({first}{more}); expected a column of SMILES"
    )


def first_line(err: BaseException, limit: int | None = None) -> str:
    """The first line of ``err``'s message (its type's name when it has none), at most
    ``limit`` characters: what a one-line error quotes of a library's multi-line one."""
    text = str(err).strip()
    return (text.splitlines()[0] if text else type(err).__name__)[:limit]


class DivergedError(SmiexlmError, ArithmeticError):
    """A training run whose loss, gradients or weights stopped being finite: it ends there,
    keeping no result and saving no model, with one line naming where and what to lower."""


class StorageError(SmiexlmError, OSError):
    """The operating system refused a read or a write (no space left, no permission, a
    read-only disk, a file where a folder is expected...): one line naming the path."""


_ARROW_OS_ERROR = re.compile(r"\[errno (?P<errno>\d+)\] (?P<words>.*)")
_RUST_OS_ERROR = re.compile(
    r"(?P<words>[^:]*) \(os error (?P<errno>\d+)\)(?: at path \"(?P<path>[^\"]*)\")?"
)


def as_os_error(err: BaseException, path: object = None) -> OSError | None:
    """``err`` as an ``OSError`` naming a path (``path`` where it names none), or None when
    it is no OS fault: safetensors reports its I/O faults as text (``SafetensorError``:
    "... (os error 28) at path ..."), pyarrow as an ``OSError`` whose errno is in its text."""
    if isinstance(err, OSError):
        code, words = err.errno, err.strerror or str(err)
        if found := _ARROW_OS_ERROR.search(words):
            code, words = int(found["errno"]), found["words"]
        named = err.filename if err.filename is not None else path
        fault = OSError(code, words, *([os.fspath(named)] if named is not None else []))
        fault.filename2 = err.filename2
        return fault
    if type(err).__name__ == "SafetensorError" and (found := _RUST_OS_ERROR.search(str(err))):
        words = found["words"].split(": ")[-1].strip()
        named = path if path is not None else found["path"]
        return OSError(int(found["errno"]), words, *([os.fspath(named)] if named else []))
    return None


def storage_error(err: BaseException, resumable: str = "") -> StorageError | None:
    """The one-line :class:`StorageError` of an OS fault (:func:`as_os_error`), or None when
    ``err`` is none. It names the path, the errno's words and symbol, and, where the command
    resumes, ``resumable`` (how it goes on)."""
    if isinstance(err, StorageError):
        return err
    fault = as_os_error(err)
    if fault is None:
        return None
    code, words = fault.errno, fault.strerror
    paths = [p for p in (fault.filename, fault.filename2) if p is not None]
    symbol = errno.errorcode.get(code, "") if code is not None else ""
    where = " -> ".join(repr(os.fsdecode(p)) for p in paths) or "a file or folder"
    message = f"{where}: {words}" + (f" ({symbol})" if symbol else "")
    if code in (errno.ENOSPC, errno.EDQUOT):
        message += "; free some space there"
    if resumable:
        message += f"; nothing partial was kept under an output's name, and {resumable}"
    stored = StorageError(message)
    stored.errno = code
    return stored


def check_field_types(instance: object, prefix: str = "") -> None:
    """ConfigError naming the first field of a dataclass ``instance`` whose value is not of
    its annotated type: a bool is a bool (never ``"no"`` or 1), an int an int (never 2.0 or
    True), a float any finite real number but a bool (never inf or NaN), a str a str; ``X | None`` admits None, a
    ``tuple[float, float]`` two numbers, a ``Literal`` a value of its choices' type (the
    choices themselves are each field's own check). Called first in ``__post_init__`` of
    every config, so that a TOML file, a command line and Python are held to the same types.
    """
    import dataclasses
    import typing

    hints = typing.get_type_hints(type(instance))
    for spec in dataclasses.fields(instance):  # type: ignore[arg-type]
        if spec.name in hints and spec.init:
            value = getattr(instance, spec.name)
            expected = _type_problem(hints[spec.name], value)
            if expected is not None:
                raise ConfigError(prefix + spec.name, value, expected)


def _type_problem(hint: object, value: object) -> str | None:
    """What ``value`` was expected to be under the annotation ``hint``; None when it is."""
    import math
    import numbers
    import types
    import typing

    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any or hint is object:
        return None
    if origin in (typing.Union, types.UnionType):
        problems = [_type_problem(a, value) for a in args]
        if any(p is None for p in problems):
            return None
        return " or ".join(p for p in problems if p) or "another type"
    if hint is type(None):
        return None if value is None else "none"
    if origin is typing.Literal:
        kinds = tuple({type(a) for a in args})
        return None if isinstance(value, kinds) else "one of " + ", ".join(map(repr, args))
    if hint is bool:
        return None if isinstance(value, bool) else "true or false (a boolean)"
    if hint is int:
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        return None if ok else "an integer"
    if hint is float:  # a float setting is finite wherever it is given (never inf or NaN)
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        return None if ok and math.isfinite(value) else "a finite number"
    if hint is str:
        return None if isinstance(value, str) else "a string"
    if origin is tuple or hint is tuple:
        if not isinstance(value, (tuple, list)):
            return "a list"
        if args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                return f"a list of {len(args)}"
            for a, v in zip(args, value, strict=True):
                if (problem := _type_problem(a, v)) is not None:
                    return f"a list of {len(args)}, each {problem}"
        return None
    if origin in (list, dict) or hint in (list, dict):
        kind = origin or hint
        return None if isinstance(value, kind) else f"a {'list' if kind is list else 'table'}"
    return None  # another class (a nested config): its own checks
