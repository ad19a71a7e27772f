"""The ExLM paper's GLUE comparison (Table 3) on a CPU budget: tiny text models, 5 dev tasks.

Each backbone is fine-tuned in its own process (they can run side by side), then ``merge``
writes one Markdown table and one bar chart next to the majority-class baseline and the
paper's base-model rows:

    export SMIEXLM_DATA=../shared/data
    python benchmarks/glue_table.py run --name ExLM --checkpoint runs/text_tiny_exlm/checkpoints/last --out runs/glue/exlm
    python benchmarks/glue_table.py run --name MLM  --checkpoint runs/text_tiny_mlm/checkpoints/last  --out runs/glue/mlm
    python benchmarks/glue_table.py merge runs/glue/exlm runs/glue/mlm --out benchmarks/results/glue

The schedule follows Table 11's shape (batch 32, 6 % warm-up, median over seeds) with fewer
updates for a 2-core CPU (``CPU_EPOCHS``, ``CPU_MAX_STEPS``), 3 seeds instead of 5 and a
learning rate of 1e-4 (Table 11's 1e-5 to 5e-5 is for 125k-update base models). A run's score
is its end-of-training dev score; the dev split is never used to choose anything.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TASKS = ["RTE", "MRPC", "CoLA", "STS-B", "SST-2"]
CPU_EPOCHS = {"RTE": 2, "MRPC": 2, "CoLA": 1, "STS-B": 1, "SST-2": 1}
CPU_MAX_STEPS = {"SST-2": 300}  # one SST-2 epoch is 2,105 updates at batch 32
LR = 1e-4
BATCH = 32
# Table 3 of the paper, dev, medians of 5 seeds, base models (percent)
PAPER_SCORES = {
    "RoBERTa* base (paper)": (75.5, 88.7, 64.3, 89.5, 93.7),
    "ExLM base (paper)": (78.8, 89.6, 64.6, 90.5, 93.9),
}
PAPER = {name: dict(zip(TASKS, scores, strict=True)) for name, scores in PAPER_SCORES.items()}


def run(args: argparse.Namespace) -> None:
    from smiexlm.glue.finetune import GlueConfig, run_glue, save_result

    for task in args.tasks:
        config = GlueConfig(
            task,
            lr=LR,
            batch_size=BATCH,
            epochs=CPU_EPOCHS[task],
            seeds=tuple(args.seeds),
            max_length=128,
            max_steps=args.max_steps or CPU_MAX_STEPS.get(task),
            max_train_rows=args.max_train_rows,
            max_eval_rows=args.max_eval_rows,
            threads=args.threads,
        )
        result = run_glue(args.checkpoint, config, progress=False)
        result.extra["name"] = args.name
        save_result(result, args.out / f"{result.task}.json")
        seconds = sum(r.seconds for r in result.runs)
        shown = "  ".join(f"{k} {100 * v:.1f}" for k, v in result.median.items())
        print(f"{args.name} {result.task}: {shown} ({seconds:.0f} s)", flush=True)


def _load(folders: list[Path]) -> dict[str, dict[str, dict]]:
    """{backbone name: {task: result dict}}, in the order the folders were given."""
    table: dict[str, dict[str, dict]] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            result = json.loads(path.read_text(encoding="utf-8"))
            table.setdefault(result["extra"]["name"], {})[result["task"]] = result
    return table


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def merge(args: argparse.Namespace) -> None:
    from smiexlm.glue.tasks import get_task

    table = _load(args.folders)
    names = list(table)
    first = next(iter(table.values()))
    majority = {t: first[t]["majority"] for t in TASKS if t in first}
    metric = {t: get_task(t).primary_metric for t in TASKS}

    head = ["task (dev metric)", *names, "majority class", *PAPER]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in TASKS:
        cells = [f"{t} ({metric[t]})"]
        for name in names:
            r = table[name].get(t)
            cells.append(_pct(r["median"].get(metric[t])) if r else "–")
        cells.append(_pct(majority.get(t, {}).get(metric[t])))
        cells += [f"{rows[t]:.1f}" for rows in PAPER.values()]
        lines.append("| " + " | ".join(cells) + " |")

    detail = [
        "| backbone | task | seeds: primary metric | all metrics (median) | updates | seconds |"
    ]
    detail.append("|---|---|---|---|---|---|")
    for name in names:
        for t in TASKS:
            r = table[name].get(t)
            if r is None:
                continue
            per_seed = ", ".join(_pct(run["metrics"].get(metric[t])) for run in r["runs"])
            medians = ", ".join(f"{k} {_pct(v)}" for k, v in r["median"].items())
            steps = r["runs"][0]["steps"]
            seconds = sum(run["seconds"] for run in r["runs"])
            detail.append(f"| {name} | {t} | {per_seed} | {medians} | {steps} | {seconds:.0f} |")

    args.out.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n\nPer seed:\n\n" + "\n".join(detail) + "\n"
    (args.out / "table.md").write_text(text, encoding="utf-8")
    _plot(table, names, majority, metric, args.out / "glue.png")
    print(text)


def _plot(table, names, majority, metric, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    series = {
        n: [table[n].get(t, {}).get("median", {}).get(metric[t]) for t in TASKS] for n in names
    }
    series["majority class"] = [majority.get(t, {}).get(metric[t]) for t in TASKS]
    series |= {n: [rows[t] / 100 for t in TASKS] for n, rows in PAPER.items()}
    x = np.arange(len(TASKS))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(9, 4.6))
    for i, (name, values) in enumerate(series.items()):
        heights = [np.nan if v is None else 100 * v for v in values]
        ax.bar(x + (i - (len(series) - 1) / 2) * width, heights, width, label=name)
    ax.set_xticks(x, [f"{t}\n({metric[t]})" for t in TASKS])
    ax.set_ylabel("dev score (×100)")
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_title("GLUE dev: tiny text models on a CPU budget vs. the paper's base models")
    ax.set_ylim(min(0, ax.get_ylim()[0]), 100)
    ax.legend(fontsize=8, ncols=3, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="fine-tune one checkpoint on the five dev tasks")
    p.add_argument("--name", required=True)
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tasks", nargs="+", default=TASKS, choices=TASKS)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=None, help="updates per run (a smoke run)")
    p.add_argument("--max-train-rows", type=int, default=None, help="first N training rows")
    p.add_argument("--max-eval-rows", type=int, default=None, help="first N dev rows")
    p.set_defaults(func=run)
    m = sub.add_parser("merge", help="one table and one plot from several run folders")
    m.add_argument("folders", nargs="+", type=Path)
    m.add_argument("--out", type=Path, required=True)
    m.set_defaults(func=merge)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
