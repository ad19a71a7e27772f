"""Which members, and which combination of them, a regression set should be served by: the
fine-tuned network, its RDKit 2D forest and the kernel members (:mod:`smiexlm.forests.kernels`),
alone and combined, each chosen without the test rows.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/potency_members.py --runs runs/bace_pic50/out runs/regression \
        --sets bace_pic50 esol freesolv lipophilicity --out benchmarks/results/potency

Each ``--runs`` root holds finished fine-tunings as ``smiexlm finetune``, ``benchmark`` or
``moleculenet_table.py run`` leave them (``ROOT/runs/<set>/seed<k>/predictions.npz``): the
model's validation and test scores and, for the served default (``forest = "auto"``), its
forest's, which are fitted here (``--n-trees``, the run's seed) for a run of the network
alone. ``bace_pic50`` is
BACE's own potency column (``pIC50``) as a regression set. For each set, on its scaffold
split (the runs' own, checked row for row):

- the kernel members (Tanimoto on ECFP4, RBF on the shipped model's frozen embedding, both)
  are fitted on the training rows, ``C`` and ``gamma`` chosen in scaffold-whole folds of them;
- per seed, the test RMSE, and the RMSE on the test molecules that form activity cliffs
  (:mod:`smiexlm.moleculenet.cliffs`), of each member alone and of the combinations:
  ``served`` (today's: the network and its forest, half each), ``equal`` (every member the
  same weight), ``equal-no-network``, ``valid-weights`` (non-negative weights fitted on the
  validation rows, summing to 1), ``oof-best`` (the member of the lowest out-of-fold RMSE on
  the training rows, among those that have one: the forest, refitted in the same folds, and
  the kernels) and ``oof-weights`` (weights fitted on those out-of-fold predictions). The
  network has none: its own would cost five more fine-tunings a seed.

Writes ``<set>.json`` per set (a set done is read back: the job resumes) and ``report.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

KINDS = ("tanimoto", "rbf", "both")


def load(name: str):
    from smiexlm.moleculenet import load_task, read_task
    from smiexlm.paths import data_dir

    if name == "bace_pic50":
        path = data_dir() / "moleculenet" / "bace.csv"
        return read_task(path, "mol", ["pIC50"], "regression", "bace_pic50")
    return load_task(name)


def embedding(task) -> np.ndarray:
    """The shipped model's served embedding of the set, kept in the cache (regenerable)."""
    from smiexlm import Featurizer
    from smiexlm.paths import cache_dir

    path = cache_dir() / "potency" / f"{task.sha256}-{len(task.smiles)}.npy"
    if path.is_file():
        return np.load(path)
    vectors = Featurizer.from_pretrained().featurize(list(task.smiles)).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def kernel_members(task, split) -> dict[str, dict]:
    """Each kernel member's validation, test and out-of-fold (train) predictions."""
    import pandas as pd

    from smiexlm.fingerprints import morgan_fingerprints
    from smiexlm.forests.kernels import KernelInputs, fit_kernel_svr
    from smiexlm.moleculenet.splits import murcko_scaffolds

    train, valid, test = (np.asarray(p) for p in (split.train, split.valid, split.test))
    inputs = KernelInputs(morgan_fingerprints([s.strip() for s in task.smiles]), embedding(task))
    scaffolds = murcko_scaffolds([task.smiles[i] for i in train])
    groups = pd.factorize(pd.Series(scaffolds).fillna(""))[0]
    y = task.labels.astype(np.float64)
    out = {"groups": groups}
    for kind in KINDS:
        t0 = time.process_time()
        member, oof = fit_kernel_svr(kind, inputs.take(train), y[train], groups)
        out[f"svr_{kind}"] = {
            "valid": member.predict(inputs.take(valid)), "test": member.predict(inputs.take(test)),
            "oof": oof, "cv_rmse": member.cv_rmse, "chosen": member.record(),
            "cpu_s": round(time.process_time() - t0, 1),
        }  # fmt: skip
    return out


