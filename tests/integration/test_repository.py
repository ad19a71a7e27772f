"""The README's two commands are the ones CI runs."""

from __future__ import annotations

import re
import subprocess
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


def _benchmark_table():
    """``benchmarks/moleculenet_table.py`` as a module."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import moleculenet_table

    return moleculenet_table


def test_the_campaign_keeps_every_committed_cell(capsys):
    """Each finished fine-tuning cell of the committed table is what its row makes now, so a
    config change that would stop the campaign (as MUV's and ToxCast's class weights did) is
    caught here, with the cells moved or rerun, not at the campaign's next sitting."""
    import argparse

    table = _benchmark_table()
    root = ROOT / "benchmarks" / "results" / "table1"
    table.status(argparse.Namespace(root=root, rows=None, tasks=None, seeds=[0, 1, 2]))
    counts = capsys.readouterr().out.splitlines()[-1]
    assert " 0 finished with other settings," in counts, counts
    assert int(counts.split()[0]) >= 130, counts  # the cells are there to be checked


def test_the_benchmark_scales_each_sets_own_learning_rate():
    """``moleculenet_table.py run --lr-scale F`` gives each set its Table 8 rate times F."""
    import argparse

    from smiexlm.moleculenet.configs import finetune_config

    table = _benchmark_table()
    asked = argparse.Namespace(root=Path("."), seeds=[0], progress=False, n_trees=None,
                               precision="auto")  # fmt: skip
    for task in ("bace", "sider"):
        args = table._row_args("default", [task], asked)
        assert table._run_config(args, task).loop.lr == finetune_config(task).loop.lr
        args.lr_scale = 0.5
        assert table._run_config(args, task).loop.lr == 0.5 * finetune_config(task).loop.lr


def test_no_run_artifact_is_tracked():
    """What a run leaves to go on from (a run folder, a cell's state, optimizer state, a study
    database) is regenerable and stays out of git; results keep their readable records."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.splitlines()  # fmt: skip
    artifacts = [p for p in tracked if p.startswith("runs/") or "/state/" in p
                 or p.endswith((".sqlite", "optimizer.safetensors", "rng.safetensors"))]  # fmt: skip
    assert artifacts == [], artifacts[:10]
