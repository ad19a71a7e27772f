"""What the fine-tuned network's own out-of-fold predictions cost, and what they would buy a
regression set's served blend.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/network_oof.py --sets esol freesolv bace_pic50 --seeds 0 \\
        --work runs/network_oof --out benchmarks/results/potency/network_oof

The members beside the network (its forest, the kernels) are weighed on out-of-fold
predictions of the training molecules (:mod:`smiexlm.forests.members`); the network has none,
so it joins only by a decision on the validation molecules (``fixed``, ``gated``). Here, per
(set, seed), the network is fine-tuned once per scaffold-whole fold of the training molecules
(the kernels' folds; the set's validation molecules still choose each fold's epoch; the run's
settings otherwise, its seed), and scores the held fold: its out-of-fold predictions. With
them, beside the served rule ``picked`` (kept in ``benchmarks/results/potency``):

- ``oof-best+net``: the member of the lowest out-of-fold RMSE, the network among them;
- ``oof-weights+net``: non-negative weights summing to 1 fitted on every member's
  out-of-fold predictions, the network's included;
- ``picked+net``: of ``picked``'s four candidates and those two, the lowest validation RMSE.

The cost is the folds' one-thread seconds against those of the seed's own fine-tuning on the
whole split, run beside them in this process. Each run is kept in ``--work`` (resumable: a
finished one is read back);
``<set>-seed<k>.json`` in ``--out`` holds the figures, and ``report.md`` the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import potency_members as pm  # noqa: E402

POTENCY = Path(__file__).resolve().parent / "results" / "potency"


def network_oof(task, split, groups: np.ndarray, seed: int, work: Path,
                max_train_steps: int | None) -> tuple[np.ndarray, float, float]:  # fmt: skip
    """(n_train, T) out-of-fold predictions of the network, the folds' one-thread seconds, and
    those of the seed's own fine-tuning on the whole split, run here beside them."""
    from smiexlm.finetuning.adapter import finetune_once
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.config import finetune_config
    from smiexlm.forests.kernels import _folds
    from smiexlm.moleculenet import runs
    from smiexlm.moleculenet.splits import Split

    cfg = finetune_config(task.name, max_train_steps=max_train_steps)
    cfg = dataclasses.replace(cfg, forest=None, kernels="none")
    backbone = Backbone()

    def cpu_seconds(part: Split, where: Path) -> float:
        """One fine-tuning on ``part`` in ``where`` (read back when finished): its seconds."""
        if runs.finished(where) is None:
            c0 = time.process_time()
            finetune_once(task, part, cfg, seed, backbone, run_dir=where, progress=False)
            (where / "cpu_seconds.json").write_text(json.dumps(time.process_time() - c0))
        return json.loads((where / "cpu_seconds.json").read_text())

    train = np.asarray(split.train)
    oof = np.full((len(train), task.labels.shape[1]), np.nan)
    seconds, root = 0.0, work / task.name / f"seed{seed}"
    for k, (fit_rows, held) in enumerate(_folds(groups, len(train))):
        fold = Split("scaffold", None, list(train[fit_rows]), list(split.valid), list(train[held]))
        seconds += cpu_seconds(fold, root / f"fold{k}")
        oof[held] = runs.read_predictions(root / f"fold{k}", task)["test"]
        print(f"{task.name} seed {seed} fold {k}: done", flush=True)
    return oof, seconds, cpu_seconds(split, root / "whole")


