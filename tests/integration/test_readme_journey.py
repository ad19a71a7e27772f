"""The README's first model journey, run as written: a table of one's own, fine-tuned,
predicted with the columns of trust, and the next molecules picked."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd

from tests.integration.test_faults import run_cli

README = Path(__file__).resolve().parents[2] / "README.md"
HEADING = "## Your own data: from a table to the next molecules to test"


def journey_commands() -> list[list[str]]:
    """The command lines of the section's bash block, comments left out."""
    text = README.read_text(encoding="utf-8")
    section = text.split(HEADING, 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    return [shlex.split(line) for line in block.splitlines() if line and not line.startswith("#")]


def test_the_readme_journey_runs_as_written(shared_data, tmp_path):
    bbbp = pd.read_csv(shared_data / "moleculenet" / "bbbp.csv")
    bbbp = bbbp[~bbbp["smiles"].str.contains(r"\.", regex=True)]
    # the 260 shortest (both classes among them): the same journey at a fraction of the cost
    bbbp = bbbp.iloc[bbbp["smiles"].str.len().argsort(kind="stable")[:260]]
    table = bbbp.sample(frac=1.0, random_state=0).reset_index(drop=True)
    table = table.rename(columns={"p_np": "active"})[["name", "smiles", "active"]]
    table.iloc[:200].to_csv(tmp_path / "my.csv", index=False)  # 200 molecules
    table.iloc[200:260].drop(columns="active").to_csv(tmp_path / "candidates.csv", index=False)
    commands = journey_commands()
    assert [c[:2] for c in commands] == [["smiexlm", "finetune"], ["smiexlm", "predict"],
                                         ["smiexlm", "select"]]  # fmt: skip
    for command in commands:
        res = run_cli(*command[1:], cwd=tmp_path, timeout=900)
        assert res.returncode == 0, (command, res.stderr[-2000:])
    preds = pd.read_csv(tmp_path / "preds.csv", keep_default_na=False)
    for column in ("name", "smiles", "active", "active_std", "active_model", "active_forest",
                   "nearest_tanimoto", "in_domain", "active_set"):  # fmt: skip
        assert column in preds.columns, column
    assert len(preds) == 60 and preds["valid"].all()
    assert set(preds["active_set"]) <= {"{0}", "{1}", "{0,1}", "{}"}
    picks = pd.read_csv(tmp_path / "picks.csv")
    assert len(picks) == 10 and picks["pick"].tolist() == list(range(1, 11))
    assert set(picks["name"]) <= set(preds["name"])
