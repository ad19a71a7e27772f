"""The ExLM paper's Table 1 on a CPU: backbones, probes and forests x 7 sets x 3 seeds.

Every (set, seed) is a cell with a folder of its own, ``OUT/runs/<set>/seed<k>/``: a
fine-tuning cell keeps its state there after every epoch and goes on from it when run
again; a finished cell (``result.json``) is read back, never redone. So every command below
can be stopped at any moment and started again, and the whole table can be run in as many parts as the time allows.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/moleculenet_table.py run --name ExLM --checkpoint exlm --out runs/mn/exlm
    python benchmarks/moleculenet_table.py probe --out runs/mn/probe
    python benchmarks/moleculenet_table.py baseline --features rdkit2d --out runs/mn/rf_rdkit2d
    python benchmarks/moleculenet_table.py merge runs/mn/* --out runs/mn/report

``campaign`` runs the whole plan (:data:`PLAN`, cell by cell, cheapest rows first and
the shipped default last) into ``--root``, one folder per row, and merges the report after
each cell: ``python benchmarks/moleculenet_table.py campaign --root benchmarks/results/table1``.

Every fine-tuning row runs Table 8's schedule as shipped (with the project's class weights
for ToxCast and MUV, in their configs). Model selection is by validation ROC-AUC per epoch;
the test split is never used for a choice.

``compare`` says how sure a difference between two rows is, from their kept test predictions:
a paired bootstrap over each set's test molecules (:mod:`smiexlm.moleculenet.compare`), e.g.
``python benchmarks/moleculenet_table.py compare benchmarks/results/table1/exlm
benchmarks/results/table1/mlm --tasks tox21 toxcast``. A row is a folder holding
``runs/<set>/seed<k>/`` with its predictions, or ``<set>/seed<k>/`` (the forests
``forest_blend.py`` keeps). ``--measure pr_auc`` compares PR-AUC instead of the score.

``compact ROW`` writes beside each finished cell's ``predictions.npz`` (float32, not committed)
its float16 copy ``predictions.parquet`` (:mod:`smiexlm.moleculenet.score_store`), which is what
``benchmarks/results/`` commits; ``--skip toxcast`` leaves a set out (ToxCast's 617 labels
take 1.7 MB a cell: its scores are made again by the cell's command).

Every cell records, beside its ROC-AUC, the test PR-AUC (average precision) and the share of
positives it should be read against (MAE, R² and Spearman's rho for a regression set);
``measures --root ROOT`` adds them to cells finished before they were recorded, from the
predictions those kept.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

TASKS = ["bace", "bbbp", "clintox", "sider", "tox21", "toxcast", "muv"]

VARIANTS = {  # --variant: FinetuneConfig overrides and what the backbone is
    "finetune": {},
    "frozen": {"freeze": True},
    "hybrid-ecfp4": {"features": "ecfp4"},
    "hybrid-rdkit2d": {"features": "rdkit2d"},
    "hybrid-both": {"features": "both"},
    "random-init": {},
}

# The campaign's rows: folder -> (command, row name, options); the cell order is PLAN's.
ROWS = {
    "rf_ecfp4": ("baseline", "RF-ECFP4 (500 trees)", {"features": "ecfp4"}),
    "rf_rdkit2d": ("baseline", "RF-RDKit2D (500 trees)", {"features": "rdkit2d"}),
    "rf_both": ("baseline", "RF-ECFP4+RDKit2D (500 trees)", {"features": "both"}),
    # The twins test the paper's ExLM-vs-MLM claim, so they keep its unweighted loss everywhere.
    "exlm": (
        "run",
        "ExLM twin (tiny, 101M tokens), fine-tuned",
        {"checkpoint": "exlm", "class_weight": "none"},
    ),
    "mlm": (
        "run",
        "MLM twin (tiny, 101M tokens), fine-tuned",
        {"checkpoint": "mlm", "class_weight": "none"},
    ),
    "default_probe": (
        "probe",
        "default (tiny MTR, 101M tokens), linear probe of its own embedding",
        {"whiten": True},
    ),
    "default": (
        "run",
        "default (tiny MTR, 101M tokens), fine-tuned, head on its last three blocks",
        {},
    ),
    "default_rdkit2d": (
        "run",
        "default (tiny MTR, 101M tokens) + RDKit 2D, fine-tuned, head on its last three blocks",
        {"variant": "hybrid-rdkit2d"},
    ),
}
FORESTS = ("rf_ecfp4", "rf_rdkit2d", "rf_both")
PLAN = (  # (row, tasks), cheapest first and the shipped default last (it may change)
    [(row, [t for t in TASKS if t != "toxcast"]) for row in FORESTS]  # about an hour
    + [(row, ["tox21"]) for row in ("exlm", "mlm")]
    + [(row, ["toxcast"]) for row in FORESTS]  # 617 forests a seed: ~40 min each
    + [(row, ["toxcast"]) for row in ("exlm", "mlm")]
    + [("default_probe", TASKS)]
    + [(row, [task]) for task in TASKS for row in ("default", "default_rdkit2d")]
    + [(row, ["muv"]) for row in ("exlm", "mlm")]
)


def _cells(out: Path, task: str, seeds: list[int]):
    """(results already in ``out``, seeds still to run) for one set."""
    from smiexlm.moleculenet import runs

    done = [runs.finished(runs.run_dir(out / "runs", task, s)) for s in seeds]
    return [r for r in done if r is not None], [
        s for s, r in zip(seeds, done, strict=True) if r is None
    ]


def _keep(out: Path, name: str):
    """A callback that renames a result to the row's name and writes it as its cell."""
    from smiexlm.moleculenet import runs

    def keep(result) -> None:
        result.model = name
        runs.finish(runs.run_dir(out / "runs", result.dataset, result.seed), result)

    return keep


