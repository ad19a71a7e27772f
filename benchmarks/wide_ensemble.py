"""The wide ensemble (``finetune --ensemble wide``) on the seven-set table, from the campaign's
kept predictions, and what it costs to fine-tune and to serve.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/wide_ensemble.py table --root benchmarks/results/table1 \\
        --out benchmarks/results/ensemble
    python benchmarks/wide_ensemble.py cost --out benchmarks/results/ensemble

``table``: for each set and seed, the members' rows of ``--root`` (``default``,
``default_rdkit2d``, ``rf_rdkit2d``, ``rf_both``, ``rf_ecfp4``: each cell's ``predictions.npz``)
are blended as the ensemble's folder serves them
(:func:`smiexlm.forests.blend.blend_members`: each member's quantiles among its own
validation scores, equal weights) and scored on test, beside the default alone, the blend
``finetune`` serves by default (the default with RF-RDKit2D, weight 0.5), the ensemble
without RF-ECFP4 and the three forests' own ensemble. No choice is made on test. Then a
paired bootstrap (:mod:`smiexlm.moleculenet.compare`) of the wide ensemble against the
default's blend, set by set and over the seven, and each row's one-thread seconds as its cells
recorded them (a fine-tuning cell's ``train_cpu_seconds``, a forest cell's wall seconds:
features and fit). ``--with-toxcast-forest ROOT`` reads ToxCast's RF-RDKit2D of the default's
blend from ``ROOT`` (the forest of 162 trees a label that ``finetune`` keeps, see
``forest_cost.md``) instead of the 500-tree row. Writes ``table.md`` and ``table.json``.

``cost``: one short fine-tuning of each kind on BBBP (``--max-train-steps``, forests of 500
trees, as the defaults keep them), then ``predict`` of ``--molecules`` of its molecules by the
default's folder and by the wide ensemble's, each timed in this process (one thread): the
serving cost per 1,000 molecules side by side. Writes ``cost.md`` and ``cost.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forest_blend import write_table  # noqa: E402

SETS = ["bace", "bbbp", "clintox", "sider", "tox21", "toxcast", "muv"]
SMALL = SETS[:4]
SEEDS = (0, 1, 2)
#: member rows of the table's root, in the ensemble's order (smiexlm.finetuning.ensemble)
WIDE = {"model": "default", "model_rdkit2d": "default_rdkit2d", "rf_rdkit2d": "rf_rdkit2d",
        "rf_both": "rf_both", "rf_ecfp4": "rf_ecfp4"}  # fmt: skip
ROWS = {
    "the default alone": (["default"], None),
    "the default + RF-RDKit2D (what `finetune` serves)": (["default", "rf_rdkit2d"], [0.5, 0.5]),
    "wide without RF-ECFP4": (["default", "default_rdkit2d", "rf_rdkit2d", "rf_both"], None),
    "wide (`--ensemble wide`)": (list(WIDE.values()), None),
    "the three forests": (["rf_rdkit2d", "rf_both", "rf_ecfp4"], None),
}
SERVED, WIDE_ROW = list(ROWS)[1], list(ROWS)[3]


def _cell(row: Path, task, seed: int) -> tuple[dict, dict]:
    """(kept predictions, result record) of one cell of the row folder ``row``
    (``row/runs/<set>/seed<k>/``, or ``row/<set>/seed<k>/`` as forest_blend.py keeps forests)."""
    from smiexlm.moleculenet.runs import RESULT_NAME, cells_root, read_predictions, run_dir

    folder = run_dir(cells_root(row), task.name, seed)
    path = folder / RESULT_NAME  # forest_blend.py keeps a forest's scores alone
    record = json.loads(path.read_text(encoding="utf-8"))["result"] if path.is_file() else None
    return read_predictions(folder, task), record


def _seconds(record: dict | None) -> float:
    """A cell's one-thread seconds; NaN for a cell that kept no record."""
    if record is None:
        return float("nan")
    cpu = record["config"].get("train_cpu_seconds")
    return float(record["wall_s"] if record["model"].startswith("RF-") or cpu is None else cpu)


