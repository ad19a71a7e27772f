"""Conformal coverage and calibration of fine-tuned MoleculeNet runs, from their run folders.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/conformal_coverage.py runs/screens/augment10_tta10 \
        --out runs/conformal

Each ROOT holds runs as ``moleculenet_table.py run`` (or ``smiexlm benchmark``) leaves them:
``ROOT/runs/<set>/seed<k>/`` with ``predictions.npz`` (validation and test scores and their
rows in the set's table) and ``result.json``. The labels come from the set's table, checked
against the run's data checksum. For every (set, seed), the validation split calibrates and
the test split is measured:

- classification: per task, prediction sets at each ``--alphas`` (marginal and
  class-conditional): test coverage (pooled, and within each class), mean set size, the
  share of singletons and of empty sets; the binary ECE on test (10 equal bins) before and
  after temperature scaling fitted on validation (the saved probabilities are turned back
  into logits, clipped to [1e-7, 1 - 1e-7]);
- regression: intervals at each alpha: test coverage and mean width.

``resplit`` is the mean test coverage when the same validation and test molecules are pooled
and drawn apart at random, ``--resplits`` times (sizes kept): what the guarantee gives where
it applies, beside what the scaffold split gives. ``sd`` is the sampling standard deviation of a coverage of exactly 1 - alpha over that many
test entries: differences smaller than about two of them are noise. Where a set has two or
more seeds, the ensemble's standard deviation over seeds is ranked against the ensemble
mean's absolute error (Spearman). Writes ``report.md``, ``coverage.csv`` and one reliability
diagram per (root, set), ``reliability_<root>_<set>.png``, into ``--out``; prints the table.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BINS = 10


@dataclass
class Run:
    """One finished (set, seed) with predictions: labels and scores of valid and test."""

    root: str
    model: str
    dataset: str
    seed: int
    split: str
    task_type: str
    y_valid: np.ndarray
    valid: np.ndarray
    y_test: np.ndarray
    test: np.ndarray
    test_rows: np.ndarray


def _root_names(roots: list[Path]) -> list[str]:
    """A short, unique name per root (its folder name, numbered when two share one)."""
    names = [root.resolve().name or "root" for root in roots]
    return [f"{n}{i}" if names.count(n) > 1 else n for i, n in enumerate(names)]


def find_runs(roots: list[Path]) -> tuple[list[Run], list[str]]:
    """Every finished run with predictions under the roots, and notes on what was skipped."""
    from smiexlm.errors import DataError
    from smiexlm.moleculenet.runs import PREDICTIONS_NAME, RESULT_NAME, has_predictions

    found, skipped, tasks = [], [], {}
    for root, name in zip(roots, _root_names(roots), strict=True):
        folders = sorted((root / "runs").glob(f"*/seed*/{RESULT_NAME}"))
        if not folders:
            raise DataError(f"ROOT {str(root)!r}: no runs/<set>/seed<k>/{RESULT_NAME} under it")
        for result in folders:
            folder = result.parent
            if not has_predictions(folder):
                skipped.append(f"{name}/{folder.parent.name}/{folder.name}: no {PREDICTIONS_NAME}")
                continue
            found.append(read_run(folder, name, tasks))
    return found, skipped


def read_run(folder: Path, root: str, tasks: dict) -> Run:
    """The run in ``folder``; its set's table is loaded once into ``tasks``."""
    from smiexlm.errors import DataError
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.moleculenet.runs import finished, read_predictions

    result = finished(folder)
    if result.dataset not in tasks:
        tasks[result.dataset] = load_task(result.dataset)
    task = tasks[result.dataset]
    if result.data_sha256 and result.data_sha256 != task.sha256:
        raise DataError(
            f"run {str(folder)!r} was made from a {result.dataset} table with sha256 "
            f"{result.data_sha256}; the table here has {task.sha256}: its rows may differ"
        )
    arrays = read_predictions(folder, task)
    return Run(root, result.model, result.dataset, result.seed, result.split, task.task_type,
               task.labels[arrays["valid_rows"]], arrays["valid"].astype(np.float64),
               task.labels[arrays["test_rows"]], arrays["test"].astype(np.float64),
               arrays["test_rows"])  # fmt: skip


def _sd(alpha: float, n: int) -> float:
    return math.sqrt(alpha * (1 - alpha) / n) if n else math.nan


def resplit_coverage(run: Run, alpha: float, mondrian: bool, draws: int) -> float:
    """The mean test coverage over ``draws`` random splits of validation + test (same sizes)."""
    from smiexlm.trust.conformal import ClassificationCalibrator, RegressionCalibrator
    from smiexlm.trust.sets import coverage

    if draws < 1:
        return math.nan
    labels, scores = (
        np.concatenate([run.y_valid, run.y_test]),
        np.concatenate([run.valid, run.test]),
    )
    rng, n, covered = np.random.default_rng(0), len(run.y_valid), []
    for _ in range(draws):
        order = rng.permutation(len(labels))
        cal, test = order[:n], order[n:]
        if run.task_type == "classification":
            made = ClassificationCalibrator(labels[cal], scores[cal])
            predicted = made.sets(scores[test], alpha, mondrian, too_small="full")
        else:
            made = RegressionCalibrator(labels[cal], scores[cal])
            predicted = made.intervals(scores[test], alpha, too_small="full")
        covered.append(coverage(labels[test], predicted).pooled)
    return float(np.mean(covered))


