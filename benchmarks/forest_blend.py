"""What a random forest beside a fine-tuned model buys: the two blended, from finished runs.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/forest_blend.py benchmarks/results/table1/default \
        --forests rdkit2d both --forest-root runs/forests --out runs/blend

Each MODEL_ROOT holds runs as ``moleculenet_table.py run`` (or ``smiexlm benchmark``) leaves
them: ``ROOT/runs/<set>/seed<k>/`` with ``result.json`` and ``predictions.npz``. For each of
its (set, seed), the forest of each ``--forests`` kind (``--n-trees`` 500, balanced class
weights, the same split and seed: the campaign's forest rows) is trained unless its
predictions are in ``--forest-root/<kind>_<n>trees/<set>/seed<k>/`` already, and kept there. Test scores of:

- ``model`` and ``forest`` alone;
- ``mean``: the two predictions averaged (probabilities, or values for regression);
- ``quantile`` (classification): each score replaced by its quantile among the same model's
  validation scores, then averaged (:mod:`smiexlm.forests.blend`); a per-molecule
  transform, so a served model can apply it;
- ``chosen``: ``quantile`` (``mean`` for regression) with the model's weight picked from
  0, 0.1, ..., 1 on the validation split.

``--partner ROW_ROOT`` blends with another finished row's kept predictions of the same (set,
seed) instead of forests (the default's linear probe, say: ``benchmarks/results/table1/
default_probe``); its folder name stands where a forest's kind would, and the ``forest``
column holds its scores. ``--third ROW_ROOT`` adds a column ``thirds`` (classification): the
model, the forest (or partner) and that row's kept predictions of the same (set, seed), each
replaced by its quantiles among its own validation scores, averaged in equal thirds.

Only the validation split makes a choice; test is read once per blend. Writes ``blend.md``
and ``blend.json`` into ``--out`` and prints the table (ROC-AUC x 100 or RMSE, mean ± sample
std over seeds). ``--keep DIR`` keeps the validation and test predictions of the blend
``finetune --forest`` serves (``quantile`` at weight 0.5) in ``DIR/<root>+<beside>/`` and of
``chosen`` in ``DIR/<root>+<beside>+chosen/`` (``<set>/seed<k>/predictions.npz`` each): rows
``moleculenet_table.py compare`` reads, to say how sure a blend's gain over the forest alone
is.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

WEIGHTS = np.round(np.linspace(0.0, 1.0, 11), 1)


def forest_predictions(
    task, seed: int, kind: str, root: Path, n_trees: int
) -> dict[str, np.ndarray]:
    """The forest's kept predictions for (``task``, ``seed``), trained first when missing."""
    from smiexlm.forests.baseline import BaselineConfig, run_baseline
    from smiexlm.moleculenet.runs import has_predictions, read_predictions, run_dir

    kept = root / f"{kind}_{n_trees}trees"
    folder = run_dir(kept, task.name, seed)
    if not has_predictions(folder):
        cfg = BaselineConfig(features=kind, n_trees=n_trees)
        run_baseline(task, seeds=[seed], cfg=cfg, run_root=kept, resume=True)
    return read_predictions(folder, task)


def blends(task, model: dict, forest: dict, chosen: tuple, third: dict | None = None) -> dict[str, float]:  # fmt: skip
    """Test scores of the model, the forest and their blends (see the module docstring);
    ``chosen``: :func:`chosen_blend` of the two."""
    from smiexlm.forests.blend import blend, quantiles
    from smiexlm.moleculenet.metrics import score

    y_test = task.labels[model["test_rows"]]

    def test_score(pred: np.ndarray) -> float:
        return score(task.task_type, y_test, pred).mean

    parts = (model["valid"], model["test"], forest["valid"], forest["test"])
    out = {"model": test_score(model["test"]), "forest": test_score(forest["test"]),
           "mean": test_score(blend(task.task_type, *parts, how="mean"))}  # fmt: skip
    if task.is_classification:
        out["quantile"] = test_score(blend(task.task_type, *parts, how="quantile"))
        if third is not None:
            thirds = [quantiles(p["valid"], p["test"]) for p in (model, forest, third)]
            out["thirds"] = test_score(sum(thirds) / 3.0)
    weight, _, chosen_test = chosen
    out["chosen"], out["chosen_weight"] = test_score(chosen_test), weight
    return out