def _report(out: Path, name: str) -> None:
    from smiexlm.moleculenet import runs
    from smiexlm.moleculenet.report import write_report

    if runs.is_main():
        write_report(read_cells(out), out, f"MoleculeNet, {name}")


def read_cells(out: Path) -> list:
    """Every finished cell of a row folder, in set and seed order."""
    from smiexlm.moleculenet import runs

    folders = sorted((out / "runs").glob("*/seed*/"))
    cells = [runs.finished(f) for f in folders]
    order = {t: i for i, t in enumerate(TASKS)}
    return sorted(
        (c for c in cells if c is not None), key=lambda c: (order.get(c.dataset, 99), c.seed)
    )


def run(args: argparse.Namespace) -> None:
    import torch

    from smiexlm.finetuning.adapter import run_finetune, with_backbone_blocks
    from smiexlm.moleculenet import runs
    from smiexlm.moleculenet.loaders import load_task

    torch.set_num_threads(args.threads)
    backbone = _run_backbone(args)
    for seed in args.seeds:  # seed-major: an interrupted run still covers every dataset
        for task in args.tasks:
            cfg = _run_config(args, task)
            folder = runs.run_dir(args.out / "runs", task, seed)
            if (done := runs.finished(folder)) is not None:  # kept when made as asked now
                runs.check_settings(done, folder, with_backbone_blocks(cfg, backbone), backbone)
                continue
            start = time.perf_counter()
            (r,) = run_finetune(load_task(task), cfg, backbone, [seed], progress=args.progress,
                                run_root=args.out / "runs", resume=True)  # fmt: skip
            _keep(args.out, args.name)(r)
            print(f"{args.name} {task} seed {seed}: test {r.test:.1f} valid {r.valid:.1f} "
                  f"{r.config['steps']} steps {time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
            _report(args.out, args.name)


def _run_backbone(args: argparse.Namespace):
    """The model ``run`` fine-tunes: ``--checkpoint``, or a random init of ``--preset``."""
    from smiexlm.finetuning.backbone import Backbone

    return Backbone(checkpoint=args.checkpoint, preset=args.preset, objective=args.objective,
                    random_init=args.variant == "random-init")  # fmt: skip


def _run_config(args: argparse.Namespace, task: str):
    """The fine-tuning config ``run`` makes for ``task`` from its options."""
    from smiexlm.finetuning.config import finetune_config

    extra = {"augment": args.augment, "tta": args.tta, "adapt_steps": args.adapt_steps,
             "adapt_lr": args.adapt_lr, "max_train_steps": args.max_train_steps,
             "layers": args.layers, "pooling": args.pooling, "ema_half_life": args.ema_half_life,
             "head_epochs": args.head_epochs, "head_lr": args.head_lr,
             "layer_decay": args.layer_decay, "class_weight": args.class_weight}  # fmt: skip
    extra = {k: v for k, v in extra.items() if v}  # what the options change
    if args.lr_scale is not None:  # the set's own rate, scaled
        extra["lr"] = finetune_config(task).loop.lr * args.lr_scale
    if args.precision != "auto":  # a stopped cell goes on in it (recorded as a change)
        extra["precision"] = args.precision
    # a row is the network fine-tuned alone: forest_blend.py measures it beside forests, and
    # benchmarks/potency_members.py beside the kernel members
    alone = {"forest": "none", "kernels": "none"}
    return finetune_config(task, device="cpu", **alone | VARIANTS[args.variant] | extra)


def probe(args: argparse.Namespace) -> None:
    """The linear probe on the shipped model (or --checkpoint), every task; ``--pooling``
    chooses the embedding, ``--features`` appends ECFP4 and/or RDKit 2D (a hybrid probe)."""
    import torch

    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.probe import ProbeConfig, run_probe
    from smiexlm.moleculenet.loaders import load_task

    torch.set_num_threads(args.threads)
    cfg = ProbeConfig(device="cpu", pooling=args.pooling, features=args.features,
                      whiten=args.whiten, tta=args.tta, layers=args.layers)  # fmt: skip
    for task in args.tasks:
        _, todo = _cells(args.out, task, args.seeds)
        if todo:
            for r in run_probe(load_task(task), Backbone(args.checkpoint), todo, cfg,
                               run_root=args.out / "runs"):  # fmt: skip
                _keep(args.out, args.name)(r)
                print(f"{args.name} {task} seed {r.seed}: test {r.test:.1f} valid {r.valid:.1f}")
            _report(args.out, args.name)


def baseline(args: argparse.Namespace) -> None:
    """A random forest (``--n-trees``, the same on every set) on every task and seed."""
    from smiexlm.forests.baseline import BaselineConfig, run_baseline
    from smiexlm.moleculenet.loaders import load_task

    cfg = BaselineConfig(args.features, n_trees=args.n_trees)
    name = args.name or cfg.model_name
    for task in args.tasks:
        _, todo = _cells(args.out, task, args.seeds)
        if todo:
            run_baseline(load_task(task), todo, cfg, on_result=_keep(args.out, name),
                         run_root=args.out / "runs")  # fmt: skip
            _report(args.out, name)


def merge(args: argparse.Namespace) -> None:
    from smiexlm.moleculenet.report import read_results, write_report

    results = []
    for folder in args.folders:
        cells = read_cells(folder)
        old = folder / "results.json"
        results += cells if cells or not old.is_file() else read_results(old)
    command = "python benchmarks/moleculenet_table.py merge " + " ".join(map(str, args.folders))
    paths = write_report(results, args.out, "MoleculeNet scaffold split, Table 8 schedule", command)
    print("\n".join(str(p) for p in paths.values()))


def campaign(args: argparse.Namespace) -> None:
    """Every cell of :data:`PLAN` not yet in ``--root``, in order; the report after each."""
    for row, tasks in PLAN:
        tasks = [t for t in tasks if not args.tasks or t in args.tasks]
        if (args.rows and row not in args.rows) or not tasks:
            continue
        kind = ROWS[row][0]
        {"run": run, "probe": probe, "baseline": baseline}[kind](_row_args(row, tasks, args))
        folders = [args.root / r for r in ROWS if (args.root / r / "runs").is_dir()]
        merge(argparse.Namespace(folders=folders, out=args.root))


def _row_args(row: str, tasks: list[str], args: argparse.Namespace) -> argparse.Namespace:
    """The options the campaign runs ``row`` with: its command's, as :data:`ROWS` sets them."""
    _, name, options = ROWS[row]
    return argparse.Namespace(
        name=name, out=args.root / row, tasks=tasks, seeds=args.seeds, threads=1,
        checkpoint=options.get("checkpoint"), preset="tiny", objective="mlm",
        variant=options.get("variant", "finetune"),
        progress=args.progress, pooling=None,
        features=options.get("features"), whiten=options.get("whiten", False),
        n_trees=args.n_trees,
        augment=0, tta=0, adapt_steps=0, adapt_lr=None, max_train_steps=None, layers=None,
        ema_half_life=0.0, head_epochs=0, head_lr=None, layer_decay=None, lr_scale=None,
        class_weight=options.get("class_weight"), precision=args.precision,
    )  # fmt: skip


def _differences(row: str, task: str, done, backbones: dict) -> str:
    """How a finished fine-tuning cell of ``row`` differs from what the campaign would make
    now (``setting was -> now``, comma separated), or "" when it does not; forests and probes
    are not checked. ``backbones`` caches each row's model."""
    from smiexlm.finetuning.adapter import with_backbone_blocks
    from smiexlm.moleculenet.runs import setting_differences

    if ROWS[row][0] != "run":
        return ""
    asked = argparse.Namespace(
        root=Path("."), seeds=[], progress=False, n_trees=None, precision="auto"
    )  # the campaign's own, whatever was given
    ns = _row_args(row, [task], asked)
    if row not in backbones:
        backbones[row] = _run_backbone(ns)
    cfg = with_backbone_blocks(_run_config(ns, task), backbones[row])
    diffs = setting_differences(done, cfg, backbones[row])
    return ", ".join(f"{key} {was!r} -> {now!r}" for key, was, now in diffs)


def _cell_state(folder: Path) -> dict | None:
    """What a stopped cell's ``state/`` holds: epochs run and planned, precision, CPU seconds
    so far and the best validation score (fine-tuning); finished forests (a forest seed)."""
    from smiexlm.forests.baseline import PARTIAL_NAME
    from smiexlm.moleculenet.runs import state_dir

    state = state_dir(folder)
    if (doc := _state_doc(folder)) is not None:
        progress = doc["progress"]
        return {"epochs": (progress["epochs_run"], doc["identity"]["loop"]["epochs"]),
                "precision": progress["precision"], "cpu_s": progress.get("cpu_seconds"),
                "best_valid": progress["best_valid"]}  # fmt: skip
    if (state / PARTIAL_NAME).is_file():
        import numpy as np

        with np.load(state / PARTIAL_NAME) as kept:
            return {"forests": int(np.asarray(kept["done"]).sum()), "of": len(kept["done"])}
    return None


def _history(folder: Path) -> list[dict] | None:
    """A fine-tuning cell's epochs: ``history.json`` when it has finished, its state's when it
    is still training; None for a cell without either (not started, a forest or a probe)."""
    import json

    from smiexlm.moleculenet.runs import HISTORY_NAME

    if (folder / HISTORY_NAME).is_file():
        return json.loads((folder / HISTORY_NAME).read_text())["history"]
    doc = _state_doc(folder)
    return None if doc is None else doc["progress"]["history"]


def _state_doc(folder: Path) -> dict | None:
    """A fine-tuning cell's ``state/state.json`` while it trains, else None."""
    import json

    from smiexlm.finetuning.state import STATE_JSON
    from smiexlm.moleculenet.runs import state_dir

    path = state_dir(folder) / STATE_JSON
    return json.loads(path.read_text()) if path.is_file() else None


def curves(args: argparse.Namespace) -> None:
    """Each fine-tuning cell's validation score per epoch, one panel per set and one colour
    per row folder (a line per seed), finished or still training; a PNG at ``--out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from smiexlm.atomic import atomic_path
    from smiexlm.errors import DataError
    from smiexlm.moleculenet import runs

    found = {}  # (set, row, seed) -> [(epoch, valid)]
    for folder in args.folders:
        for task in args.tasks:
            for seed in args.seeds:
                history = _history(runs.run_dir(folder / "runs", task, seed))
                points = [(h["epoch"], 100 * h["valid"]) for h in history or () if "valid" in h]
                if points:
                    found[task, folder.name, seed] = points
    if not found:
        raise DataError(f"no fine-tuning history under {', '.join(map(str, args.folders))} "
                        f"for {', '.join(args.tasks)}, seeds {args.seeds}: expected "
                        "<row>/runs/<set>/seed<k>/history.json or a state")  # fmt: skip
    tasks = [t for t in args.tasks if any(key[0] == t for key in found)]
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.8), squeeze=False)
    colours = {f.name: f"C{i}" for i, f in enumerate(args.folders)}
    for ax, task in zip(axes[0], tasks, strict=True):
        for (t, row, seed), points in sorted(found.items()):
            if t == task:
                epochs, valid = zip(*points, strict=True)
                ax.plot(epochs, valid, color=colours[row], linestyle=("-", "--", ":")[seed % 3],
                        label=f"{row}, seed {seed}")  # fmt: skip
        ax.set(title=task, xlabel="epoch", ylabel="validation score x 100")
        ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(args.out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    print(f"{len(found)} cells: {args.out}")


def status(args: argparse.Namespace) -> None:
    """Every cell of the plan (within ``--rows``/``--tasks``/``--seeds``): finished (its
    test score, precision and CPU seconds), stopped (where, and the CPU time its remaining
    epochs should take at its own pace), or not started; then the counts. A finished
    fine-tuning cell made with other settings than its row's now (a config changed under it)
    says which: the campaign would stop at it."""
    from smiexlm.moleculenet import runs

    lines = ["| row | set | seed | cell | test | precision | CPU s | left, CPU s |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    counts = {"finished": 0, "finished with other settings": 0, "stopped": 0, "not started": 0}
    left_total, backbones = 0.0, {}
    for row, tasks in PLAN:
        if args.rows and row not in args.rows:
            continue
        for task in (t for t in tasks if not args.tasks or t in args.tasks):
            for seed in args.seeds:
                folder = runs.run_dir(args.root / row / "runs", task, seed)
                done, state = runs.finished(folder), _cell_state(folder)
                cells = [row, task, str(seed)]
                if done is not None:
                    cfg = done.config or {}
                    cpu = cfg.get("train_cpu_seconds") or cfg.get("cpu_seconds")
                    diffs = _differences(row, task, done, backbones)
                    what = (
                        f"finished with other settings than now: {diffs}" if diffs else "finished"
                    )
                    cells += [what, f"{done.test:.1f}", str(cfg.get("precision", "–")),
                              "–" if cpu is None else f"{cpu:,.0f}", "–"]  # fmt: skip
                    counts["finished with other settings" if diffs else "finished"] += 1
                elif state is not None and "epochs" in state:
                    (ran, planned), cpu = state["epochs"], state["cpu_s"]
                    left = None if not cpu or not ran else cpu / ran * (planned - ran)
                    left_total += left or 0.0
                    where = f"stopped at epoch {ran} of {planned} (best valid {100 * state['best_valid']:.1f})"
                    cells += [where, "–", state["precision"], "–" if cpu is None else f"{cpu:,.0f}",
                              "–" if left is None else f"{left:,.0f}"]  # fmt: skip
                    counts["stopped"] += 1
                elif state is not None:
                    cells += [f"stopped: {state['forests']} of {state['of']} forests", "–", "–",
                              "–", "–"]  # fmt: skip
                    counts["stopped"] += 1
                else:
                    cells += ["not started", "–", "–", "–", "–"]
                    counts["not started"] += 1
                lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))
    print(", ".join(f"{n} {what}" for what, n in counts.items())
          + f"; the stopped cells' remaining epochs: about {left_total / 3600:.1f} h of one core")  # fmt: skip


def compare(args: argparse.Namespace) -> None:
    """Row A against row B on every set of ``--tasks`` both hold for every seed, then over
    those sets; prints the table and writes it to ``--out`` when given."""
    import numpy as np

    from smiexlm.errors import DataError
    from smiexlm.moleculenet.compare import mean_over_sets, paired_bootstrap
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.moleculenet.runs import cells_root, has_predictions, read_predictions, run_dir

    def kept(row: Path, task) -> list[dict] | None:
        folders = [run_dir(cells_root(row), task.name, seed) for seed in args.seeds]
        if not all(has_predictions(f) for f in folders):
            return None
        return [read_predictions(f, task) for f in folders]

    (a_row, b_row), parts, kinds = args.rows, [], set()
    what = "test PR-AUC x 100 (average precision)" if args.measure == "pr_auc" else "test score"
    lines = [f"A = `{a_row.name}`, B = `{b_row.name}`, seeds {args.seeds}; {what}; "
             f"{args.draws:,} paired draws of each set's test molecules, "
             f"{100 * args.level:g} % intervals", "",
             "| set | test molecules | A | B | A − B | interval | draws with A better |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name in args.tasks:
        task = load_task(name)
        a, b = kept(a_row, task), kept(b_row, task)
        if a is None or b is None:
            print(f"{name}: left out, not every seed of both rows is finished", file=sys.stderr)
            continue
        rows = a[0]["test_rows"]
        if any(not np.array_equal(k["test_rows"], rows) for k in a + b):
            raise DataError(f"{name}: the rows' test molecules differ: expected one split")
        d = paired_bootstrap(task.task_type, task.labels[rows], [k["test"] for k in a],
                             [k["test"] for k in b], args.draws, 0, args.level,
                             args.measure)  # fmt: skip
        parts.append(d)
        kinds.add(task.task_type)
        lines.append(_difference_line(name, len(rows), d, task.scale))
    if not parts:
        raise DataError(f"--tasks {args.tasks}: no set finished in both rows")
    if len(parts) > 1 and len(kinds) == 1:
        kind = kinds.pop()
        mean = mean_over_sets(parts, kind == "classification", args.level)
        lines.append(_difference_line(f"mean of {len(parts)}", None, mean, 100.0 if kind == "classification" else 1.0))  # fmt: skip
    print("\n".join(lines))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


def compact(args: argparse.Namespace) -> None:
    """The float16 copy of every finished cell's scores in each row of ``args.folders``."""
    from smiexlm.moleculenet.runs import cells_root
    from smiexlm.moleculenet.score_store import compact as compact_row

    for row in args.folders:
        print(f"{row}: {compact_row(cells_root(row), args.skip)} cells")


def measures(args: argparse.Namespace) -> None:
    """Fill in the measures beside the score (PR-AUC; MAE, R², Spearman) of every finished
    cell under ``--root`` whose result predates them, from the predictions it kept; then
    rewrite the reports. Cells that kept no predictions are counted and left as they are."""
    from smiexlm.errors import DataError
    from smiexlm.moleculenet import runs
    from smiexlm.moleculenet.loaders import load_task

    rows = [r for r in ROWS if (args.root / r / "runs").is_dir()]
    if not rows:
        raise DataError(f"--root {str(args.root)!r} holds no row folder (<row>/runs/) of "
                        f"{', '.join(ROWS)}")  # fmt: skip
    tasks, filled, without = {}, 0, 0
    for row in rows:
        changed = False
        for folder in sorted((args.root / row / "runs").glob("*/seed*/")):
            done = runs.finished(folder)
            if done is None or done.more:
                continue
            if not runs.has_predictions(folder):
                without += 1
                continue
            if done.dataset not in tasks:
                tasks[done.dataset] = load_task(done.dataset)
            changed |= runs.add_measures(folder, tasks[done.dataset])
            filled += 1
        if changed:
            _report(args.root / row, ROWS[row][1])
    merge(argparse.Namespace(folders=[args.root / r for r in rows], out=args.root))
    print(f"{filled} cells given their measures; {without} kept no predictions")


def _difference_line(name: str, n: int | None, d, scale: float) -> str:
    cells = [name, "–" if n is None else f"{n:,}", f"{scale * d.a:.1f}", f"{scale * d.b:.1f}",
             f"{scale * d.diff:+.1f}", f"[{scale * d.low:+.1f}, {scale * d.high:+.1f}]",
             f"{100 * d.a_better:.0f} %"]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def _spread(processes: int) -> bool:
    """True when ``processes`` copies of this script ran it (see ``distributed.relaunch``)."""
    from smiexlm.training.distributed import relaunch

    code = relaunch(processes, [sys.executable, *sys.argv])
    if code:
        raise SystemExit(code)
    return code is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="fine-tune one backbone on every task and seed")
    p_run.add_argument("--name", required=True)
    p_run.add_argument("--checkpoint", default=None, help="a model folder or a shipped name")
    p_run.add_argument("--preset", default="tiny", help="random init preset (no --checkpoint)")
    p_run.add_argument("--objective", default="mlm", help="random init objective")
    p_run.add_argument("--threads", type=int, default=1)
    p_run.add_argument("--processes", type=int, default=1, help="data parallel processes")
    p_run.add_argument("--variant", choices=list(VARIANTS), default="finetune")
    p_run.add_argument("--max-train-steps", type=int, default=None, help="smoke runs only")
    p_run.add_argument("--augment", type=int, default=0, help="random SMILES per molecule")
    p_run.add_argument("--tta", type=int, default=0, help="random SMILES averaged at test")
    p_run.add_argument("--adapt-steps", type=int, default=0, help="descriptor regression first")
    p_run.add_argument("--adapt-lr", type=float, default=None, help="its learning rate")
    p_run.add_argument("--layers", type=int, default=None, help="the head reads the last N blocks")
    p_run.add_argument("--pooling", default=None,
                       help="the head's pooling: cls (Table 8's), mean, max, or several side by "
                       "side (cls+mean+max)")  # fmt: skip
    p_run.add_argument("--ema-half-life", type=float, default=0.0,
                       help="validate and keep a moving average of the weights (epochs)")  # fmt: skip
    p_run.add_argument("--head-epochs", type=int, default=0,
                       help="the head alone on the frozen encoder first, for N epochs")  # fmt: skip
    p_run.add_argument("--head-lr", type=float, default=None, help="their learning rate")
    p_run.add_argument("--lr-scale", type=float, default=None,
                       help="each set's Table 8 learning rate times this")  # fmt: skip
    p_run.add_argument("--layer-decay", type=float, default=None,
                       help="each block's learning rate this times the one above it")  # fmt: skip
    p_run.add_argument("--class-weight", choices=("none", "balanced"), default=None,
                       help="balanced: each task's classes weighted inversely to their "
                            "frequency (default: the set's config: balanced for MUV and ToxCast)")  # fmt: skip
    p_probe = sub.add_parser("probe", help="linear probe on pooled embeddings, every task")
    p_probe.add_argument("--name", default="linear probe (logistic)")
    p_probe.add_argument("--checkpoint", default=None)
    p_probe.add_argument("--threads", type=int, default=1)
    p_probe.add_argument(
        "--pooling",
        default=None,
        help="cls, mean, max, or several side by side (cls+mean); default: the model folder's "
        "own (embedding.json)",
    )
    p_probe.add_argument("--features", choices=["ecfp4", "rdkit2d", "both"], default=None)
    p_probe.add_argument(
        "--whiten", action="store_true", help="the folder's stored whitening first"
    )
    p_probe.add_argument("--tta", type=int, default=0, help="mean embedding over K random SMILES")
    p_probe.add_argument(
        "--layers",
        type=int,
        default=None,
        help="the last N blocks side by side (default: the model's own)",
    )
    p_base = sub.add_parser("baseline", help="a random forest on every task")
    p_base.add_argument("--name", default=None, help="default: RF-<features> (N trees)")
    p_base.add_argument("--features", choices=["ecfp4", "rdkit2d", "both"], default="ecfp4")
    p_base.add_argument("--n-trees", type=int, default=500)
    for p in (p_run, p_probe, p_base):
        p.add_argument("--tasks", nargs="+", default=TASKS)
        p.add_argument("--out", type=Path, required=True)
    p_merge = sub.add_parser("merge", help="one report from several row folders")
    p_merge.add_argument("folders", nargs="+", type=Path)
    p_merge.add_argument("--out", type=Path, required=True)
    p_camp = sub.add_parser("campaign", help="every cell of the plan, resumable")
    p_camp.add_argument("--root", type=Path, required=True)
    p_camp.add_argument("--rows", nargs="+", choices=list(ROWS), default=None)
    p_camp.add_argument("--tasks", nargs="+", choices=TASKS, default=None, help="only these sets")
    p_camp.add_argument("--n-trees", type=int, default=500, help="trees per forest")
    p_measures = sub.add_parser("measures", help="PR-AUC etc. for cells finished before them")
    p_measures.add_argument("--root", type=Path, required=True)
    p_curves = sub.add_parser("curves", help="validation per epoch of fine-tuning cells, a PNG")
    p_curves.add_argument("folders", nargs="+", type=Path, metavar="ROW",
                          help="row folders (<row>/runs/<set>/seed<k>/)")  # fmt: skip
    p_curves.add_argument("--tasks", nargs="+", choices=TASKS, default=TASKS)
    p_curves.add_argument("--out", type=Path, required=True, help="the PNG")
    p_status = sub.add_parser("status", help="where every cell of the plan stands, from --root")
    p_status.add_argument("--root", type=Path, required=True)
    p_status.add_argument("--rows", nargs="+", choices=list(ROWS), default=None)
    p_status.add_argument("--tasks", nargs="+", choices=TASKS, default=None)
    p_compact = sub.add_parser("compact", help="float16 copies of the rows' kept scores, to commit")
    p_compact.add_argument("folders", nargs="+", type=Path, metavar="ROW")
    p_compact.add_argument("--skip", nargs="*", choices=TASKS, default=[], help="sets left out")
    p_compare = sub.add_parser("compare", help="how sure a difference between two rows is")
    p_compare.add_argument("rows", nargs=2, type=Path, metavar="ROW", help="row A, then row B")
    p_compare.add_argument("--tasks", nargs="+", choices=TASKS, default=TASKS)
    p_compare.add_argument("--draws", type=int, default=1000, help="paired resamples")
    p_compare.add_argument("--level", type=float, default=0.95, help="interval coverage")
    p_compare.add_argument("--measure", choices=["score", "pr_auc"], default="score",
                           help="the table's score, or PR-AUC (classification sets)")  # fmt: skip
    p_compare.add_argument("--out", type=Path, default=None, help="also write the table here")
    for p in (p_run, p_camp):
        p.add_argument("--progress", action="store_true", help="a progress bar per run")
        p.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                       help="auto: bf16 where it is native, and a stopped cell goes on in its "
                       "own; fp32 or bf16: that, a stopped cell switching to it (recorded)")  # fmt: skip
    for p in (p_run, p_probe, p_base, p_camp, p_status, p_compare, p_curves):
        p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    args = parser.parse_args()
    # a line per epoch of every run (smiexlm.finetuning.engine) in the log
    logging.basicConfig(format="%(asctime)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    logging.getLogger("smiexlm").setLevel(logging.INFO)
    if args.command == "run" and _spread(args.processes):
        return
    commands = {"run": run, "probe": probe, "baseline": baseline, "merge": merge}
    commands |= {"campaign": campaign, "status": status, "compare": compare}
    commands |= {"measures": measures, "curves": curves, "compact": compact}
    commands[args.command](args)


if __name__ == "__main__":
    main()
