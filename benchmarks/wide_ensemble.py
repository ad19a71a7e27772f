"""The wide ensemble (``finetune --ensemble wide``) on the seven-set table, from the campaign's
kept predictions, and what it costs to fine-tune and to serve.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/wide_ensemble.py table --root benchmarks/results/table1 \\
        --out benchmarks/results/ensemble
    python benchmarks/wide_ensemble.py cost --out benchmarks/results/ensemble
    python benchmarks/wide_ensemble.py kernels --sets bace bbbp clintox sider tox21

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

``kernels``: the classification kernel members' cells (an SVC a label on each kernel of
:mod:`smiexlm.forests.kernels`, fitted on each (set, seed)'s training rows), which ``table
--kernels ROOT`` adds as rows beside the default and the wide ensemble, each with its paired
bootstrap (``ensemble.md``, "Kernel members for classification").

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
#: rows with the classification kernel members (``kernels``), read with ``--kernels ROOT``
KERNEL_ROWS = {
    "the default + SVC-Tanimoto": (["default", "rf_rdkit2d", "svc_tanimoto"], None),
    "the default + SVC-both": (["default", "rf_rdkit2d", "svc_both"], None),
    "wide + SVC-Tanimoto": ([*WIDE.values(), "svc_tanimoto"], None),
    "wide + SVC-both": ([*WIDE.values(), "svc_both"], None),
    "wide + SVC-Tanimoto, -RBF, -both": (
        [*WIDE.values(), "svc_tanimoto", "svc_rbf", "svc_both"],
        None,
    ),
    "the three SVCs": (["svc_tanimoto", "svc_rbf", "svc_both"], None),
}
#: (A, B) pairs of rows a paired bootstrap compares
PAIRS = [(WIDE_ROW, SERVED)]
KERNEL_PAIRS = [
    ("the default + SVC-Tanimoto", SERVED),
    ("the default + SVC-both", SERVED),
    ("wide + SVC-Tanimoto", WIDE_ROW),
    ("wide + SVC-both", WIDE_ROW),
]


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


def _figure(value: float, spec: str) -> str:
    """``value`` formatted, or "n/a" where a cell kept no record of it."""
    return "n/a" if np.isnan(value) else format(value, spec)


def _std(values: list[float]) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def _bootstrap(a: str, b: str, args, labels: dict, tests: dict, small: list[str]) -> list[str]:
    """The lines of a paired bootstrap of row ``a`` against row ``b``, set by set and over
    the sets."""
    from smiexlm.moleculenet.compare import mean_over_sets, paired_bootstrap

    lines = ["", f"Paired bootstrap of {a} (A) against {b} (B): {args.draws:,} draws of each "
             "set's test molecules, 95 % intervals.", "",
             "| set | A | B | A − B | interval | draws with A better |", "|---|---|---|---|---|---|"]  # fmt: skip
    parts = []
    for s in args.sets:
        d = paired_bootstrap("classification", labels[s], tests[a][s], tests[b][s], args.draws)
        parts.append(d)
        lines.append(f"| {s} | {100 * d.a:.1f} | {100 * d.b:.1f} | {100 * d.diff:+.1f} | "
                     f"[{100 * d.low:+.1f}, {100 * d.high:+.1f}] | {100 * d.a_better:.0f} % |")  # fmt: skip
    for name, group in ((f"the {len(small)} small sets",
                         [p for s, p in zip(args.sets, parts, strict=True) if s in small]),
                        (f"all {len(parts)} sets", parts)):  # fmt: skip
        if not group:
            continue
        d = mean_over_sets(group, True)
        lines.append(f"| mean of {name} | {100 * d.a:.1f} | {100 * d.b:.1f} | {100 * d.diff:+.1f} | "
                     f"[{100 * d.low:+.1f}, {100 * d.high:+.1f}] | {100 * d.a_better:.0f} % |")  # fmt: skip
    return lines


def table(args: argparse.Namespace) -> None:
    from smiexlm.forests.blend import blend_members
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.moleculenet.metrics import score

    table_rows = ROWS | (KERNEL_ROWS if args.kernels else {})
    pairs = PAIRS + (KERNEL_PAIRS if args.kernels else [])
    figures = {name: {} for name in table_rows}  # row -> set -> [test per seed]
    valid_figures = {name: {} for name in table_rows}
    seconds = {name: {} for name in table_rows}
    served_tests: dict[str, dict[str, list]] = {name: {} for name in table_rows}
    labels = {}
    for set_name in args.sets:
        task = load_task(set_name)
        for seed in args.seeds:
            cells = {}
            for row in {r for rows, _ in table_rows.values() for r in rows}:
                where = args.kernels / row if row.startswith("svc_") else args.root / row
                cells[row] = _cell(getattr(args, row, None) or where, task, seed)
            if set_name == "toxcast" and args.with_toxcast_forest is not None:
                cells["rf_rdkit2d@served"] = _cell(args.with_toxcast_forest, task, seed)
            rows = cells["default"][0]["test_rows"]
            labels[set_name] = task.labels[rows]
            for name, (members, weights) in table_rows.items():
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
    for name in table_rows:
        lines.append(f"| {name} | " + " | ".join(cell(name, s) for s in args.sets)
                     + f" | {mean([np.mean(figures[name][s]) for s in small])}"
                     f" | {mean([np.mean(figures[name][s]) for s in args.sets])}"
                     f" | {mean([np.mean(valid_figures[name][s]) for s in args.sets])} |")  # fmt: skip
    for a, b in pairs:
        lines += _bootstrap(a, b, args, labels, served_tests, small)
    lines += ["", "One-thread seconds of fine-tuning a seed, as the cells recorded them (mean over "
              "the seeds that kept a record; a fine-tuning cell's `train_cpu_seconds`, a forest "
              "cell's wall seconds):", "",
              "| served | " + " | ".join(args.sets) + " | total | × the default's blend |",
              "|---|" + "---|" * (len(args.sets) + 2)]  # fmt: skip

    def secs(name: str, s: str) -> float:  # cells that kept no record are left out
        kept = [v for v in seconds[name][s] if not np.isnan(v)]
        return float(np.mean(kept)) if kept else float("nan")

    base = sum(secs(SERVED, s) for s in args.sets)
    for name in table_rows:
        total = sum(secs(name, s) for s in args.sets)
        lines.append(f"| {name} | " + " | ".join(_figure(secs(name, s), ",.0f") for s in args.sets)
                     + f" | {_figure(total, ',.0f')} | {_figure(total / base, '.2f')} |")  # fmt: skip
    lines += ["", f"`python benchmarks/wide_ensemble.py {' '.join(sys.argv[1:])}`"]
    write_table(
        args.out, "table", lines, {"test": figures, "valid": valid_figures, "seconds": seconds}
    )


def kernels(args: argparse.Namespace) -> None:
    """Cells of the classification kernel members
    (:func:`smiexlm.forests.kernels.fit_kernel_member`, on the training rows of each (set,
    seed) of the default's row, ``--default`` or ``ROOT/default``): their validation and test
    decision values as ``OUT/svc_<kind>/<set>/seed<k>/predictions.npz``, and a
    ``result.json`` with the chosen setting, its out-of-fold ROC-AUC and the one-thread
    seconds of the fit (ECFP4 and the embedding included). A (set, kind) done is read back."""
    import pandas as pd
    from potency_members import embedding

    from smiexlm.chemistry.fingerprints import morgan_fingerprints
    from smiexlm.forests.kernels import KernelInputs, fit_kernel_member
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.moleculenet.runs import write_predictions
    from smiexlm.moleculenet.splits import Split, murcko_scaffolds

    for set_name in args.sets:
        task = load_task(set_name)
        texts = [s.strip() for s in task.smiles]
        inputs, fitted, groups_of = None, {}, {}  # keyed by the split's rows: seeds share one
        for seed in args.seeds:
            kept, _ = _cell(args.default or args.root / "default", task, seed)
            valid, test = kept["valid_rows"], kept["test_rows"]
            train = np.setdiff1d(np.arange(len(task)), np.concatenate([valid, test]))
            for kind in args.kinds:
                folder = args.out_root / f"svc_{kind}" / set_name / f"seed{seed}"
                if (folder / "result.json").is_file():
                    continue
                split_rows = (valid.tobytes(), test.tobytes())
                key = (kind, *split_rows)
                if key not in fitted:
                    t0 = time.process_time()
                    if inputs is None:
                        inputs = KernelInputs(morgan_fingerprints(texts), embedding(task))
                    if split_rows not in groups_of:  # the scaffold ids of the training rows
                        scaffolds = murcko_scaffolds([texts[i] for i in train])
                        groups_of[split_rows] = pd.factorize(pd.Series(scaffolds).fillna(""))[0]
                    groups = groups_of[split_rows]
                    member, _ = fit_kernel_member(kind, inputs.take(train), task.labels[train],
                                                  groups, "classification")  # fmt: skip
                    scores = {p: member.predict(inputs.take(rows))
                              for p, rows in (("valid", valid), ("test", test))}  # fmt: skip
                    record = {"model": f"SVC-{kind}", "dataset": set_name,
                              "wall_s": time.process_time() - t0, "config": {}} | member.record()  # fmt: skip
                    fitted[key] = scores, record
                    print(f"{set_name} svc_{kind}: C={member.C:g} gamma={member.gamma} cv ROC-AUC "
                          f"{member.cv_score:.4f}, {record['wall_s']:.0f} CPU s", flush=True)  # fmt: skip
                scores, record = fitted[key]
                folder.mkdir(parents=True, exist_ok=True)
                write_predictions(folder, Split("scaffold", None, list(train), list(valid), list(test)),
                                  scores["valid"], scores["test"])  # fmt: skip
                (folder / "result.json").write_text(
                    json.dumps({"result": record | {"seed": seed}}, indent=1)
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
    p_table.add_argument(
        "--kernels",
        type=Path,
        default=None,
        metavar="ROOT",
        help="add the rows with the kernel members' cells of ROOT (`kernels`)",
    )
    p_table.add_argument("--out", type=Path, required=True)
    p_kernels = sub.add_parser("kernels", help="cells of the kernel members (SVC)")
    p_kernels.add_argument("--root", type=Path, default=Path("benchmarks/results/table1"))
    p_kernels.add_argument("--sets", nargs="+", default=SMALL)
    p_kernels.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    p_kernels.add_argument("--default", type=Path, default=None, metavar="ROW")
    p_kernels.add_argument("--kinds", nargs="+", default=["tanimoto", "rbf", "both"])
    p_kernels.add_argument("--out-root", type=Path, default=Path("runs/kernels"))
    p_cost = sub.add_parser("cost", help="predict's cost per 1,000 molecules, default vs wide")
    p_cost.add_argument("--task", default="bbbp")
    p_cost.add_argument("--molecules", type=int, default=1000)
    p_cost.add_argument("--forest-trees", type=int, default=500)
    p_cost.add_argument("--max-train-steps", type=int, default=20)
    p_cost.add_argument("--workdir", type=Path, default=Path("runs/wide_cost"))
    p_cost.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    {"table": table, "kernels": kernels, "cost": cost}[args.command](args)


if __name__ == "__main__":
    main()
