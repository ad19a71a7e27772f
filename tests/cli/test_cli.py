"""The real ``smiexlm`` entry point: help, start-up imports, tokenizer commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import smiexlm_command

HEAVY = ["torch", "rdkit", "deepchem", "triton", "pandas", "matplotlib", "sklearn"]


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        [smiexlm_command(), *args], capture_output=True, text=True, check=check, timeout=300
    )


def test_help_lists_commands():
    out = run_cli("--help").stdout
    for command in ("tokenize", "vocab"):
        assert command in out


def test_command_lists_show_each_summary_as_one_flowing_line():
    """Typer keeps a docstring's line breaks in the command lists; every summary (the
    groups' commands too) is its first paragraph joined into one line, so on a wide terminal
    each command is one row, with no row carrying on the one above."""
    env = {**os.environ, "COLUMNS": "400", "TERM": "dumb"}
    for words in ([], ["analyze"], ["vocab"], ["text"]):
        out = subprocess.run([smiexlm_command(), *words, "--help"], capture_output=True,
                             text=True, env=env, check=True).stdout  # fmt: skip
        panel = out[out.index("─ Commands ─") :].splitlines()[1:]
        rows = panel[: next(i for i, row in enumerate(panel) if row.startswith("╰"))]
        assert rows and all(not row[2:3].isspace() for row in rows), out


def _help(command: str) -> str:
    env = {**os.environ, "COLUMNS": "200", "TERM": "dumb"}
    result = subprocess.run(
        [smiexlm_command(), command, "--help"], capture_output=True, text=True, env=env, check=True
    )
    return result.stdout


def test_help_texts_name_the_options_each_command_has():
    assert "--no-no-canonicalize" not in _help("embed")
    predict = _help("predict")
    assert "--data" not in predict and "--out" in predict and "--output" not in predict
    assert "--out" in _help("plot-run") and "--output" not in _help("plot-run")
    assert "--strip-stereo" in _help("preprocess")
    assert _help("pretrain").count("Required (unless --list-configs)") == 3


def test_startup_imports_no_heavy_module():
    code = (
        "import sys; sys.argv=['smiexlm','--help']\n"
        "import smiexlm.cli.main as m\n"
        f"print([name for name in {HEAVY!r} if name in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tokenize_command_tokens_and_ids(tmp_path):
    assert run_cli("tokenize", "c1ccccc1Br").stdout.split() == [
        "c",
        "1",
        "c",
        "c",
        "c",
        "c",
        "c",
        "1",
        "Br",
    ]
    ids = run_cli("tokenize", "--ids", "CCO").stdout.split()
    assert ids[0] == "1" and ids[-1] == "2" and len(ids) == 5
    smi = tmp_path / "in.smi"
    smi.write_text("CCO name1\n\nc1ccccc1 name2\n")
    # one output line per input line: the blank line stays blank
    assert run_cli("tokenize", "--file", str(smi)).stdout.splitlines() == [
        "C C O", "", "c 1 c c c c c 1"
    ]  # fmt: skip
    bad = run_cli("tokenize", "C C", check=False)
    assert bad.returncode == 2 and "at character 1" in bad.stderr


def test_vocab_build_command(tmp_path):
    csv = tmp_path / "mols.csv"
    csv.write_text("id,smiles\n1,CCO\n2,c1ccccc1Cl\n3,C C\n")
    out = tmp_path / "vocab.json"
    result = run_cli("vocab", "build", str(csv), "--out", str(out))
    assert "1 not tokenizable" in result.stdout and "coverage" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["tokens"][:5] == ["[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]"]
    assert set(doc["tokens"][5:]) == {"C", "O", "c", "1", "Cl"}
    missing = run_cli(
        "vocab", "build", str(csv), "--out", str(out), "--smiles-col", "S", check=False
    )
    assert missing.returncode != 0 and "no SMILES column 'S'" in (missing.stderr + missing.stdout)


def test_list_options_accept_spaces_commas_and_repeats():
    from smiexlm.cli.options import spread

    names = ("--k", "--p")
    assert spread(["--k", "1", "2", "--p", "0.1,0.2", "--out", "x"], names) == [
        "--k", "1", "--k", "2", "--p", "0.1", "--p", "0.2", "--out", "x"
    ]  # fmt: skip
    assert spread(["--k", "1", "--k", "4"], names) == ["--k", "1", "--k", "4"]
