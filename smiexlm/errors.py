"""Exceptions raised for bad user input. Each names the field, the value and what was expected."""

from __future__ import annotations


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
