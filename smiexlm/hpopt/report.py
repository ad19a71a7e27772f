"""What a search (:mod:`smiexlm.hpopt.run`) leaves in its folder, rewritten after every
trial, each file atomically:

- ``best.toml``: the best completed trial's config, flat FinetuneConfig keys (the task's
  Table 8 row with the searched keys), for ``smiexlm finetune TASK --config best.toml``;
  rewritten when a trial improves on it;
- ``trials.csv``: one row per trial: number, state, value, CPU seconds, epochs run, params,
  and a note (pruned, or why it failed);
- ``history.png``: the trial values and the best so far;
- ``report.md``: the command, the data and split, the budget spent, the best trial beside
  trial 0 (the Table 8 row) and the next command to run.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from smiexlm.atomic import atomic_path, write_text_atomic
from smiexlm.hpopt.config import HpoptConfig
from smiexlm.hpopt.search import HpoptResult, Search
from smiexlm.hpopt.study import COUNTED_STATES, spending

BEST_NAME = "best.toml"
TRIALS_NAME = "trials.csv"
PLOT_NAME = "history.png"
REPORT_NAME = "report.md"
PARAMS = (
    "lr",
    "epochs",
    "dropout",
    "pooler_dropout",
    "pooling",
    "features",
    "freeze_layers",
    "layers",
)
COLUMNS = ("number", "state", "value", "cpu_s", "epochs_run", *PARAMS, "note")


def best_trial(study):
    """The best completed trial, or None before one completes."""
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    return study.best_trial


def trial_rows(study) -> list[dict[str, Any]]:
    """One record per trial, in trial order (see :data:`COLUMNS`)."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        state = trial.state.name.lower()
        epochs_run = trial.user_attrs.get("epochs_run", trial.last_step)
        note = trial.user_attrs.get("error", "")
        if state == "pruned":
            note = f"pruned after epoch {trial.last_step}"
        elif state == "fail" and not note:
            note = "its process stopped mid-trial; not counted"
        value = trial.value if state in ("complete", "pruned") else None
        rows.append({"number": trial.number, "state": state, "value": value,
                     "cpu_s": trial.user_attrs.get("cpu_seconds"), "epochs_run": epochs_run,
                     **{k: trial.params.get(k) for k in PARAMS}, "note": note})  # fmt: skip
    return rows


def best_config(search: Search, trial, served: dict[str, Any] | None = None) -> dict[str, Any]:
    """The flat keys ``best.toml`` holds: the trial's whole config but the device, with
    ``served`` (the search's own ``forest`` and ``ensemble``, which its trials leave out and
    the final fit serves; ``forest = "none"`` spelled out, as TOML has no None)."""
    flat = search.config(trial.params).to_dict() | (served or {})
    flat.pop("device")
    if not flat["extra"]:
        flat.pop("extra")
    return flat


def write_trials(rows: list[dict[str, Any]], path: Path) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)


