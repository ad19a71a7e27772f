"""Every command of the CLI answers ``--help`` and is run for real by some test.

A command added without a test fails here: the second test looks for its invocation (the
command's words as the first items of an argument list) in the test sources.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from smiexlm.cli.main import app

TESTS = Path(__file__).resolve().parents[1]


def _commands() -> list[tuple[str, ...]]:
    found = [(c.name or c.callback.__name__,) for c in app.registered_commands]
    for group in app.registered_groups:
        found += [(group.name, c.name or c.callback.__name__)
                  for c in group.typer_instance.registered_commands]  # fmt: skip
    return found


@pytest.mark.parametrize("words", _commands(), ids=" ".join)
def test_every_command_answers_help(words):
    result = CliRunner().invoke(app, [*words, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output


def test_every_command_is_run_by_a_test():
    sources = "\n".join(
        p.read_text() for p in TESTS.rglob("test_*.py") if p.name != Path(__file__).name
    )
    untested = []
    for words in _commands():
        quoted = r",\s*".join(f'"{w}"' for w in words)
        # ["embed", ...], cli("pretrain", ...), [smiexlm, "demo", ...]; a group's command
        # also first in a call or list that a helper completes (_run("rank", ...))
        patterns = [rf"[\[\(,]\s*{quoted}\s*[,\)\]]"]
        if len(words) == 2:
            patterns.append(rf'(\w\(|\[)\s*"{words[1]}"\s*,')
        if not any(re.search(p, sources) for p in patterns):
            untested.append(" ".join(words))
    assert not untested, f"commands no test runs: {untested}"
