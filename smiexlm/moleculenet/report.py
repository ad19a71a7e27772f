"""Benchmark results: one record per (model, dataset, seed), summaries, CSV/Markdown/PNG.

Every record carries what is needed to reproduce it: the split name (and its seed, if it has
one), the training seed, the resolved config, the data file's sha256, the number of molecules
RDKit rejected, and the wall time. Reports put the paper's numbers (method-notes §4) beside
the measured ones.
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

from smiexlm.moleculenet.registry import PAPER_RESULTS, PAPER_TASKS, get_spec
from smiexlm.paths import REPORT_FILES


@dataclass
class RunResult:
    """One model trained with one seed on one dataset. Scores are ROC-AUC x 100 or RMSE."""

    model: str
    dataset: str
    seed: int
    split: str
    metric: str
    test: float
    valid: float
    sizes: tuple[int, int, int]
    n_invalid: int
    n_tasks_scored: int
    n_tasks: int
    wall_s: float
    data_sha256: str | None
    best_epoch: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    #: measures beside the score (``metrics.more_scores``); empty in results older than them
    more: dict[str, float] = field(default_factory=dict)
    #: True on a result read back from its run's folder (:func:`~smiexlm.moleculenet.runs.
    #: finished`), whose times are those of the run that made it; never written
    read_back: ClassVar[bool] = False

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        out["sizes"] = "/".join(map(str, self.sizes))
        out["config"] = json.dumps(self.config, sort_keys=True)
        out["more"] = json.dumps(self.more, sort_keys=True)
        return out


def _mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
    return mean, math.sqrt(var)


PAPER_SPLIT = "scaffold"  # Table 1's split: DeepChem's deterministic Bemis-Murcko scaffolds


def split_kind(label: str) -> str:
    """The split's name without its seed: ``random(seed=1)`` -> ``random``."""
    return label.split("(", 1)[0]


def describe_splits(results: list[RunResult]) -> str:
    """The splits the results were scored on, for a report's header: ``scaffold`` or
    ``random (seeds 0, 1, 2)``; several kinds are joined by ``;``."""
    seeds: dict[str, list[str]] = {}
    for r in results:
        found = seeds.setdefault(split_kind(r.split), [])
        if "(seed=" in r.split and (seed := r.split.split("(seed=", 1)[1].rstrip(")")) not in found:
            found.append(seed)
    return "; ".join(
        f"{kind} (seed{'s' if len(s) > 1 else ''} {', '.join(s)})" if s else kind
        for kind, s in seeds.items()
    )


def _row_names(results: list[RunResult]) -> list[str]:
    """Each result's row: its model, or its model and split kind (``m [random]``) when that
    model was scored on several kinds of split."""
    kinds: dict[str, set[str]] = {}
    for r in results:
        kinds.setdefault(r.model, set()).add(split_kind(r.split))
    return [f"{r.model} [{split_kind(r.split)}]" if len(kinds[r.model]) > 1 else r.model
            for r in results]  # fmt: skip


def summarize(results: list[RunResult]) -> dict[str, dict[str, tuple[float, float, int]]]:
    """row -> dataset -> (mean, sample std, n seeds) of the test score. A row is a model, or a
    model and a split kind (``m [random]``) when that model was scored on several, so scores
    of different splits are never averaged together."""
    table: dict[str, dict[str, list[float]]] = {}
    for row, r in zip(_row_names(results), results, strict=True):
        table.setdefault(row, {}).setdefault(r.dataset, []).append(r.test)
    return {
        model: {ds: (*_mean_std(v), len(v)) for ds, v in per.items()}
        for model, per in table.items()
    }


def _dataset_order(results: list[RunResult]) -> list[str]:
    seen = list(dict.fromkeys(r.dataset for r in results))
    return [d for d in PAPER_TASKS if d in seen] + [d for d in seen if d not in PAPER_TASKS]


def _digits(metric: str) -> int:
    """Decimals a score is shown with: ROC-AUC x 100 to 0.1, RMSE to 0.001."""
    return 1 if metric == "roc_auc" else 3


def _paper_datasets(results: list[RunResult]) -> set[str]:
    """The datasets the paper's Table 1 scores, where they were scored as it did: its
    classification sets, by ROC-AUC, on its scaffold split, read from the set's own file (a
    user's table given one of their names, a regression table, or a random or balanced split
    has no paper row; a result older than its table's sha256 is taken at its word)."""
    return {
        r.dataset
        for r in results
        if r.dataset in PAPER_TASKS
        and r.metric == "roc_auc"
        and r.split == PAPER_SPLIT
        and r.data_sha256 in (None, get_spec(r.dataset).sha256)
    }