def forest(task, split, groups: np.ndarray, seed: int, n_trees: int, npz: dict) -> dict:
    """The served forest (RDKit 2D, the run's seed): its validation and test scores (the
    run's own where it kept a forest, else fitted here on the training rows), and its
    out-of-fold predictions of the training rows in the kernels' scaffold-whole folds."""
    from smiexlm.forests.baseline import BaselineConfig, ForestFeatures, fit_forests, forest_scores
    from smiexlm.forests.kernels import _folds

    cfg = BaselineConfig("rdkit2d", n_trees=n_trees)
    train = np.asarray(split.train)
    features = ForestFeatures([s.strip() for s in task.smiles], "rdkit2d", cache=True)
    y = task.labels.astype(np.float64)
    out = {"valid": npz.get("valid_forest"), "test": npz.get("test_forest")}
    if out["valid"] is None:  # a run of the network alone
        x = features.matrix(features.scaler(train))
        fitted = fit_forests(x[train], y[train], "regression", seed, cfg)
        out = {p: forest_scores(fitted, x[np.asarray(rows)], "regression")
               for p, rows in (("valid", split.valid), ("test", split.test))}  # fmt: skip
    oof = np.full(y[train].shape, np.nan)
    for fit_rows, held in _folds(groups, len(train)):
        x = features.matrix(features.scaler(train[fit_rows]))
        fitted = fit_forests(x[train[fit_rows]], y[train[fit_rows]], "regression", seed, cfg)
        oof[held] = forest_scores(fitted, x[train[held]], "regression")
    return out | {"oof": oof, "cv_rmse": _rmse(y[train], oof)}


def _rmse(y: np.ndarray, p: np.ndarray) -> float:
    keep = ~np.isnan(y)
    return float(np.sqrt(np.mean((y[keep] - p[keep]) ** 2)))


def _weights(columns: list[np.ndarray], y: np.ndarray) -> np.ndarray:
    """Non-negative weights summing to 1 of least squares on ``y`` (the labelled rows)."""
    from scipy.optimize import nnls

    a = np.stack([c.reshape(-1) for c in columns], axis=1)
    keep = ~np.isnan(y.reshape(-1))
    w, _ = nnls(a[keep], y.reshape(-1)[keep])
    return w / w.sum() if w.sum() > 0 else np.full(len(columns), 1 / len(columns))


def seed_rows(task, split, kernels: dict, npz: dict, cliffs: np.ndarray, seed: int,
              n_trees: int) -> list[dict]:  # fmt: skip
    """Every member and combination of one seed (see the module docstring)."""
    from smiexlm.moleculenet.cliffs import cliff_rmse

    y = task.labels.astype(np.float64)
    valid, test = np.asarray(split.valid), np.asarray(split.test)
    groups, kernels = kernels["groups"], {k: v for k, v in kernels.items() if k != "groups"}
    network = {p: npz.get(f"{p}_model", npz[p]) for p in ("valid", "test")}  # alone or blended
    members = {"model": network, "forest": forest(task, split, groups, seed, n_trees, npz),
               **kernels}  # fmt: skip
    combos = {name: (m["valid"], m["test"], "") for name, m in members.items()}

    def weighted(names: list[str], w: np.ndarray, note: str) -> tuple:
        parts = [np.asarray(members[n][p], np.float64) for p in ("valid", "test") for n in names]
        v = sum(wi * x for wi, x in zip(w, parts[: len(names)], strict=True))
        t = sum(wi * x for wi, x in zip(w, parts[len(names) :], strict=True))
        return (
            v,
            t,
            note + ": " + ", ".join(f"{n} {wi:.2f}" for n, wi in zip(names, w, strict=True)),
        )

    everyone, with_oof = list(members), [n for n in members if "oof" in members[n]]
    combos["served"] = weighted(["model", "forest"], np.full(2, 0.5), "today's default")
    combos["equal"] = weighted(everyone, np.full(len(everyone), 1 / len(everyone)), "equal")
    no_net = [n for n in everyone if n != "model"]
    combos["equal-no-network"] = weighted(no_net, np.full(len(no_net), 1 / len(no_net)), "equal")
    w = _weights([np.asarray(members[n]["valid"]) for n in everyone], y[valid])
    combos["valid-weights"] = weighted(everyone, w, "fitted on valid")
    best = min(with_oof, key=lambda n: members[n]["cv_rmse"])
    combos["oof-best"] = weighted([best], np.ones(1), "lowest out-of-fold RMSE")
    w = _weights([members[n]["oof"] for n in with_oof], y[split.train])
    combos["oof-weights"] = weighted(with_oof, w, "fitted out-of-fold")
    rows = []
    for name, (v, t, note) in combos.items():
        rmse, n = cliff_rmse(y[test], np.asarray(t, np.float64), cliffs[test])
        rows.append({"combination": name, "valid": _rmse(y[valid], np.asarray(v, np.float64)),
                     "test": _rmse(y[test], np.asarray(t, np.float64)), "test_cliff": rmse,
                     "n_cliff": n, "note": note})  # fmt: skip
    return rows


