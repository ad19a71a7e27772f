"""What averaging the fine-tuned seeds buys: the seeds' predictions as one ensemble, from
finished runs, alone and blended with a forest.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/seed_ensemble.py benchmarks/results/table1/default \
        --tasks bace bbbp clintox sider --forest rdkit2d --forest-root runs/forests \
        --out runs/screens/seed_ensemble

MODEL_ROOT holds runs as ``moleculenet_table.py run`` leaves them (``runs/<set>/seed<k>/``
with ``predictions.npz``). For each set, test ROC-AUC x 100 of:

- ``seeds``: each seed's model alone, mean ± sample std (the protocol's reading);
- ``ensemble``: the mean of the seeds' probabilities, one model and so one figure;
- ``seeds + forest``: each seed blended with its forest (``--forest``, 500 trees, the same
  split and seed; trained into ``--forest-root`` when missing), quantile blend at 0.5;
- ``ensemble + forest``: the ensemble blended with each seed's forest, mean ± std over them.

An ensemble of n seeds costs n fine-tunings and n forward passes a molecule, and it has no
spread over seeds of its own unless n x 3 runs are made; the table says how many seeds it
averages. Writes ``ensemble.md`` and ``ensemble.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forest_blend import _mean_std, forest_predictions, write_table  # noqa: E402

COLUMNS = ("seeds", "ensemble", "seeds + forest", "ensemble + forest")


def scores(task, runs: list[dict], forests: list[dict]) -> dict[str, list[float]]:
    """Each column's test scores (one per seed, or one for the ensemble alone)."""
    from smiexlm.forests.blend import blend
    from smiexlm.moleculenet.metrics import score

    y_test = task.labels[runs[0]["test_rows"]]

    def test_score(pred: np.ndarray) -> float:
        return score(task.task_type, y_test, pred).mean

    def with_forest(valid, test, forest) -> float:
        return test_score(blend(task.task_type, valid, test, forest["valid"], forest["test"]))

    valid = np.mean([r["valid"] for r in runs], axis=0)
    test = np.mean([r["test"] for r in runs], axis=0)
    return {
        "seeds": [test_score(r["test"]) for r in runs],
        "ensemble": [test_score(test)],
        "seeds + forest": [with_forest(r["valid"], r["test"], f) for r, f in zip(runs, forests, strict=True)],
        "ensemble + forest": [with_forest(valid, test, f) for f in forests],
    }  # fmt: skip


def _figure(values: list[float]) -> str:
    """One figure as it is; several as mean ± sample std (x 100)."""
    return f"{100 * values[0]:.1f}" if len(values) == 1 else _mean_std(values, 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_root", type=Path, metavar="MODEL_ROOT")
    parser.add_argument("--tasks", nargs="+", required=True)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--forest", choices=["ecfp4", "rdkit2d", "both"], default="rdkit2d")
    parser.add_argument("--forest-root", type=Path, required=True)
    parser.add_argument("--n-trees", type=int, default=500)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from smiexlm.errors import DataError
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.moleculenet.runs import read_predictions, run_dir

    table, cells = {}, {}
    for name in args.tasks:
        task = load_task(name)
        runs = [
            read_predictions(run_dir(args.model_root / "runs", name, s), task) for s in args.seeds
        ]
        forests = [forest_predictions(task, s, args.forest, args.forest_root, args.n_trees)
                   for s in args.seeds]  # fmt: skip
        for part in ("valid_rows", "test_rows"):
            if any(not np.array_equal(runs[0][part], other[part]) for other in runs + forests):
                raise DataError(f"{name}: the seeds' or forests' {part} differ")
        cells[name] = scores(task, runs, forests)
        table[name] = [_figure(cells[name][col]) for col in COLUMNS]
        print(name, json.dumps(cells[name]), flush=True)

    lines = ["# The fine-tuned seeds as one ensemble, alone and beside a forest", "",
             f"`python {' '.join(sys.argv)}`", "",
             f"Test ROC-AUC x 100; {len(args.seeds)} seeds ({', '.join(map(str, args.seeds))}) "
             f"averaged into the ensemble; forest: RF on {args.forest}, {args.n_trees} trees, "
             "quantile blend at 0.5.", "",
             "| set | " + " | ".join(COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]  # fmt: skip
    lines += [f"| {name} | " + " | ".join(row) + " |" for name, row in table.items()]
    means = [100 * np.mean([np.mean(cells[n][col]) for n in cells]) for col in COLUMNS]
    lines.append(f"| mean of {len(cells)} | " + " | ".join(f"{m:.1f}" for m in means) + " |")
    write_table(args.out, "ensemble", lines, cells)


if __name__ == "__main__":
    main()
