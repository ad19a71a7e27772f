"""Does the error grow as a test molecule lies further from the training molecules?

    export SMIEXLM_DATA=../shared/data
    python benchmarks/applicability_domain.py benchmarks/results/trust/regression \\
        benchmarks/results/table1/default --out benchmarks/results/trust/domain

Reads every fine-tuning run under the given roots (``ROOT/runs/<set>/seed<k>/``) whose
``predictions.npz`` holds the test molecules' nearest training similarities
(``test_tanimoto``, ``test_cosine``; see :func:`smiexlm.moleculenet.runs.write_predictions`),
and for each set, pooling its seeds:

- each test molecule's error: the absolute error (regression, in the label's units), or the
  mean over its labelled tasks of abs(label − probability) (classification);
- the mean error in each fifth of the test molecules ordered by nearest similarity, and the
  Spearman correlation of similarity with error (negative: error grows as similarity falls);
- the mean error inside and outside the domain, for each ``--quantiles`` q as ``predict
  --domain-quantile q`` decides it: both nearest similarities at least the q-quantile of the
  validation molecules' of that run (0: the lowest any had).

Writes ``report.md``, ``domain.csv`` (one row per set, measure and fifth) and ``domain.png``
(error against similarity, one line per set, Tanimoto and cosine side by side) into ``--out``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

MEASURES = ("tanimoto", "cosine")
N_BINS = 5


def _runs(roots: list[Path]) -> dict[str, list[Path]]:
    """set -> the kept arrays of the runs whose predictions keep the test molecules'
    similarities (in a cell's own file or its row's store)."""
    from smiexlm.moleculenet import runs

    found: dict[str, list[dict]] = {}
    for root in roots:
        for folder in sorted(Path(root).glob("runs/*/seed*/")):
            kept = runs.kept_arrays(folder)
            if kept is not None and "test_tanimoto" in kept:
                found.setdefault(folder.parent.name, []).append(kept)
    return found


def _molecule_errors(kept: dict, labels: np.ndarray, quantiles: list[float]) -> pd.DataFrame:
    """One row per test molecule: error, nearest similarities, and ``in_domain <q>`` per
    quantile, decided as ``predict`` decides it (:class:`~smiexlm.trust.domain.DomainBounds`)."""
    from smiexlm.trust.domain import DomainBounds

    y, p = labels[kept["test_rows"]], kept["test"].astype(np.float64)
    known = ~np.isnan(y)
    diff = np.where(known, np.abs(np.nan_to_num(y) - p), 0.0)
    n = known.sum(axis=1)
    error = np.where(n > 0, diff.sum(axis=1) / np.maximum(n, 1), np.nan)
    frame = pd.DataFrame({m: kept[f"test_{m}"] for m in MEASURES})
    frame["error"] = error
    for q in quantiles:
        bounds = DomainBounds.of(kept["valid_tanimoto"], kept["valid_cosine"], q)
        frame[f"in_domain {q:g}"] = bounds.inside(kept["test_tanimoto"], kept["test_cosine"])
    return frame[np.isfinite(error)]


def _fifths(frame: pd.DataFrame, measure: str) -> pd.DataFrame:
    """Mean similarity and error per fifth of the molecules ordered by ``measure``."""
    order = frame.sort_values(measure, kind="stable").reset_index(drop=True)
    order["fifth"] = np.arange(len(order)) * N_BINS // len(order) + 1
    return order.groupby("fifth").agg(similarity=(measure, "mean"), error=("error", "mean"),
                                      n=("error", "size")).reset_index()  # fmt: skip


def summarise(found: dict[str, list[Path]],
              quantiles: list[float]) -> tuple[pd.DataFrame, list[str]]:  # fmt: skip
    from scipy.stats import spearmanr

    from smiexlm.moleculenet import load_task

    rows, lines = [], []
    for name, paths in sorted(found.items()):
        task = load_task(name)
        frame = pd.concat([_molecule_errors(p, task.labels, quantiles) for p in paths],
                          ignore_index=True)  # fmt: skip
        unit = "absolute error" if not task.is_classification else "mean abs(label − p)"
        parts = []
        for measure in MEASURES:
            rho = spearmanr(frame[measure], frame["error"]).statistic
            for r in _fifths(frame, measure).itertuples():
                rows.append((name, measure, r.fifth, r.similarity, r.error, r.n, rho))
            parts.append(f"{rho:+.2f}")
        for q in quantiles:
            inside = frame[f"in_domain {q:g}"]
            out = frame[~inside]["error"]
            parts.append(f"{frame[inside]['error'].mean():.3f} | "
                         f"{out.mean() if len(out) else float('nan'):.3f} ({len(out)})")  # fmt: skip
        lines.append(
            f"| {name} | {len(paths)} | {len(frame)} | {unit} | " + " | ".join(parts) + " |"
        )
    columns = ["set", "measure", "fifth", "similarity", "error", "n", "spearman"]
    return pd.DataFrame(rows, columns=columns), lines


def plot(table: pd.DataFrame, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, measure in zip(axes, MEASURES, strict=True):
        for name, part in table[table["measure"] == measure].groupby("set"):
            scale = part["error"].iloc[-1]  # the nearest fifth's error: sets share one axis
            ax.plot(part["similarity"], part["error"] / scale, marker="o", label=name)
        ax.set_xlabel(f"nearest training similarity ({measure}), mean per fifth")
        ax.set_ylabel("error / error of the nearest fifth")
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.set_title({"tanimoto": "ECFP4 Tanimoto", "cosine": "model embedding cosine"}[measure])
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", type=Path, nargs="+", help="folders holding runs/<set>/seed<k>")
    parser.add_argument("--quantiles", type=float, nargs="+", default=[0.0, 0.05],
                        help="domain bounds at these quantiles of the validation molecules' "
                        "nearness (0: the lowest; predict's default is 0.05)")  # fmt: skip
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    found = _runs(args.roots)
    if not found:
        raise SystemExit("no run with test similarities under the given roots")
    table, lines = summarise(found, args.quantiles)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "domain.csv", index=False)
    plot(table, args.out / "domain.png")
    columns = ["set", "runs", "test molecules", "error", "Spearman (Tanimoto)",
               "Spearman (cosine)"]  # fmt: skip
    for q in args.quantiles:
        at = ", bounds at the lowest" if q == 0 else f", bounds at the {q:g} quantile"
        columns += [f"error in domain{at}", f"error outside (n){at}"]
    header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)
    report = "\n".join([header, *lines])
    (args.out / "report.md").write_text(
        "# Error against nearness to the training molecules (test split)\n\n"
        f"`python benchmarks/applicability_domain.py {' '.join(sys.argv[1:])}`\n\n"
        + report + "\n\nPer fifth of the test molecules: `domain.csv`; plot: `domain.png`.\n"
    )  # fmt: skip
    print(report)


if __name__ == "__main__":
    main()