def chosen_blend(task, model: dict, forest: dict) -> tuple[float, np.ndarray, np.ndarray]:
    """The quantile blend whose model weight (of :data:`WEIGHTS`) scores best on validation:
    (that weight, its validation predictions, its test predictions)."""
    from smiexlm.forests.blend import blend
    from smiexlm.moleculenet.metrics import score

    y_valid = task.labels[model["valid_rows"]]

    def on_valid(w: float) -> np.ndarray:
        return blend(task.task_type, model["valid"], model["valid"], forest["valid"],
                     forest["valid"], w, "quantile")  # fmt: skip

    valid = [score(task.task_type, y_valid, on_valid(w)).mean for w in WEIGHTS]
    w = float(WEIGHTS[int(np.nanargmax(valid) if task.is_classification else np.nanargmin(valid))])
    parts = (model["valid"], model["test"], forest["valid"], forest["test"])
    return w, on_valid(w), blend(task.task_type, *parts, w, "quantile")


def keep_blends(row: Path, task, seed: int, model: dict, forest: dict, chosen: tuple) -> None:
    """Keep the validation and test predictions of the blend ``finetune --forest`` serves
    (``quantile``, the model's weight 0.5; ``mean`` for regression) in the row ``row`` and of
    the ``chosen`` one (:func:`chosen_blend`) in ``row`` + ``+chosen``, each as
    ``<set>/seed<k>/predictions.npz``."""
    from smiexlm.forests.blend import blend
    from smiexlm.moleculenet.runs import keep_predictions
    from smiexlm.moleculenet.splits import Split

    how = "quantile" if task.is_classification else "mean"
    served = tuple(blend(task.task_type, model["valid"], model[part], forest["valid"],
                         forest[part], 0.5, how) for part in ("valid", "test"))  # fmt: skip
    split = Split("kept", None, [], model["valid_rows"].tolist(), model["test_rows"].tolist())
    pairs = ((row, served), (row.with_name(row.name + "+chosen"), chosen[1:]))
    for folder, (valid, test) in pairs:
        keep_predictions(folder, task.name, seed, split, valid, test)


def _mean_std(values: list[float], scale: float) -> str:
    values = [v * scale for v in values if not math.isnan(v)]
    if not values:
        return "–"
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return (
        f"{np.mean(values):.1f} ± {std:.1f}"
        if scale == 100
        else f"{np.mean(values):.3f} ± {std:.3f}"
    )


