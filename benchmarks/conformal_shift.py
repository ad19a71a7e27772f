"""Conformal sets and intervals on new scaffolds: each calibration of ``predict
--conformal-method`` on the scaffold test split of every set, from finished runs.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/conformal_shift.py --out benchmarks/results/trust/shift

For each (set, seed) of ``--classification`` (default: the campaign's fine-tuned default,
``table1/default``, blended with its RDKit 2D forest ``table1/rf_rdkit2d`` as ``finetune``
serves it) and ``--regression`` (``regression/default`` with the RDKit 2D forests
``forest_blend.py`` keeps in ``--regression-forests``), the validation split calibrates and
the test split is measured, exactly as ``predict`` does it
(:func:`smiexlm.trust.conformal.method_shift`; the nearness of each molecule to the training
molecules, nearest Tanimoto and cosine, as the model cell kept it): marginal coverage, the
coverage of the positives (classification, labels pooled over tasks), the mean set size or
interval width, and the coverage over ``--resplits`` random re-splits of the same validation
and test molecules (where exchangeability holds). Writes ``shift.md`` and ``shift.csv``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

CLASSIFICATION = ["bace", "bbbp", "clintox", "sider", "tox21", "toxcast", "muv"]
REGRESSION = ["esol", "freesolv", "lipophilicity"]
RESULTS = Path("benchmarks/results")


def _cells(args, task, seed: int):
    """(valid rows, test rows, served valid, served test, near valid (n, 2), near test)."""
    from smiexlm.moleculenet.blend import blend_members
    from smiexlm.moleculenet.runs import read_predictions, run_dir

    regression = not task.is_classification
    model_root = args.regression if regression else args.classification
    folder = run_dir(model_root / "runs", task.name, seed)
    model = read_predictions(folder, task)
    near = {p: np.stack([model[f"{p}_tanimoto"], model[f"{p}_cosine"]], 1) for p in ("valid", "test")}  # fmt: skip
    if regression:
        forest = read_predictions(run_dir(args.regression_forests, task.name, seed), task)
    else:
        forest = read_predictions(run_dir(args.forest / "runs", task.name, seed), task)
    for part in ("valid_rows", "test_rows"):
        if not np.array_equal(model[part], forest[part]):
            raise SystemExit(f"{task.name} seed {seed}: the model's and the forest's {part} differ")
    valids = [model["valid"], forest["valid"]]
    served = [blend_members(task.task_type, valids, [m[p] for m in (model, forest)])
              for p in ("valid", "test")]  # fmt: skip
    return model["valid_rows"], model["test_rows"], *served, near["valid"], near["test"]


def _measure(task, y_cal, s_cal, n_cal, y_test, s_test, n_test, alpha: float, method: str):
    """(coverage, coverage of positives or NaN, mean size or width) of one calibration."""
    from smiexlm.trust.conformal import (
        ClassificationCalibrator,
        RegressionCalibrator,
        coverage,
        method_shift,
    )

    shift, _ = method_shift(method, n_cal, n_test, alpha)
    if task.is_classification:
        sets = ClassificationCalibrator(y_cal, s_cal).sets(s_test, alpha, method == "class",
                                                           "full", shift)  # fmt: skip
        known = ~np.isnan(y_test)
        hit = np.take_along_axis(sets.members, np.nan_to_num(y_test).astype(int)[..., None], -1)[..., 0]  # fmt: skip
        positives = known & (y_test == 1)
        size = sets.size[known]
        return float(hit[known].mean()), float(hit[positives].mean()), float(np.mean(size))
    bounds = RegressionCalibrator(y_cal, s_cal).intervals(s_test, alpha, too_small="full",
                                                          shift=shift)  # fmt: skip
    known = ~np.isnan(y_test)
    return coverage(y_test, bounds).pooled, float("nan"), float(np.mean(bounds.width[known]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classification", type=Path, default=RESULTS / "table1" / "default")
    parser.add_argument("--forest", type=Path, default=RESULTS / "table1" / "rf_rdkit2d")
    parser.add_argument("--regression", type=Path, default=RESULTS / "regression" / "default")
    parser.add_argument("--regression-forests", type=Path,
                        default=Path("runs/forests/rdkit2d_500trees"))  # fmt: skip
    parser.add_argument("--sets", nargs="+", default=CLASSIFICATION + REGRESSION)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--alphas", nargs="+", type=float, default=[0.1, 0.2])
    parser.add_argument("--methods", nargs="+", default=["split", "class", "distance", "weighted"])
    parser.add_argument("--resplits", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from smiexlm.moleculenet.loaders import load_task

    rows = []
    for name in args.sets:
        task = load_task(name)
        methods = [m for m in args.methods if task.is_classification or m != "class"]
        for seed in args.seeds:
            v_rows, t_rows, s_valid, s_test, n_valid, n_test = _cells(args, task, seed)
            y_valid, y_test = task.labels[v_rows], task.labels[t_rows]
            rng = np.random.default_rng(seed)
            y_all, s_all, n_all = (np.concatenate(p) for p in ((y_valid, y_test), (s_valid, s_test), (n_valid, n_test)))  # fmt: skip
            draws = [rng.permutation(len(y_all)) for _ in range(args.resplits)]
            for alpha in args.alphas:
                for method in methods:
                    cov, pos, size = _measure(task, y_valid, s_valid, n_valid, y_test, s_test,
                                              n_test, alpha, method)  # fmt: skip
                    resplit = []
                    for order in draws:
                        cal, test = order[: len(y_valid)], order[len(y_valid) :]
                        resplit.append(_measure(task, y_all[cal], s_all[cal], n_all[cal],
                                                y_all[test], s_all[test], n_all[test], alpha,
                                                method)[0])  # fmt: skip
                    rows.append({"set": task.name, "seed": seed, "alpha": alpha, "method": method,
                                 "coverage": cov, "positives": pos, "size": size,
                                 "resplit": float(np.mean(resplit))})  # fmt: skip
                    print(rows[-1], flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "shift.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = ["# Conformal coverage on the scaffold test split, by calibration", "",
             f"`python benchmarks/conformal_shift.py {' '.join(sys.argv[1:])}`", "",
             "Mean over seeds; `positives`: the coverage of the positive labels (classification); "
             "`size`: the mean set size (classification) or interval width (regression, in the "
             "label's units); `resplit`: the coverage over random re-splits of the same "
             "validation and test molecules.", "",
             "| set | α | method | coverage | positives | size | resplit |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["set"], r["alpha"], r["method"]), []).append(r)
    for (name, alpha, method), group in groups.items():
        mean = {
            k: np.mean([g[k] for g in group]) for k in ("coverage", "positives", "size", "resplit")
        }
        pos = "–" if np.isnan(mean["positives"]) else f"{mean['positives']:.3f}"
        lines.append(f"| {name} | {alpha:g} | {method} | {mean['coverage']:.3f} | {pos} | "
                     f"{mean['size']:.2f} | {mean['resplit']:.3f} |")  # fmt: skip
    (args.out / "shift.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
