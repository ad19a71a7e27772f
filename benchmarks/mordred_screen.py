"""Mordred's 2D descriptors against RDKit's as the MTR pre-training target, on a small corpus.

    export SMIEXLM_DATA=../shared/data
    python benchmarks/mordred_screen.py --molecules 20000 --updates 6000 --sets esol freesolv \\
        --seeds 0 --work runs/mordred_screen --out benchmarks/results/mordred

The shipped default regresses RDKit's ~200 2D descriptors; a peer reported level with an SVR
on small potency sets regresses Mordred's ~1,600. Here the first N MOSES training molecules
(and the first 1,000 of MOSES's test file, ``--valid-molecules``, as the validation part) are preprocessed twice,
``--descriptors rdkit2d`` and ``--descriptors mordred``: the same molecules, tokens and
order. ``mol_tiny_mtr`` is pre-trained on each with the same schedule shortened to U updates
(warm-up a tenth of them), exported, and fine-tuned alone on each set and seed (Table 8's row,
no forest, no kernels: the network is what the target changes). Every step runs the real
command in ``--work`` and is skipped when its output is there (preprocess and pretrain resume
a stopped run). ``screen.json`` in ``--out`` holds every figure, ``report.md`` the table.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_memory import smiexlm_command  # noqa: E402  (the one way to find the command)

KINDS = ("rdkit2d", "mordred")


def smiexlm(*args: str, threads: int = 1) -> float:
    """Run ``smiexlm ARGS`` (failing loudly); its wall seconds."""
    env = os.environ | {"OMP_NUM_THREADS": str(threads), "TQDM_DISABLE": "1"}
    start = time.perf_counter()
    done = subprocess.run([smiexlm_command(), *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"smiexlm {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def first_lines(source: Path, n: int, out: Path) -> Path:
    if not out.is_file():
        with gzip.open(source, "rt") as handle:
            lines = [line.split()[0] for line in itertools.islice(handle, n) if line.strip()]
        out.write_text("\n".join(lines) + "\n")
    return out


def pretrained(kind: str, corpus: Path, valid: Path, args, work: Path, log: dict) -> Path:
    """The exported model of ``kind``: preprocess, pretrain, export, each once."""
    data, run, model = work / f"data_{kind}", work / f"run_{kind}", work / f"model_{kind}"
    times = log.setdefault(kind, {})
    if not (data / "descriptors.json").is_file():
        times["preprocess_s"] = smiexlm(
            "preprocess", str(corpus), "--out", str(data), "--valid-input", str(valid),
            "--descriptors", kind, "--workers", str(args.workers), "--resume", "--no-progress")  # fmt: skip
    if not (model / "config.json").is_file():
        u = args.updates
        times["pretrain_s"] = smiexlm(
            "pretrain", "--config", "mol_tiny_mtr", "--data", str(data), "--out", str(run),
            "--nproc", str(args.nproc), "--resume", f"max_steps={u}", f"total_steps={u}",
            f"warmup_steps={max(1, u // 10)}", f"valid_every={max(1, u // 4)}",
            f"save_every={max(1, u // 4)}", *args.pretrain_set)  # fmt: skip
        smiexlm("export", str(run), "--out", str(model), "--data", str(data))
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    valid_losses = [m["valid_loss"] for m in metrics if "valid_loss" in m]
    times["final_valid_loss"] = valid_losses[-1] if valid_losses else None
    return model


def finetuned(kind: str, model: Path, task: str, seed: int, args, work: Path) -> dict:
    out = work / f"ft_{kind}_{task}_seed{seed}"
    if not (out / "results.json").is_file():
        extra = ["--max-train-steps", str(args.max_train_steps)] if args.max_train_steps else []
        smiexlm("finetune", task, "--checkpoint", str(model), "--seeds", str(seed),
                "--device", "cpu", "--set", "forest=none", "--set", "kernels=none",
                "--out", str(out), "--resume", *extra)  # fmt: skip
    (record,) = json.loads((out / "results.json").read_text())
    return {"kind": kind, "set": task, "seed": seed, "test": record["test"],
            "valid": record["valid"], "cliff": record.get("more", {}).get("cliff_rmse")}  # fmt: skip


def report(rows: list[dict], log: dict, args) -> str:
    import numpy as np

    command = (f"python benchmarks/mordred_screen.py --molecules {args.molecules} "
               f"--valid-molecules {args.valid_molecules} --updates {args.updates} --sets "
               f"{' '.join(args.sets)} --seeds {' '.join(map(str, args.seeds))}")  # fmt: skip
    lines = [
        "# Mordred or RDKit 2D descriptors as the MTR target: a small-corpus screen", "",
        f"`{command}`", "",
        f"{platform.platform()}, {os.cpu_count()} CPUs, python {platform.python_version()}. "
        f"The first {args.molecules:,} MOSES training molecules, `mol_tiny_mtr` for "
        f"{args.updates:,} updates on each target, then the network alone fine-tuned "
        "(Table 8's row, no forest, no kernels); test RMSE (validation RMSE; test RMSE on the "
        "molecules that form activity cliffs), mean over the seeds.", "",
        "| target | descriptors | preprocess s | pretrain s | final valid loss | "
        + " | ".join(args.sets) + " |",
        "|---|---|---|---|---|" + "---|" * len(args.sets),
    ]  # fmt: skip
    for kind in KINDS:
        cells = []
        for task in args.sets:
            mine = [r for r in rows if r["kind"] == kind and r["set"] == task]
            test, valid, cliff = (np.mean([r[k] for r in mine]) for k in ("test", "valid", "cliff"))
            cells.append(f"{test:.3f} ({valid:.3f}; {cliff:.3f})")
        t = log.get(kind, {})
        figures = [f"{t[k]:.0f}" if t.get(k) is not None else "–"
                   for k in ("preprocess_s", "pretrain_s")]  # fmt: skip
        loss = t.get("final_valid_loss")
        lines.append(f"| {kind} | {log.get('n_' + kind, '?')} | {' | '.join(figures)} | "
                     f"{'–' if loss is None else f'{loss:.4f}'} | {' | '.join(cells)} |")  # fmt: skip
    lines += ["", "The two losses are not comparable (each is the mean over its own "
              "descriptors); the fine-tuned RMSE is. Seconds: each step's wall time as it ran "
              "(`--workers`, `--nproc`; a step resumed counts its last run alone)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--molecules", type=int, default=20000)
    parser.add_argument("--valid-molecules", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=6000)
    parser.add_argument("--sets", nargs="+", default=["esol", "freesolv"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--workers", type=int, default=1, help="preprocess workers")
    parser.add_argument("--nproc", type=int, default=1, help="pretrain processes")
    parser.add_argument("--max-train-steps", type=int, default=None, help="fine-tuning cap")
    parser.add_argument("--pretrain-set", action="append", default=[], metavar="KEY=VALUE",
                        help="one more pre-training override, for both targets")  # fmt: skip
    parser.add_argument("--work", type=Path, default=Path("runs/mordred_screen"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/mordred"))
    args = parser.parse_args()
    from smiexlm.chemistry.fingerprints import descriptor_names

    root = Path(os.environ["SMIEXLM_DATA"]) / "pretrain"
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = first_lines(root / "moses_train.smi.gz", args.molecules, args.work / "train.smi")
    valid = first_lines(root / "moses_test.smi.gz", args.valid_molecules, args.work / "valid.smi")
    log_path = args.work / "times.json"
    log = json.loads(log_path.read_text()) if log_path.is_file() else {}
    rows = []
    for kind in KINDS:
        log[f"n_{kind}"] = len(descriptor_names(kind))
        model = pretrained(kind, corpus, valid, args, args.work, log)
        log_path.write_text(json.dumps(log, indent=1))
        for task in args.sets:
            for seed in args.seeds:
                rows.append(finetuned(kind, model, task, seed, args, args.work))
                print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "screen.json").write_text(json.dumps({"times": log, "runs": rows}, indent=1))
    (args.out / "report.md").write_text(report(rows, log, args))
    print(report(rows, log, args))


if __name__ == "__main__":
    main()
