"""The warm launcher the suite runs ``smiexlm`` through gives what a fresh interpreter gives:
the same exit codes, standard output and error, files, and timeouts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.warm_cli import _Launcher, _startup, console_script, run_python, run_smiexlm


def _cold(*args: object, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([console_script(), *map(str, args)], capture_output=True, text=True,
                          timeout=300, **kwargs)  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ("tokenize", "CC(=O)Nc1ccc(O)cc1", "Cl[Na]"),  # success, with output
        ("embed", "no/such/file.csv", "--out", "x.npy"),  # a bad input: exit 2, one error line
        ("embed", "--no-such-option"),  # a usage error from the parser
        ("tokenize", ""),  # an empty SMILES
    ],
)
def test_warm_gives_what_a_fresh_interpreter_gives(args, tmp_path):
    warm = run_smiexlm(*args, cwd=tmp_path)
    cold = _cold(*args, cwd=tmp_path)
    assert (warm.returncode, warm.stdout, warm.stderr) == (
        cold.returncode,
        cold.stdout,
        cold.stderr,
    )


def test_the_command_runs_in_its_own_folder_and_environment(tmp_path):
    (tmp_path / "in.smi").write_text("CCO\nc1ccccc1\n")
    warm = run_smiexlm("tokenize", "--file", "in.smi", cwd=tmp_path)  # a relative path
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout == _cold("tokenize", "--file", "in.smi", cwd=tmp_path).stdout
    # the help is laid out to the COLUMNS the command is given, not the launcher's
    narrow, wide = ({**os.environ, "COLUMNS": n} for n in ("50", "120"))
    helps = [run_smiexlm("tokenize", "--help", env=e).stdout for e in (narrow, wide)]
    assert helps == [_cold("tokenize", "--help", env=e).stdout for e in (narrow, wide)]
    assert helps[0] != helps[1]
    assert _Launcher._pool[_startup(dict(os.environ))]  # they went through a launcher


def test_a_timeout_kills_the_command_and_the_launcher_goes_on(tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        run_smiexlm("tokenize", "CCO", timeout=0.001)
    after = run_smiexlm("tokenize", "CCO")
    assert after.returncode == 0 and after.stdout == _cold("tokenize", "CCO").stdout


PROBE = """
import os, sys
print(sys.stdout.encoding, sys.flags.dont_write_bytecode, os.getcwd(), os.environ.get("SEEN"),
      sys.argv[1:], sys.path[0] == os.path.dirname(os.path.abspath(__file__)), __name__)
"""


def test_a_script_sees_the_interpreter_start_up_its_environment_asks_for(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    # PYTHONDONTWRITEBYTECODE and PYTHONIOENCODING are read when an interpreter starts: a
    # launcher started without them cannot run this command, one started with them can
    for extra in ({}, {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "latin-1"}):
        env = os.environ | {"SEEN": "yes"} | extra
        warm = run_python(script, "a", "b c", env=env, cwd=tmp_path)
        cold = subprocess.run([sys.executable, str(script), "a", "b c"], capture_output=True,
                              text=True, env=env, cwd=tmp_path)  # fmt: skip
        assert warm.returncode == cold.returncode == 0, warm.stderr
        assert warm.stdout == cold.stdout
        assert "yes ['a', 'b c'] True __main__" in warm.stdout
        assert _Launcher._pool[_startup(env)]
    assert _startup(env) != _startup(dict(os.environ))