def _std(values: list[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def table(args: argparse.Namespace) -> None:
    from smiexlm.forests.blend import blend_members
    from smiexlm.moleculenet.compare import mean_over_sets, paired_bootstrap
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.moleculenet.metrics import score

    figures = {name: {} for name in ROWS}  # row -> set -> [test per seed]
    valid_figures = {name: {} for name in ROWS}
    seconds = {name: {} for name in ROWS}
    served_tests: dict[str, dict[str, list]] = {name: {} for name in ROWS}
    labels = {}
    for set_name in args.sets:
        task = load_task(set_name)
        for seed in args.seeds:
            cells = {}
            for row in {r for rows, _ in ROWS.values() for r in rows}:
                cells[row] = _cell(getattr(args, row) or args.root / row, task, seed)
            if set_name == "toxcast" and args.with_toxcast_forest is not None:
                cells["rf_rdkit2d@served"] = _cell(args.with_toxcast_forest, task, seed)
            rows = cells["default"][0]["test_rows"]
            labels[set_name] = task.labels[rows]
            for name, (members, weights) in ROWS.items():
                picked = [("rf_rdkit2d@served" if name == SERVED and m == "rf_rdkit2d"
                           and "rf_rdkit2d@served" in cells else m) for m in members]  # fmt: skip
                kept = [cells[m][0] for m in picked]
                for k in kept:
                    if not np.array_equal(k["test_rows"], rows):
                        raise SystemExit(f"{set_name} seed {seed}: the rows' test molecules differ")
                valids = [k["valid"] for k in kept]
                test = blend_members(task.task_type, valids, [k["test"] for k in kept], weights)
                valid = blend_members(task.task_type, valids, valids, weights)
                y_valid = task.labels[kept[0]["valid_rows"]]
                figures[name].setdefault(set_name, []).append(100 * score(task.task_type, labels[set_name], test).mean)  # fmt: skip
                valid_figures[name].setdefault(set_name, []).append(100 * score(task.task_type, y_valid, valid).mean)  # fmt: skip
                seconds[name].setdefault(set_name, []).append(sum(_seconds(cells[m][1]) for m in picked))  # fmt: skip
                served_tests[name].setdefault(set_name, []).append(test)
        print(f"{set_name}: " + ", ".join(f"{n} {np.mean(f[set_name]):.1f}" for n, f in figures.items()), flush=True)  # fmt: skip

    small = [s for s in SMALL if s in args.sets]

    def mean(values: list[float]) -> str:
        return f"{np.mean(values):.1f}"

    def cell(name: str, s: str) -> str:
        v = figures[name][s]
        return f"{np.mean(v):.1f} ± {_std(v):.1f}"

    lines = ["# The wide ensemble on MoleculeNet's seven sets", "",
             f"Test ROC-AUC x 100, scaffold split, mean ± sample std over seeds {args.seeds}; each "
             "member's scores replaced by their quantiles among its own validation scores, then "
             "averaged (equal weights unless said); no choice made on test.", "",
             "| served | " + " | ".join(args.sets) + f" | {len(small)} small sets | {len(args.sets)} sets | valid, {len(args.sets)} sets |",
             "|---|" + "---|" * (len(args.sets) + 3)]  # fmt: skip
    for name in ROWS:
        lines.append(f"| {name} | " + " | ".join(cell(name, s) for s in args.sets)
                     + f" | {mean([np.mean(figures[name][s]) for s in small])}"
                     f" | {mean([np.mean(figures[name][s]) for s in args.sets])}"
                     f" | {mean([np.mean(valid_figures[name][s]) for s in args.sets])} |")  # fmt: skip
    lines += ["", "Paired bootstrap of the wide ensemble (A) against what `finetune` serves (B): "
              f"{args.draws:,} draws of each set's test molecules, 95 % intervals.", "",
              "| set | A | B | A − B | interval | draws with A better |", "|---|---|---|---|---|---|"]  # fmt: skip
    parts = []
    for s in args.sets:
        d = paired_bootstrap("classification", labels[s], served_tests[WIDE_ROW][s],
                             served_tests[SERVED][s], args.draws)  # fmt: skip
        parts.append(d)
        lines.append(f"| {s} | {100 * d.a:.1f} | {100 * d.b:.1f} | {100 * d.diff:+.1f} | "
                     f"[{100 * d.low:+.1f}, {100 * d.high:+.1f}] | {100 * d.a_better:.0f} % |")  # fmt: skip
    for name, group in ((f"the {len(small)} small sets",
                         [p for s, p in zip(args.sets, parts, strict=True) if s in small]),
                        (f"all {len(parts)} sets", parts)):  # fmt: skip
        d = mean_over_sets(group, True)
        lines.append(f"| mean of {name} | {100 * d.a:.1f} | {100 * d.b:.1f} | {100 * d.diff:+.1f} | "
                     f"[{100 * d.low:+.1f}, {100 * d.high:+.1f}] | {100 * d.a_better:.0f} % |")  # fmt: skip
    lines += ["", "One-thread seconds of fine-tuning a seed, as the cells recorded them (mean over "
              "the seeds that kept a record; a fine-tuning cell's `train_cpu_seconds`, a forest "
              "cell's wall seconds):", "",
              "| served | " + " | ".join(args.sets) + " | total | × the default's blend |",
              "|---|" + "---|" * (len(args.sets) + 2)]  # fmt: skip

    def secs(name: str, s: str) -> float:  # cells that kept no record are left out
        kept = [v for v in seconds[name][s] if not np.isnan(v)]
        return float(np.mean(kept)) if kept else float("nan")

    base = sum(secs(SERVED, s) for s in args.sets)
    for name in ROWS:
        total = sum(secs(name, s) for s in args.sets)
        lines.append(f"| {name} | " + " | ".join(f"{secs(name, s):,.0f}" for s in args.sets)
                     + f" | {total:,.0f} | {total / base:.2f} |")  # fmt: skip
    lines += ["", f"`python benchmarks/wide_ensemble.py {' '.join(sys.argv[1:])}`"]
    write_table(
        args.out, "table", lines, {"test": figures, "valid": valid_figures, "seconds": seconds}
    )


def cost(args: argparse.Namespace) -> None:
    """Serving cost per 1,000 molecules of the default's folder and of the wide ensemble's."""
    import torch

    from smiexlm.finetuning.adapter import run_finetune
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.config import finetune_config
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.serving.prediction import predict

    torch.set_num_threads(1)
    task = load_task(args.task)
    work = args.workdir
    folders, fit_seconds = {}, {}
    for name, ensemble in (("default", "none"), ("wide", "wide")):
        cfg = finetune_config(args.task, max_train_steps=args.max_train_steps, ensemble=ensemble,
                              forest_trees=args.forest_trees)  # fmt: skip
        folders[name] = work / name / "seed0"
        if not folders[name].is_dir():
            c0 = time.process_time()
            run_finetune(task, cfg, Backbone(), [0], work / name, progress=False)
            fit_seconds[name] = time.process_time() - c0
    smiles = list(task.smiles[: args.molecules])
    predict(folders["default"], smiles[:8])  # warm: imports, the first graph
    seconds = {}
    for name, folder in folders.items():
        c0 = time.process_time()
        predict(folder, smiles)
        seconds[name] = time.process_time() - c0
    per = {name: 1000 * s / len(smiles) for name, s in seconds.items()}
    lines = [f"# Serving cost: `predict` of {task.name} molecules, one thread", "",
             "| folder | CPU s per 1,000 molecules | × the default's |", "|---|---|---|",
             *(f"| {n} | {per[n]:.1f} | {per[n] / per['default']:.2f} |" for n in per), "",
             f"{len(smiles):,} molecules, the folders fine-tuned {args.max_train_steps} steps "
             f"(the cost of serving does not depend on it), forests of {args.forest_trees} trees "
             "(the default's on a set of up to 200 labels).", "", f"`python benchmarks/wide_ensemble.py {' '.join(sys.argv[1:])}`"]  # fmt: skip
    write_table(args.out, "cost", lines, {"per_1000": per, "molecules": len(smiles),
                                          "fit_cpu_seconds": fit_seconds})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_table = sub.add_parser("table", help="the ensemble's rows from the table's kept predictions")
    p_table.add_argument("--root", type=Path, default=Path("benchmarks/results/table1"))
    p_table.add_argument("--sets", nargs="+", default=SETS)
    p_table.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    for row in {r for rows, _ in ROWS.values() for r in rows}:
        p_table.add_argument(f"--{row.replace('_', '-')}", dest=row, type=Path, default=None,
                             metavar="ROW", help=f"the {row} row (default: ROOT/{row})")  # fmt: skip
    p_table.add_argument("--draws", type=int, default=1000)
    p_table.add_argument("--with-toxcast-forest", type=Path, default=None, metavar="ROOT")
    p_table.add_argument("--out", type=Path, required=True)
    p_cost = sub.add_parser("cost", help="predict's cost per 1,000 molecules, default vs wide")
    p_cost.add_argument("--task", default="bbbp")
    p_cost.add_argument("--molecules", type=int, default=1000)
    p_cost.add_argument("--forest-trees", type=int, default=500)
    p_cost.add_argument("--max-train-steps", type=int, default=20)
    p_cost.add_argument("--workdir", type=Path, default=Path("runs/wide_cost"))
    p_cost.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    {"table": table, "cost": cost}[args.command](args)


if __name__ == "__main__":
    main()