def classification_rows(run: Run, alphas: list[float], draws: int) -> tuple[list[dict], np.ndarray]:
    """One row per (alpha, mode) of a classification run, and its test probabilities after
    temperature scaling."""
    from smiexlm.trust.calibration import (
        apply_temperature,
        expected_calibration_error,
        fit_temperature,
        probs_to_logits,
    )
    from smiexlm.trust.conformal import ClassificationCalibrator
    from smiexlm.trust.sets import coverage, mean_set_size

    temps = fit_temperature(run.y_valid, probs_to_logits(run.valid))
    scaled = apply_temperature(probs_to_logits(run.test), temps)
    common = {"ece_before": expected_calibration_error(run.y_test, run.test, BINS).pooled,
              "ece_after": expected_calibration_error(run.y_test, scaled, BINS).pooled,
              "temperature": float(np.median(temps))}  # fmt: skip
    calibrator = ClassificationCalibrator(run.y_valid, run.valid)
    rows = []
    for alpha in alphas:
        for mode in ("marginal", "mondrian"):
            mondrian = mode == "mondrian"
            sets = calibrator.sets(run.test, alpha, mondrian, too_small="full")
            size = sets.size[~np.isnan(run.y_test)]
            result = coverage(run.y_test, sets)
            per_class = [coverage(np.where(run.y_test == c, c, np.nan), sets).pooled for c in (0, 1)]  # fmt: skip
            rows.append(common | {
                "alpha": alpha, "mode": mode, "n_test": int(result.count.sum()),
                "coverage": result.pooled, "sd": _sd(alpha, int(result.count.sum())),
                "resplit": resplit_coverage(run, alpha, mondrian, draws),
                "coverage_0": per_class[0], "coverage_1": per_class[1],
                "size_or_width": mean_set_size(sets, run.y_test).pooled,
                "singletons": float(np.mean(size == 1)), "empty": float(np.mean(size == 0)),
                "no_threshold": int(np.isinf(calibrator.thresholds(alpha, mondrian, "full")).any(axis=1).sum()),
            })  # fmt: skip
    return rows, scaled


def regression_rows(run: Run, alphas: list[float], draws: int) -> list[dict]:
    """One row per alpha of a regression run."""
    from smiexlm.trust.conformal import RegressionCalibrator
    from smiexlm.trust.sets import coverage, mean_width

    calibrator = RegressionCalibrator(run.y_valid, run.valid)
    rows = []
    for alpha in alphas:
        intervals = calibrator.intervals(run.test, alpha, too_small="full")
        result = coverage(run.y_test, intervals)
        rows.append({
            "alpha": alpha, "mode": "marginal", "n_test": int(result.count.sum()),
            "coverage": result.pooled, "sd": _sd(alpha, int(result.count.sum())),
            "resplit": resplit_coverage(run, alpha, False, draws),
            "size_or_width": mean_width(intervals, run.y_test).pooled,
            "no_threshold": int(np.isinf(calibrator.quantiles(alpha, "full")).sum()),
        })  # fmt: skip
    return rows


def ensemble_ranks(runs: list[Run]) -> list[dict]:
    """Per (root, set) with two or more seeds on the same test rows: Spearman's rho between
    the seeds' standard deviation and the absolute error of their mean."""
    from smiexlm.trust.calibration import spread_error_rank

    groups: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.root, run.dataset), []).append(run)
    out = []
    for (root, dataset), members in groups.items():
        same = [m for m in members if np.array_equal(m.test_rows, members[0].test_rows)]
        if len(same) < 2:
            continue
        stack = np.stack([m.test for m in same])  # (S, N, T)
        error = np.abs(stack.mean(axis=0) - same[0].y_test)
        rho = spread_error_rank(stack.std(axis=0), error)
        out.append({"root": root, "set": dataset, "seeds": len(same), "spearman": rho})
    return out


def plot_sets(runs: list[Run], scaled: dict[int, np.ndarray], out: Path) -> list[Path]:
    """One reliability diagram per (root, set) of classification runs, seeds pooled."""
    from smiexlm.trust.calibration import plot_reliability

    paths = []
    for root, dataset in dict.fromkeys((r.root, r.dataset) for r in runs if id(r) in scaled):
        members = [r for r in runs if (r.root, r.dataset) == (root, dataset)]
        labels = np.concatenate([m.y_test for m in members])
        before = np.concatenate([m.test for m in members])
        after = np.concatenate([scaled[id(m)] for m in members])
        title = f"{dataset} test, {root} ({len(members)} seed{'s' * (len(members) > 1)})"
        path = out / f"reliability_{root}_{dataset}.png"
        paths.append(plot_reliability(labels, before, path, after, BINS, title))
    return paths


