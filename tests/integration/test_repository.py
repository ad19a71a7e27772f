"""The repository as a newcomer meets it: the README's two commands are the ones CI runs, the
committed campaign reads back, and the tracked tree stays light."""

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

    from smiexlm.finetuning.config import finetune_config

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
    tracked = _tracked()
    artifacts = [p for p in tracked if p.startswith("runs/") or "/state/" in p
                 or p.endswith((".sqlite", "optimizer.safetensors", "rng.safetensors"))
                 or p.endswith("predictions.npz")]  # fmt: skip
    assert artifacts == [], artifacts[:10]


def _tracked() -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.splitlines()  # fmt: skip


def test_the_tracked_tree_stays_light():
    """No tracked file over 1 MB outside the shipped models and the test fixtures, and all of
    ``benchmarks/results/`` within 15 MB: per-molecule scores are kept compactly or
    regenerated, never carried as they were written."""
    sizes = {p: (ROOT / p).stat().st_size for p in _tracked() if (ROOT / p).is_file()}
    heavy = {p: n for p, n in sizes.items() if n > 1_000_000
             and not p.startswith(("smiexlm/assets/", "tests/fixtures/"))}  # fmt: skip
    assert heavy == {}, heavy
    results = sum(n for p, n in sizes.items() if p.startswith("benchmarks/results/"))
    assert results <= 15_000_000, f"benchmarks/results/ holds {results:,} bytes"


def test_every_results_page_is_short_enough_to_read():
    """Each page under ``benchmarks/results/`` stays within 25,000 characters: the current
    table first, the history in ``benchmarks/notes/``, each run's record in its JSON."""
    pages = [p for p in _tracked() if p.startswith("benchmarks/results/") and p.endswith(".md")]
    long = {p: n for p in pages if (n := len((ROOT / p).read_text())) > 25_000}
    assert pages and long == {}, long


def test_the_compact_scores_give_back_each_cells_figure():
    """Each committed cell's compact scores (float16) score within 0.05 of the figure its
    ``result.json`` recorded from the float32 scores: the bootstraps and blends read the
    campaign's own predictions."""
    import json

    import numpy as np

    from smiexlm.moleculenet import score_store
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.moleculenet.metrics import score

    cells = [ROOT / p for p in _tracked() if p.endswith(score_store.STORE_NAME)]
    assert len(cells) >= 100, len(cells)
    tasks, off = {}, {}
    for path in cells:
        record = json.loads((path.parent / "result.json").read_text())["result"]
        name = record["dataset"]
        task = tasks[name] = tasks.get(name) or load_task(name, allow_download=False)
        kept = score_store.read(path.parent)
        got = score(task.task_type, task.labels[kept["test_rows"]], kept["test"]).mean
        got *= 100.0 if task.task_type == "classification" else 1.0
        if not np.isclose(got, record["test"], rtol=1e-3, atol=0.05):
            off[str(path.parent.relative_to(ROOT))] = (got, record["test"])
    assert off == {}, off