def write_table(out: Path, stem: str, lines: list[str], cells) -> None:
    """``out/<stem>.md`` (``lines``) and ``out/<stem>.json`` (``cells``); the table printed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / f"{stem}.json").write_text(json.dumps(cells, indent=1) + "\n", encoding="utf-8")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_roots", type=Path, nargs="+", metavar="MODEL_ROOT")
    parser.add_argument("--forests", nargs="+", default=["rdkit2d", "both"],
                        choices=["ecfp4", "rdkit2d", "both"])  # fmt: skip
    parser.add_argument("--forest-root", type=Path, default=None,
                        help="where forests are kept (needed unless --partner)")  # fmt: skip
    parser.add_argument("--partner", type=Path, default=None, metavar="ROW_ROOT",
                        help="blend with this row's runs of the same (set, seed) instead")  # fmt: skip
    parser.add_argument("--third", type=Path, default=None, metavar="ROW_ROOT",
                        help="also blend in this row's runs of the same (set, seed), in thirds")  # fmt: skip
    parser.add_argument("--n-trees", type=int, default=500, help="trees of a forest trained here")
    parser.add_argument("--tasks", nargs="+", default=None, help="sets to read (default: all)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="keep the served and the chosen blends' predictions in "
                        "DIR/<root>+<beside>[+chosen]/<set>/seed<k>/ (rows for compare)")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.partner is None and args.forest_root is None:
        parser.error("--forest-root is needed unless --partner is given")

    from smiexlm.errors import DataError
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.moleculenet.runs import finished, has_predictions, read_predictions, run_dir

    def row_predictions(option: str, row: Path, task, seed: int) -> dict:
        folder = run_dir(row / "runs", task.name, seed)
        if finished(folder) is None:
            raise DataError(f"{option} {str(row)!r}: no finished run {str(folder)!r}")
        return read_predictions(folder, task)

    def partners(task, seed: int):
        """(name, kept predictions) of what each model cell is blended with."""
        if args.partner is not None:
            yield args.partner.name, row_predictions("--partner", args.partner, task, seed)
            return
        for kind in args.forests:
            yield kind, forest_predictions(task, seed, kind, args.forest_root, args.n_trees)

    cells, tasks = [], {}
    for root in args.model_roots:
        folders = [f for f in sorted((root / "runs").glob("*/seed*/")) if has_predictions(f)]
        if not folders:
            raise DataError(f"MODEL_ROOT {str(root)!r}: no runs/<set>/seed<k>/ kept its scores")
        for folder in folders:
            result = finished(folder)
            if result is None or (args.tasks and result.dataset not in args.tasks):
                continue
            task = tasks.setdefault(result.dataset, load_task(result.dataset))
            model = read_predictions(folder, task)
            third = (None if args.third is None
                     else row_predictions("--third", args.third, task, result.seed))  # fmt: skip
            for kind, forest in partners(task, result.seed):
                for other in [forest] + ([] if third is None else [third]):
                    for part in ("valid_rows", "test_rows"):
                        if not np.array_equal(model[part], other[part]):
                            raise DataError(f"{str(folder)!r}: the partner's {part} differ from the model's")  # fmt: skip
                chosen = chosen_blend(task, model, forest)  # scored, and kept with --keep
                cells.append({"root": root.name, "name": result.model, "dataset": result.dataset,
                              "seed": result.seed, "features": kind,
                              **blends(task, model, forest, chosen, third)})  # fmt: skip
                if args.keep is not None:
                    keep_blends(args.keep / f"{root.name}+{kind}", task, result.seed, model,
                                forest, chosen)  # fmt: skip
                print(json.dumps(cells[-1]), flush=True)

    columns = ["model", "forest", "mean", "quantile", "chosen"] + (["thirds"] if args.third else [])
    beside = args.partner.name if args.partner else "a forest"
    lines = [f"# {beside} beside the fine-tuned model: blends on test", "",
             f"`python {' '.join(sys.argv)}`", "",
             "Test ROC-AUC x 100 (RMSE for regression), mean ± sample std over seeds; `chosen` "
             "is the model's weight picked on validation (the weights chosen are listed).", "",
             "| root | set | beside | seeds | " + " | ".join(columns) + " | weights chosen |",
             "|" + "---|" * (len(columns) + 5)]  # fmt: skip
    groups: dict[tuple, list[dict]] = {}
    for cell in cells:
        groups.setdefault((cell["root"], cell["features"], cell["dataset"]), []).append(cell)
    summary: dict[tuple, dict[str, list[float]]] = {}
    for (root, kind, dataset), group in groups.items():
        scale = 100 if tasks[dataset].is_classification else 1
        row = [_mean_std([c.get(col, math.nan) for c in group], scale) for col in columns]
        weights = ", ".join(f"{c['chosen_weight']:.1f}" for c in group)
        lines.append(f"| {root} | {dataset} | {kind} | {len(group)} | " + " | ".join(row) + f" | {weights} |")  # fmt: skip
        if scale == 100:
            means = summary.setdefault((root, kind), {})
            for col in columns:
                means.setdefault(col, []).append(100 * np.mean([c[col] for c in group]))
    for (root, kind), means in summary.items():
        row = [f"{np.mean(v):.1f}" for v in means.values()]
        lines.append(f"| {root} | mean of {len(means['model'])} classification sets | {kind} | | " + " | ".join(row) + " | |")  # fmt: skip
    write_table(args.out, "blend", lines, cells)


if __name__ == "__main__":
    main()
