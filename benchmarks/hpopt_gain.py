"""What ``smiexlm hpopt`` gains over the Table 8 row: for each set, the search at a stated
budget, then the seeds fine-tuned with its ``best.toml`` and with the Table 8 row, validation
and test, mean ± sample std.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/hpopt_gain.py --tasks bace bbbp --trials 20 --out runs/hpopt_gain

Everything resumes when run again: the study in ``OUT/<set>/search/`` goes on to the budget,
and each fine-tuning run is a run folder (``run_finetune(..., run_root=..., resume=True)``):
``OUT/<set>/table8/`` and ``OUT/<set>/best<k>/`` (k the best trial, so that a search that
finds a better one after a resume gets fresh runs; when the best trial is Table 8's row,
which the search tries first, its seeds are the Table 8 runs). ``--table8-runs`` takes the
Table 8 runs from another run root instead, such as the campaign's row of the same backbone
(``benchmarks/results/table1/default/runs``): its finished cells are read back when they were
made with the same settings (and refused otherwise), the missing ones run there.
``OUT/gain.md`` is rewritten after each set. The search selects on validation only; the test columns are the first look at test.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from pathlib import Path


def _mean(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def _mean_std(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "–"
    mean = _mean(values)
    std = (
        math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        if len(values) > 1
        else 0.0
    )
    return f"{mean:.2f} ± {std:.2f}"


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def _train_cpu(results) -> float:
    return sum(float(r.config.get("train_cpu_seconds", 0.0)) for r in results)


def one_set(task_name: str, args: argparse.Namespace) -> tuple[list[str], dict]:
    """The search, then both configs' seeds: this set's table rows, and for "Table 8" and
    "hpopt" the (valid, test) means over the seeds."""
    from smiexlm.finetuning.adapter import run_finetune, with_backbone_blocks
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.config import finetune_config
    from smiexlm.hpopt.config import HpoptConfig
    from smiexlm.hpopt.run import run_hpopt
    from smiexlm.moleculenet.loaders import load_task

    task, backbone, root = load_task(task_name), Backbone(args.checkpoint), args.out / task_name
    # the network alone, as the search scores it: what the search gains, not a forest
    fixed = dict(split=args.split, max_train_steps=args.max_train_steps, device="cpu",
                 forest="none")  # fmt: skip
    base = finetune_config(task_name, **fixed)
    hp = HpoptConfig(args.trials, args.cpu_minutes, args.search_seed)
    found = run_hpopt(task, base, root / "search", hp, backbone, on_trial=print,
                      command=f"hpopt_gain.py ({task_name})")  # fmt: skip
    if found.best_config is None:
        return [f"| {task_name} | no trial completed | – | – | {found.counted} | – |"], {}
    best = finetune_config(task_name, config_file=root / "search" / "best.toml", device="cpu",
                           forest="none")  # fmt: skip
    table8_runs = args.table8_runs or root / "table8" / "runs"
    # the search's first trial is Table 8's row: when it wins, its seeds are that row's
    same = with_backbone_blocks(best, backbone) == with_backbone_blocks(base, backbone)
    best_runs = table8_runs if same else root / f"best{found.best_number}" / "runs"
    best_name = f"hpopt (trial {found.best_number}{', Table 8 itself' if same else ''})"
    rows, means = [], {}
    for name, cfg, runs in (("Table 8", base, table8_runs), (best_name, best, best_runs)):
        results = run_finetune(task, cfg, backbone, args.seeds, progress=False, run_root=runs,
                               resume=True)  # fmt: skip
        search = f"{found.counted} trials, {found.cpu_seconds / 60:.1f}" if cfg is best else "–"
        valid, test = [r.valid for r in results], [r.test for r in results]
        rows.append(f"| {task_name} | {name} | {_mean_std(valid)} | {_mean_std(test)} | "
                    f"{search} | {_train_cpu(results) / 60:.1f} |")  # fmt: skip
        means["Table 8" if cfg is base else "hpopt"] = (_mean(valid), _mean(test))
        print(f"{task_name} {name}: valid {_mean_std(valid)}, test {_mean_std(test)}")
    return rows, means


def mean_rows(means: dict[str, dict]) -> list[str]:
    """The mean over the sets where both configs finished, one row a config (none for a
    single set)."""
    done = [m for m in means.values() if m]
    if len(done) < 2:
        return []
    return [f"| mean of {len(done)} | {name} | {_mean([m[name][0] for m in done]):.2f} | "
            f"{_mean([m[name][1] for m in done]):.2f} | – | – |"
            for name in ("Table 8", "hpopt")]  # fmt: skip


def write_table(out: Path, rows: list[str], args: argparse.Namespace) -> str:
    from smiexlm.atomic import write_text_atomic

    budget = " and ".join(f"{k} {v}" for k, v in (("--trials", args.trials),
                          ("--cpu-minutes", args.cpu_minutes)) if v is not None)  # fmt: skip
    text = "\n".join([
        "# hpopt against Table 8", "",
        f"`python benchmarks/hpopt_gain.py {' '.join(sys.argv[1:])}`", "",
        f"Search budget per set: {budget} (search seed {args.search_seed}; trials fine-tune "
        f"one seed on train and select on valid); then seeds {' '.join(map(str, args.seeds))} "
        f"with each config, split {args.split}"
        + (f", at most {args.max_train_steps} updates a run" if args.max_train_steps else "")
        + f". ROC-AUC x 100 (RMSE for regression); CPU: {cpu_name()}.",
        "", "| set | config | valid | test | search (trials, CPU min) | fine-tune CPU min |",
        "|---|---|---|---|---|---|", *rows, "",
    ])  # fmt: skip
    write_text_atomic(out / "gain.md", text)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=["bace", "bbbp"])
    parser.add_argument("--trials", type=int, default=None, help="search budget in trials")
    parser.add_argument("--cpu-minutes", type=float, default=None, help="search budget in CPU min")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--search-seed", type=int, default=0)
    parser.add_argument("--split", default="scaffold")
    parser.add_argument("--max-train-steps", type=int, default=None, help="quick runs only")
    parser.add_argument("--checkpoint", default=None, help="default: the shipped model")
    parser.add_argument("--out", type=Path, default=Path("runs/hpopt_gain"))
    parser.add_argument("--table8-runs", type=Path, default=None,
                        help="run root of the Table 8 runs (default OUT/<set>/table8/runs)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.trials is None and args.cpu_minutes is None:
        args.trials = 20
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rows: list[str] = []
    means: dict[str, dict] = {}
    for task in args.tasks:
        task_rows, means[task] = one_set(task, args)
        rows += task_rows
        text = write_table(args.out, rows + mean_rows(means), args)
    print(text)


if __name__ == "__main__":
    main()