def plot_history(rows: list[dict[str, Any]], path: Path, title: str, metric: str) -> None:
    """Completed (dots) and pruned (crosses) trial values by trial number, and the best
    completed value so far (a step line); ROC-AUC is maximised, RMSE minimised."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for state, marker in (("complete", "o"), ("pruned", "x")):
        points = [(r["number"], r["value"]) for r in rows if r["state"] == state]
        if points:
            ax.scatter(*zip(*points, strict=True), marker=marker, label=state)
    pick = max if metric == "roc_auc" else min
    best, steps = None, []
    for row in rows:
        if row["state"] == "complete" and row["value"] is not None:
            best = row["value"] if best is None else pick(best, row["value"])
        if best is not None:
            steps.append((row["number"], best))
    if steps:
        ax.step(*zip(*steps, strict=True), where="post", color="black", label="best so far")
    label = "validation ROC-AUC x 100" if metric == "roc_auc" else f"validation {metric.upper()}"
    ax.set(xlabel="trial", ylabel=label, title=title)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="best")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def _value(value: float | None, metric: str) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    return f"{value:.2f}" if metric == "roc_auc" else f"{value:.4f}"


class Outputs:
    """The folder's files for one search; :meth:`write` after each trial."""

    def __init__(self, out: Path, search: Search, hp: HpoptConfig, command: str | None,
                 served: dict[str, Any] | None = None):  # fmt: skip
        self.out, self.search, self.hp, self.served = Path(out), search, hp, served
        self.command = command or "run_hpopt(...)"
        self.metric = search.task.metric
        self.shared = hp.storage is not None  # best.toml once, by the worker that ends the study

    def write(self, study, number: int | None = None) -> bool:
        """Rewrite the files after trial ``number`` (None: bring them up to date); whether
        that trial is the new best (``best.toml`` is rewritten then, and when missing)."""
        rows = trial_rows(study)
        write_trials(rows, self.out / TRIALS_NAME)
        title = f"{self.search.task.name}: hpopt trials and the best so far"
        plot_history(rows, self.out / PLOT_NAME, title, self.metric)
        best = best_trial(study)
        improved = best is not None and best.number == number
        fresh = improved or number is None or not (self.out / BEST_NAME).exists()
        if best is not None and fresh and not self.shared:
            self._write_best(best)
        write_text_atomic(self.out / REPORT_NAME, self._report(study, rows, best))
        return improved

    def has_best(self) -> bool:
        return (self.out / BEST_NAME).is_file()

    def write_best(self, study) -> None:
        """``best.toml`` of the study's best trial, if one has completed."""
        if (best := best_trial(study)) is not None:
            self._write_best(best)

    def _write_best(self, trial) -> None:
        from smiexlm.settings import to_toml

        name = self.search.task.name
        head = (f"# The best trial of `smiexlm hpopt` in this folder: trial {trial.number}, "
                f"validation {self.metric} {_value(trial.value, self.metric)}.\n"
                f"# The {name} Table 8 row with the searched keys; the search never read the "
                f"test split.\n# Score it on test: smiexlm finetune {name} --config "
                f"{self.out / BEST_NAME}\n")  # fmt: skip
        write_text_atomic(
            self.out / BEST_NAME, head + to_toml(best_config(self.search, trial, self.served))
        )

    def _report(self, study, rows: list[dict[str, Any]], best) -> str:
        counted, cpu = spending(study)
        states = [r["state"] for r in rows]
        src, search, hp = self.search.source, self.search, self.hp
        budget = " and ".join(f"{k} {v}" for k, v in (("--trials", hp.trials),
                              ("--cpu-minutes", hp.cpu_minutes)) if v is not None)  # fmt: skip
        lines = [
            f"# Hyper-parameter search: {src['dataset']}", "", f"`{self.command}`", "",
            f"- data: {src['n_molecules']} molecules (sha256 {str(src['data_sha256'])[:12]}), "
            f"split {src['split']}: train {src['sizes'][0]}, valid {src['sizes'][1]}; the "
            f"{src['sizes'][2]} test molecules were never read",
            f"- backbone {search.backbone.name}, training seed {search.seed}; TPE sampler "
            f"(seed {hp.seed}, {hp.startup_trials} random trials first), median pruner (after "
            f"{hp.prune_after} completed trials, from epoch {hp.warmup_epochs + 1})",
            f"- budget {budget}: {counted} trials counted ({states.count('complete')} complete,"
            f" {states.count('pruned')} pruned), {states.count('fail')} failed (not counted), "
            f"{cpu / 60:.1f} CPU minutes",
        ]  # fmt: skip
        if best is not None:
            lines += ["", self._comparison(study, best), "",
                      f"Score it on test: `smiexlm finetune {src['dataset']} --config "
                      f"{self.out / BEST_NAME}`"]  # fmt: skip
        lines += ["", f"Trials: {TRIALS_NAME}; values: {PLOT_NAME}."]
        return "\n".join(lines) + "\n"

    def _comparison(self, study, best) -> str:
        """The best trial's searched keys beside the Table 8 row's trial (the first counted
        one: trial 0, or the one after it when trial 0 was cut short)."""
        first = next(t for t in study.get_trials(deepcopy=False) if t.state.name in COUNTED_STATES)
        zero = first.value if first.state.name == "COMPLETE" else None
        lines = [f"| validation {self.metric} | Table 8 (trial {first.number}) | best (trial "
                 f"{best.number}) |",
                 "|---|---|---|", f"| value | {_value(zero, self.metric)} | "
                 f"{_value(best.value, self.metric)} |"]  # fmt: skip
        base = self.search.space.params_of(self.search.base)
        for key in PARAMS:
            if key in best.params:
                a, b = base.get(key), best.params[key]
                a, b = (f"{v:.3g}" if isinstance(v, float) else str(v) for v in (a, b))
                lines.append(f"| {key} | {a} | {b} |")
        return "\n".join(lines)

    def line(self, study, number: int, improved: bool) -> str:
        """One progress line for trial ``number``."""
        row = trial_rows(study)[number]
        counted, cpu = spending(study)
        best = best_trial(study)
        of = f"/{self.hp.trials}" if self.hp.trials else ""
        spent = f"{cpu / 60:.1f}" + (f"/{self.hp.cpu_minutes:g}" if self.hp.cpu_minutes else "")
        mark = " (new best)" if improved else ""
        best_text = "–" if best is None else f"{_value(best.value, self.metric)} (#{best.number})"
        return (f"trial {number} {row['state']}: {_value(row['value'], self.metric)}{mark}; best "
                f"{best_text}; {counted}{of} trials, {spent} CPU min")  # fmt: skip

    def result(self, study, stop: str) -> HpoptResult:
        counted, cpu = spending(study)
        best = best_trial(study)
        failed = sum(t.state.name == "FAIL" for t in study.get_trials(deepcopy=False))
        return HpoptResult(
            best_number=None if best is None else best.number,
            best_value=None if best is None else best.value,
            best_config=None if best is None else best_config(self.search, best, self.served),
            counted=counted, failed=failed, cpu_seconds=cpu, stopped_by=stop, out=self.out,
        )  # fmt: skip
