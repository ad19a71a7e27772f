"""Conformal sets and intervals on new scaffolds: each calibration of ``predict
--conformal-method`` on the scaffold test split of every set, from finished runs.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/conformal_shift.py --out benchmarks/results/trust/shift

For each (set, seed) of ``--classification`` (default: the campaign's fine-tuned default,
``table1/default``, blended with its RDKit 2D forest ``table1/rf_rdkit2d`` as ``finetune``
serves it) and ``--regression`` (``regression/default`` with the RDKit 2D forests
``forest_blend.py`` keeps in ``--regression-forests``), the validation split calibrates and
the test split is measured, exactly as ``predict`` does it
(:func:`smiexlm.trust.shift.method_shift`; the nearness of each molecule to the training
molecules, nearest Tanimoto and cosine, as the model cell kept it): marginal coverage, the
coverage of the positives (classification, labels pooled over tasks), the mean set size or
interval width, and the coverage over ``--resplits`` random re-splits of the same validation
and test molecules (where exchangeability holds). ``difficulty`` normalises by the
disagreement of the model and its forest (:func:`smiexlm.trust.conformal.difficulty`).
``--cells SET=ROOT`` reads a set's runs from a root of ``smiexlm benchmark`` runs that keep
their forest beside the model (the seeds it has finished), for a set whose campaign cells
kept no predictions (ToxCast: ``smiexlm benchmark --tasks toxcast --out runs/shift/toxcast``).
Writes ``shift.md`` and ``shift.csv``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from smiexlm.trust.shift import METHODS

CLASSIFICATION = ["bace", "bbbp", "clintox", "sider", "tox21", "toxcast", "muv"]
REGRESSION = ["esol", "freesolv", "lipophilicity"]
RESULTS = Path("benchmarks/results")


def _cells(args, task, seed: int):
    """(valid rows, test rows, served valid, served test, near valid (n, 2), near test, the
    members' difficulty of valid and of test)."""
    from smiexlm.forests.blend import blend_members
    from smiexlm.moleculenet.runs import read_predictions, run_dir
    from smiexlm.trust.conformal import difficulty

    regression = not task.is_classification
    model_root = args.cells.get(task.name, args.regression if regression else args.classification)
    model = read_predictions(run_dir(model_root / "runs", task.name, seed), task)
    near = {p: np.stack([model[f"{p}_tanimoto"], model[f"{p}_cosine"]], 1) for p in ("valid", "test")}  # fmt: skip
    if "valid_forest" in model:  # a run with its forest beside it, as finetune serves it
        members = {p: [model[f"{p}_model"], model[f"{p}_forest"]] for p in ("valid", "test")}
        served = [model["valid"], model["test"]]
    else:
        forest_root = args.regression_forests if regression else args.forest / "runs"
        forest = read_predictions(run_dir(forest_root, task.name, seed), task)
        for part in ("valid_rows", "test_rows"):
            if not np.array_equal(model[part], forest[part]):
                raise SystemExit(f"{task.name} seed {seed}: the model's and the forest's {part} differ")  # fmt: skip
        members = {p: [model[p], forest[p]] for p in ("valid", "test")}
        served = [blend_members(task.task_type, members["valid"], members[p]) for p in ("valid", "test")]  # fmt: skip
    hard = [difficulty(members[p]) for p in ("valid", "test")]
    return model["valid_rows"], model["test_rows"], *served, near["valid"], near["test"], *hard


def _measure(task, cal, test, alpha: float, method: str):
    """(coverage, coverage of positives or NaN, mean size or width) of one calibration on
    ``cal`` and ``test``, each (labels, served scores, nearness, difficulty)."""
    from smiexlm.trust.conformal import ClassificationCalibrator, RegressionCalibrator
    from smiexlm.trust.sets import coverage
    from smiexlm.trust.shift import method_shift

    (y_cal, s_cal, n_cal, d_cal), (y_test, s_test, n_test, d_test) = cal, test
    shift, _ = method_shift(method, n_cal, n_test, alpha)
    if method != "difficulty":
        d_cal = d_test = None
    known = ~np.isnan(y_test)
    if task.is_classification:
        sets = ClassificationCalibrator(y_cal, s_cal, d_cal).sets(s_test, alpha, method == "class",
                                                                  "full", shift, d_test)  # fmt: skip
        hit = np.take_along_axis(sets.members, np.nan_to_num(y_test).astype(int)[..., None], -1)[..., 0]  # fmt: skip
        positives = known & (y_test == 1)
        return float(hit[known].mean()), float(hit[positives].mean()), float(np.mean(sets.size[known]))  # fmt: skip
    bounds = RegressionCalibrator(y_cal, s_cal, d_cal).intervals(s_test, alpha, d_test,
                                                                 too_small="full", shift=shift)  # fmt: skip
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
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--cells", nargs="+", default=[], metavar="SET=ROOT",
                        help="a set's runs from another root, whose runs keep their forest "
                             "beside the model (smiexlm benchmark's)")  # fmt: skip
    parser.add_argument("--resplits", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.cells = dict(_assignment(c) for c in args.cells)

    from smiexlm.moleculenet.loaders import load_task

    rows = []
    for name in args.sets:
        task = load_task(name)
        methods = [m for m in args.methods if task.is_classification or m != "class"]
        for seed in _seeds(args, task):
            v_rows, t_rows, s_valid, s_test, n_valid, n_test, d_valid, d_test = _cells(args, task, seed)  # fmt: skip
            valid = (task.labels[v_rows], s_valid, n_valid, d_valid)
            test = (task.labels[t_rows], s_test, n_test, d_test)
            rng = np.random.default_rng(seed)
            pooled = [np.concatenate(p) for p in zip(valid, test, strict=True)]
            draws = [rng.permutation(len(pooled[0])) for _ in range(args.resplits)]
            for alpha in args.alphas:
                for method in methods:
                    cov, pos, size = _measure(task, valid, test, alpha, method)
                    resplit = []
                    for order in draws:
                        cal, rest = order[: len(v_rows)], order[len(v_rows) :]
                        resplit.append(_measure(task, [p[cal] for p in pooled],
                                                [p[rest] for p in pooled], alpha, method)[0])  # fmt: skip
                    rows.append({"set": task.name, "seed": seed, "alpha": alpha, "method": method,
                                 "coverage": cov, "positives": pos, "size": size,
                                 "resplit": float(np.mean(resplit))})  # fmt: skip
                    print(rows[-1], flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "shift.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = _report(rows, " ".join(sys.argv[1:]))
    (args.out / "shift.md").write_text(text, encoding="utf-8")
    print(text)


def _report(rows: list[dict], argv: str) -> str:
    """shift.md: at each α, the coverage of every method on every set beside ``predict``'s
    default (:func:`~smiexlm.serving.predict_trust.default_method` of a blend) and how
    many sets each keeps in [1 - α - 0.05, 1 - α + 0.05]; then every figure."""
    from smiexlm.serving.predict_trust import default_method

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["set"], r["alpha"], r["method"]), []).append(r)
    mean = {key: {k: float(np.mean([g[k] for g in group])) for k in ("coverage", "positives", "size", "resplit")} | {"seeds": len(group)}
            for key, group in groups.items()}  # fmt: skip
    sets = list(dict.fromkeys(r["set"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines = ["# Conformal coverage on the scaffold test split, by calibration", "",
             f"`python benchmarks/conformal_shift.py {argv}`", ""]  # fmt: skip
    for alpha in dict.fromkeys(r["alpha"] for r in rows):
        low, high = 1 - alpha - 0.05, 1 - alpha + 0.05
        lines += [f"At α = {alpha:g}, coverage (mean set size or interval width); the target is "
                  f"[{low:.2f}, {high:.2f}]; **bold**: `predict`'s default for what `finetune` "
                  "serves (a model with its forest).", "",
                  "| set | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]  # fmt: skip
        inside = dict.fromkeys(methods, 0)
        for name in sets:
            task_type = "regression" if np.isnan(mean[(name, alpha, methods[0])]["positives"]) else "classification"  # fmt: skip
            cells = []
            for method in methods:
                m = mean.get((name, alpha, method))
                if m is None:
                    cells.append("")
                    continue
                inside[method] += low <= m["coverage"] <= high
                cell = f"{m['coverage']:.3f} ({m['size']:.2f})"
                cells.append(f"**{cell}**" if method == default_method(task_type, True) else cell)
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines += ["| sets in range | " + " | ".join(str(inside[m]) for m in methods) + " |", ""]
    lines += ["Every figure, mean over seeds; `positives`: the coverage of the positive labels "
              "(classification); `size`: the mean set size (classification) or interval width "
              "(regression, in the label's units); `resplit`: the coverage over random re-splits "
              "of the same validation and test molecules; `seeds`: how many the mean is over.", "",
              "| set | α | method | coverage | positives | size | resplit | seeds |",
              "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (name, alpha, method), m in mean.items():
        pos = "–" if np.isnan(m["positives"]) else f"{m['positives']:.3f}"
        lines.append(f"| {name} | {alpha:g} | {method} | {m['coverage']:.3f} | {pos} | "
                     f"{m['size']:.2f} | {m['resplit']:.3f} | {m['seeds']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def _assignment(text: str) -> tuple[str, Path]:
    name, sep, root = text.partition("=")
    if not sep or not name or not root:
        raise SystemExit(f"--cells {text!r}: expected SET=ROOT")
    return name, Path(root)


def _seeds(args, task) -> list[int]:
    """``--seeds``; of a set read from ``--cells``, those its root has finished."""
    from smiexlm.moleculenet.runs import has_predictions, run_dir

    if task.name not in args.cells:
        return args.seeds
    return [s for s in args.seeds if has_predictions(run_dir(args.cells[task.name] / "runs", task.name, s))]  # fmt: skip


if __name__ == "__main__":
    main()
