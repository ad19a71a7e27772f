"""The README's two commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [line for block in blocks[:2] for line in block.splitlines() if line and line[0] != "#"]


def test_readme_has_a_main_job_and_a_test_command():
    main_job, tests = _readme_commands()
    assert main_job == "pip install -e . && smiexlm demo"
    assert tests.startswith('pip install -e ".[dev]" && ') and "pytest" in tests


def test_ci_runs_the_readme_set_up_and_test_commands():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    setup, test = _readme_commands()[1].split(" && ")
    assert setup in ci and test in ci
    assert "python -m pip install -q torch==2.13.0" in ci