def run_set(name: str, roots: list[Path], out: Path, n_trees: int = 500) -> dict:
    from smiexlm.moleculenet.cliffs import task_cliffs
    from smiexlm.moleculenet.splits import make_split

    path = out / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    task = load(name)
    split = make_split(task.smiles, "scaffold")
    kernels = kernel_members(task, split)
    cliffs = task_cliffs(task)
    seeds = {}
    for root in roots:
        for folder in sorted((root / "runs" / task.name).glob("seed*")):
            if not (folder / "result.json").is_file():  # a seed still running
                continue
            npz = dict(np.load(folder / "predictions.npz"))
            if not np.array_equal(npz["test_rows"], split.test):
                sys.exit(f"{folder}: its test rows are not the scaffold split's")
            seed = int(folder.name.removeprefix("seed"))
            seeds[folder.name] = seed_rows(task, split, kernels, npz, cliffs, seed, n_trees)
    doc = {"set": name, "sizes": list(split.sizes), "n_cliff_molecules": int(cliffs.any(1).sum()),
           "kernels": {k: {"cv_rmse": v["cv_rmse"], "chosen": v["chosen"], "cpu_s": v["cpu_s"]}
                       for k, v in kernels.items() if k != "groups"},
           "seeds": seeds}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return doc


def report(docs: list[dict], command: str) -> str:
    lines = ["# Potency members: each alone and combined (test RMSE; on cliff molecules)", "",
             f"`{command}`", "",
             "Mean ± sample std over seeds; the kernels are deterministic, the seeds are the "
             "network's and its forest's. Cliff: RMSE on the test molecules that form activity "
             "cliffs (count in the header).", ""]  # fmt: skip
    for doc in docs:
        by: dict[str, list[dict]] = {}
        for rows in doc["seeds"].values():
            for row in rows:
                by.setdefault(row["combination"], []).append(row)
        n_cliff = next(iter(by.values()))[0]["n_cliff"] if by else 0
        lines += [f"## {doc['set']} ({'/'.join(map(str, doc['sizes']))}; {n_cliff} test cliff "
                  f"molecules; {len(doc['seeds'])} seeds)", "",
                  "| served by | valid | test | test, cliff molecules |", "|---|---|---|---|"]  # fmt: skip
        for name, rows in by.items():
            cells = []
            for key in ("valid", "test", "test_cliff"):
                values = np.array([r[key] for r in rows])
                std = f" ± {values.std(ddof=1):.3f}" if len(values) > 1 else ""
                cells.append(f"{values.mean():.3f}{std}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, nargs="+", required=True)
    parser.add_argument("--sets", nargs="+", default=["bace_pic50"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/potency"))
    parser.add_argument("--n-trees", type=int, default=500, help="trees of each forest")
    args = parser.parse_args()
    docs = [run_set(name, args.runs, args.out, args.n_trees) for name in args.sets]
    text = report(docs, "python benchmarks/potency_members.py " + " ".join(sys.argv[1:]))
    (args.out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