def run_seed(name: str, seed: int, args: argparse.Namespace) -> dict:
    from smiexlm.forests.members import combine, least_squares_weights, rmse
    from smiexlm.moleculenet.splits import make_split

    out = args.out
    path = out / f"{name}-seed{seed}.json"
    if path.is_file():
        return json.loads(path.read_text())
    kept = pm.network_scores(name, [], POTENCY / "network")
    if seed not in kept:
        sys.exit(f"{name} seed {seed}: no kept scores of the network in {POTENCY / 'network'} "
                 f"(seeds kept: {sorted(kept)}); run potency_members.py first")  # fmt: skip
    npz = kept[seed]
    task = pm.load(name)
    split = make_split(task.smiles, "scaffold")
    kernels = pm.kernel_members(task, split)
    groups = kernels.pop("groups")
    net_oof, seconds, whole = network_oof(task, split, groups, seed, args.work,
                                          args.max_train_steps)  # fmt: skip
    y = task.labels.astype(np.float64)
    train, valid, test = (np.asarray(p) for p in (split.train, split.valid, split.test))
    forest = pm.forest(task, split, groups, seed, args.n_trees, npz, 100)
    network = {p: npz.get(f"{p}_model", npz[p]) for p in ("valid", "test")} | {"oof": net_oof}
    members = {"model": network, "forest": forest, **kernels}
    valids = {n: m["valid"] for n, m in members.items()}
    others = {n: m["oof"] for n, m in members.items() if n != "model"}
    weights = {"picked": combine("picked", others, y[train], valids, y[valid], 0.5)}
    every = {n: m["oof"] for n, m in members.items()}
    best = min(every, key=lambda n: rmse(y[train], every[n]))
    weights["oof-best+net"] = {n: float(n == best) for n in members}
    fitted = least_squares_weights(list(every.values()), y[train])
    weights["oof-weights+net"] = dict(zip(every, map(float, fitted), strict=True))
    candidates = [combine(r, others, y[train], valids, y[valid], 0.5)
                  for r in ("fixed", "gated", "oof-best")]  # fmt: skip
    candidates += [{n: float(n == "forest") for n in members}, weights["oof-best+net"],
                   weights["oof-weights+net"]]  # fmt: skip
    weights["picked+net"] = min(
        candidates, key=lambda w: rmse(y[valid], _blend(w, members, "valid"))
    )
    doc = {"set": name, "seed": seed, "folds_cpu_seconds": round(seconds, 1),
           "fine_tuning_cpu_seconds": round(whole, 1),
           "network_oof_rmse": rmse(y[train], net_oof),
           "rows": {c: {"valid": rmse(y[valid], _blend(w, members, "valid")),
                        "test": rmse(y[test], _blend(w, members, "test")),
                        "weights": {k: round(v, 4) for k, v in w.items() if v}}
                    for c, w in weights.items()}}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return doc


def _blend(weights: dict[str, float], members: dict, part: str) -> np.ndarray:
    return sum(w * np.asarray(members[n][part], np.float64) for n, w in weights.items())


def report(docs: list[dict], command: str) -> str:
    lines = ["# The network's own out-of-fold predictions: cost and gain", "",
             f"`{command}`", "",
             "| set | seed | picked (served) | oof-best+net | oof-weights+net | picked+net | "
             "the folds' CPU s | × the seed's fine-tuning |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for d in docs:
        r = d["rows"]
        ratio = f"{d['folds_cpu_seconds'] / d['fine_tuning_cpu_seconds']:.1f}"
        lines.append(f"| {d['set']} | {d['seed']} | " + " | ".join(
            f"{r[c]['test']:.3f}" for c in ("picked", "oof-best+net", "oof-weights+net", "picked+net"))
            + f" | {d['folds_cpu_seconds']:,.0f} | {ratio} |")  # fmt: skip
    lines += ["", "Test RMSE; weights of each row in the set's JSON."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", nargs="+", default=["esol", "freesolv"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--work", type=Path, default=Path("runs/network_oof"))
    parser.add_argument("--out", type=Path, default=POTENCY / "network_oof")
    parser.add_argument("--n-trees", type=int, default=500, help="trees of the served forest")
    parser.add_argument("--max-train-steps", type=int, default=None, help="a short run's cap")
    args = parser.parse_args()
    docs = [run_seed(name, seed, args) for name in args.sets for seed in args.seeds]
    text = report(docs, "python benchmarks/network_oof.py " + " ".join(sys.argv[1:]))
    (args.out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