COLUMNS = ["root", "model", "set", "seed", "split", "task_type", "alpha", "mode", "n_test",
           "coverage", "sd", "resplit", "coverage_0", "coverage_1", "size_or_width", "singletons",
           "empty", "no_threshold", "ece_before", "ece_after", "temperature"]  # fmt: skip


def _cell(value: object, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(rows: list[dict], ranks: list[dict]) -> str:
    """The coverage table (and the ensemble ranks, when any) in Markdown."""
    head = ["set", "seed", "root", "alpha", "mode", "n test", "coverage (sd)", "resplit", "cov. 0",
            "cov. 1", "size / width", "singletons", "empty", "ECE before", "after", "T"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cov = f"{_cell(r['coverage'])} ({_cell(r['sd'])})"
        cells = [r["set"], r["seed"], r["root"], r["alpha"], r["mode"], r["n_test"], cov,
                 *(_cell(r.get(k)) for k in ("resplit", "coverage_0", "coverage_1", "size_or_width",
                   "singletons", "empty", "ece_before", "ece_after")),
                 _cell(r.get("temperature"), 2)]  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    if ranks:
        lines += ["", "| set | root | seeds | Spearman(seed std, abs error) |", "|---|---|---|---|"]
        lines += [f"| {r['set']} | {r['root']} | {r['seeds']} | {_cell(r['spearman'])} |" for r in ranks]  # fmt: skip
    return "\n".join(lines)


def report(rows: list[dict], ranks: list[dict], skipped: list[str], command: str) -> str:
    """``report.md``: how it was made, the table, what each column is and is not."""
    splits = sorted({r["split"] for r in rows})
    models = dict.fromkeys((r["root"], r["model"]) for r in rows)
    notes = [
        "# Conformal coverage and calibration on test", "", f"    {command}", "",
        *[f"- `{root}`: {model}" for root, model in models], "",
        f"Calibration: the validation split; measured: the test split ({', '.join(splits)} "
        "split). `mode`: marginal, or Mondrian by class. Coverage is the share of labelled "
        "test entries (molecule, task) whose label is in its set (interval), pooled over "
        "tasks; `resplit`: the same, averaged over random re-splits of validation + test "
        "(exchangeable by construction); `cov. 0`/`cov. 1` within each class. `sd`: sampling sd of an exact 1 - alpha "
        "coverage over that many entries. `size / width`: mean set size (classification) or "
        "interval width (regression). ECE: binary, 10 equal bins, before and after one "
        "temperature per task fitted on validation (`T`: their median).", "",
        "The guarantee (coverage >= 1 - alpha) holds when validation and test molecules are "
        "exchangeable. A scaffold split puts different scaffolds in each, so it is not "
        "promised here: this table measures how far it still holds.", "",
        markdown(rows, ranks), "",
    ]  # fmt: skip
    if skipped:
        notes += ["Skipped (no predictions kept):", "", *[f"- {s}" for s in skipped], ""]
    return "\n".join(notes)


def write_csv(rows: list[dict]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", type=Path, nargs="+", help="folders holding runs/<set>/seed<k>/")
    parser.add_argument("--out", type=Path, required=True, help="folder for the report")
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.2])
    parser.add_argument("--resplits", type=int, default=100,
                        help="random re-splits of valid + test per row (0: none)")  # fmt: skip
    args = parser.parse_args()

    from smiexlm.atomic import write_text_atomic
    from smiexlm.paths import check_output
    from smiexlm.trust.arrays import check_alpha

    out = check_output(args.out, "--out", "folder")
    alphas = [check_alpha(a) for a in args.alphas]
    runs, skipped = find_runs(args.roots)
    rows, scaled = [], {}
    for run in runs:
        ident = {"root": run.root, "model": run.model, "set": run.dataset, "seed": run.seed,
                 "split": run.split, "task_type": run.task_type}  # fmt: skip
        if run.task_type == "classification":
            measured, scaled[id(run)] = classification_rows(run, alphas, args.resplits)
        else:
            measured = regression_rows(run, alphas, args.resplits)
        rows += [ident | row for row in measured]
    ranks = ensemble_ranks(runs)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/conformal_coverage.py " + " ".join(sys.argv[1:])
    write_text_atomic(out / "report.md", report(rows, ranks, skipped, command))
    write_text_atomic(out / "coverage.csv", write_csv(rows))
    plots = plot_sets(runs, scaled, out)
    print(markdown(rows, ranks))
    print(f"\n{len(runs)} run(s), {len(plots)} diagram(s), report in {out}")


if __name__ == "__main__":
    main()