def markdown_table(results: list[RunResult], with_paper: bool = True) -> str:
    """Mean ± std per dataset and the mean over datasets (when they share a metric); paper rows
    below the measured ones for the paper's classification sets."""
    datasets = _dataset_order(results)
    summary = summarize(results)
    metrics = {r.dataset: r.metric for r in results}
    one_metric = len(set(metrics.values())) == 1
    kinds = {row: split_kind(r.split) for row, r in zip(_row_names(results), results, strict=True)}
    several = len(set(kinds.values())) > 1  # then every row names its split
    header = ["model", *(["split"] if several else []), *datasets, "mean"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model, per in summary.items():
        cells, means = [model, *([kinds[model]] if several else [])], []
        for ds in datasets:
            if ds in per:
                mean, std, n = per[ds]
                k = _digits(metrics[ds])
                cells.append(f"{mean:.{k}f} ± {std:.{k}f}" + (f" (n={n})" if n != 3 else ""))
                means.append(mean)
            else:
                cells.append("–")
        full = len(means) == len(datasets) and one_metric
        k = _digits(metrics[datasets[0]]) if datasets else 1
        cells.append(f"{sum(means) / len(means):.{k}f}" if full else "–")
        lines.append("| " + " | ".join(cells) + " |")
    paper = _paper_datasets(results)
    if with_paper and paper:
        for model, scores in PAPER_RESULTS.items():
            vals = [scores[d] for d in datasets if d in scores and d in paper]
            cells = [model, *([PAPER_SPLIT] if several else [])]
            cells += [f"{scores[d]:.1f}" if d in paper and d in scores else "–" for d in datasets]
            full = len(vals) == len(datasets)
            cells.append(f"{sum(vals) / len(vals):.1f}" if full else "–")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: how the report names the measures kept beside the score (``RunResult.more``), and their decimals
MORE_TITLES = {"pr_auc": ("PR-AUC x 100 (average precision)", 1), "mae": ("MAE", 3),
               "r2": ("R² (coefficient of determination)", 3), "spearman": ("Spearman's rho", 3),
               "cliff_rmse": ("RMSE on the test molecules that form activity cliffs", 3),
               "n_cliff": ("Test molecules that form activity cliffs", 0)}  # fmt: skip


def more_markdown(results: list[RunResult]) -> str:
    """One table per measure kept beside the score (:data:`MORE_TITLES`): mean ± sample std
    over seeds per row and dataset; under PR-AUC, what a random ranking scores (the share of
    positives). Empty when no result keeps them (results older than them)."""
    lines: list[str] = []
    for key, (title, k) in MORE_TITLES.items():
        have = [r for r in results if not math.isnan(r.more.get(key, math.nan))]
        if not have:
            continue
        datasets = _dataset_order(have)
        table: dict[str, dict[str, list[float]]] = {}
        for row, r in zip(_row_names(have), have, strict=True):
            table.setdefault(row, {}).setdefault(r.dataset, []).append(r.more[key])
        if key == "pr_auc":
            chance = table["random ranking (the share of positives)"] = {}
            for r in have:
                chance.setdefault(r.dataset, []).append(r.more["positives"])
        lines += [f"**{title}**", "", "| model | " + " | ".join(datasets) + " |",
                  "|" + "---|" * (len(datasets) + 1)]  # fmt: skip
        for row, per in table.items():
            cells = []
            for ds in datasets:
                mean, std = _mean_std(per.get(ds, []))
                cells.append("–" if math.isnan(mean) else f"{mean:.{k}f}"
                             + (f" ± {std:.{k}f}" if len(per[ds]) > 1 else ""))  # fmt: skip
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def details_markdown(results: list[RunResult]) -> str:
    """Per-run table: split, seed, sizes, invalid molecules, scored tasks, updates, precision,
    training CPU time and wall time."""
    lines = [
        "| model | dataset | split | seed | train/valid/test | n_invalid | tasks scored "
        "| valid | test | best epoch | updates | precision | CPU s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        c = r.config or {}
        cpu = c.get("train_cpu_seconds")
        k = _digits(r.metric)
        lines.append(
            f"| {r.model} | {r.dataset} | {r.split} | {r.seed} | {'/'.join(map(str, r.sizes))} "
            f"| {r.n_invalid} | {r.n_tasks_scored}/{r.n_tasks} | {r.valid:.{k}f} | {r.test:.{k}f} "
            f"| {r.best_epoch if r.best_epoch is not None else '–'} | {c.get('steps', '–')} "
            f"| {c.get('precision', '–')} | {'–' if cpu is None else f'{cpu:.0f}'} "
            f"| {r.wall_s:.1f} |"
        )
    return "\n".join(lines)


def write_report(
    results: list[RunResult], out_dir: Path, title: str, command: str = ""
) -> dict[str, Path]:
    """Write ``results.csv``, ``report.md`` (the summary), ``runs.md`` (every run),
    ``results.json`` (every run's record with its config) and ``report.png`` into out_dir, each under a temporary name
    renamed into place (an interrupt keeps the previous report)."""
    import pandas as pd

    from smiexlm.atomic import atomic_path, write_text_atomic

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = dict(zip(("csv", "md", "runs", "json", "png"),
                     (out_dir / name for name in REPORT_FILES), strict=True))  # fmt: skip
    with atomic_path(paths["csv"]) as tmp:
        pd.DataFrame([r.row() for r in results]).to_csv(tmp, index=False)
    write_text_atomic(paths["json"], json.dumps([asdict(r) for r in results], indent=1))
    write_text_atomic(paths["md"], _summary_page(results, title, command))
    write_text_atomic(paths["runs"], _runs_page(results, title))
    with atomic_path(paths["png"]) as tmp:
        bar_chart(results, tmp, title)
    return paths


RUNS_PAGE = REPORT_FILES[2]


def _summary_page(results: list[RunResult], title: str, command: str) -> str:
    """``report.md``: the summary table, the measures beside the score and the data's
    checksums; every run is on :data:`RUNS_PAGE`."""
    names = {"roc_auc": "test ROC-AUC x 100", "rmse": "test RMSE"}
    metrics = list(dict.fromkeys(r.metric for r in results)) or ["roc_auc"]
    unit = " or ".join(names.get(m, f"test {m}") for m in metrics)  # each set: its own
    if len(metrics) > 1:
        unit += ", by set"
    total = sum(r.wall_s for r in results)
    paper = ["Paper rows: ExLM paper Table 1 (scaffold split, 3 seeds).", ""]
    more = more_markdown(results)
    text = [
        f"# {title}",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · {platform.machine()} · "
        f"total wall time {total:.0f} s" + (f" · `{command}`" if command else ""),
        "",
        f"## Summary ({unit}, mean ± sample std over seeds)",
        "",
        f"Split: {describe_splits(results)}.",
        "",
        markdown_table(results),
        "",
        *(paper if _paper_datasets(results) else []),
        *(["## Beside the score (test, mean ± sample std over seeds)", "", more] if more else []),
        f"Every run, with its sizes, epochs, precision and seconds: [{RUNS_PAGE}]({RUNS_PAGE}).",
        "",
        "## Data checksums (sha256)",
        "",
        *[f"- {ds}: `{sha}`" for ds, sha in {r.dataset: r.data_sha256 for r in results}.items()],
        "",
    ]
    return "\n".join(text)


def _runs_page(results: list[RunResult], title: str) -> str:
    """:data:`RUNS_PAGE`: one row per run; each run's full config is in ``results.json``."""
    text = [
        f"# {title}: every run",
        "",
        "Each run's full config (schedule, head, software versions, CPU seconds) is its record "
        "in [results.json](results.json).",
        "",
        details_markdown(results),
        "",
    ]
    return "\n".join(text)


def bar_chart(results: list[RunResult], path: Path, title: str) -> Path:
    """Grouped bars per dataset: each measured model (error bar = std) and the paper's rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    datasets = _dataset_order(results)
    summary = summarize(results)
    series: list[tuple[str, list[float], list[float]]] = []
    for model, per in summary.items():
        means = [per[d][0] if d in per else np.nan for d in datasets]
        stds = [per[d][1] if d in per else 0.0 for d in datasets]
        series.append((model, means, stds))
    paper = _paper_datasets(results)
    for model, scores in PAPER_RESULTS.items():
        if paper:
            means = [scores[d] if d in paper else np.nan for d in datasets]
            series.append((model, means, [0.0] * len(datasets)))
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(datasets))
    fig, ax = plt.subplots(figsize=(max(6, 1.4 * len(datasets) + 2), 4))
    for i, (model, means, stds) in enumerate(series):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, means, width, yerr=stds, label=model,
               capsize=2)  # fmt: skip
    ax.set_xticks(x, [d.upper() if len(d) <= 5 else d.capitalize() for d in datasets])
    ax.set_ylabel("test ROC-AUC x 100" if results and results[0].metric == "roc_auc" else "RMSE")
    finite = [v for _, m, _ in series for v in m if not np.isnan(v)]
    if finite and results and results[0].metric == "roc_auc":
        ax.set_ylim(max(0, min(finite) - 10), min(100, max(finite) + 5))
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def read_results(path: Path) -> list[RunResult]:
    """The records of a ``results.json`` written by ``write_report`` (to merge runs)."""
    records = json.loads(Path(path).read_text())
    return [RunResult(**(r | {"sizes": tuple(r["sizes"])})) for r in records]
