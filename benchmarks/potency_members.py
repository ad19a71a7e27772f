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
  ``fixed`` (the network and its forest, half each), ``equal`` (every member the same
  weight), ``valid-weights`` (non-negative weights fitted on the validation rows, summing to
  1), ``oof-best`` (the member of the lowest out-of-fold RMSE on the training rows, among
  those that have one: the forest, refitted in the same folds, and the kernels),
  ``oof-weights`` (weights fitted on those out-of-fold predictions), ``gated`` (the served
  default before ``picked``: those weights, and the network joins at half where it alone beats
  them on the validation rows), ``picked`` (the served default: of ``fixed``, ``gated``, the
  forest alone and ``oof-best``, the lowest validation RMSE) and ``blend-gated`` (a screen:
  the network joins where the blend with it does). The network has no out-of-fold
  predictions (``network_oof.py`` measures what they would cost and buy).

Writes ``<set>.json`` per set (a set done is read back: the job resumes), ``report.md``, and
``network/<set>-seed<k>.json``: the network's and its forest's scores of each seed, compact, so
that the table is made again without the runs (``--runs`` may then name none).
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
    """The shipped model's embedding of the set as the kernel members read it, kept in the
    cache (regenerable)."""
    from smiexlm.finetuning.targets import frozen_embedding
    from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
    from smiexlm.paths import cache_dir

    path = cache_dir() / "potency" / f"{task.sha256}-{len(task.smiles)}.npy"
    if path.is_file():
        return np.load(path)
    vectors = frozen_embedding(DEFAULT_MODEL_DIR)(list(task.smiles)).astype(np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def kernel_members(task, split) -> dict[str, dict]:
    """Each kernel member's validation, test and out-of-fold (train) predictions, and the
    scaffold ids of the training rows (``groups``) its folds keep whole."""
    import pandas as pd

    from smiexlm.chemistry.fingerprints import morgan_fingerprints
    from smiexlm.forests.kernels import KernelInputs
    from smiexlm.moleculenet.splits import murcko_scaffolds

    inputs = KernelInputs(morgan_fingerprints([s.strip() for s in task.smiles]), embedding(task))
    scaffolds = murcko_scaffolds([task.smiles[i] for i in split.train])
    groups = pd.factorize(pd.Series(scaffolds).fillna(""))[0]
    return {"groups": groups} | {f"svr_{kind}": fitted_member(kind, inputs, task, split, groups)
                                 for kind in KINDS}  # fmt: skip


def fitted_member(kind: str, inputs, task, split, groups: np.ndarray) -> dict:
    """The kernel member ``kind`` on ``inputs`` (every row's), fitted on the training rows:
    its validation, test and out-of-fold predictions, chosen setting and one-thread seconds."""
    from smiexlm.forests.kernels import fit_kernel_member

    train, valid, test = (np.asarray(p) for p in (split.train, split.valid, split.test))
    t0 = time.process_time()
    member, oof = fit_kernel_member(kind, inputs.take(train),
                                    task.labels[train].astype(np.float64), groups)  # fmt: skip
    return {
        "valid": member.predict(inputs.take(valid)), "test": member.predict(inputs.take(test)),
        "oof": oof, "cv_rmse": member.cv_score, "chosen": member.record(),
        "cpu_s": round(time.process_time() - t0, 1),
    }  # fmt: skip


def forest(task, split, groups: np.ndarray, seed: int, n_trees: int, npz: dict,
           oof_trees: int) -> dict:  # fmt: skip
    """The served forest (RDKit 2D, the run's seed): its validation and test scores (the
    run's own where it kept a forest, else fitted here on the training rows), and its
    out-of-fold predictions of the training rows in the kernels' scaffold-whole folds."""
    from smiexlm.forests.baseline import BaselineConfig, ForestFeatures, fit_forests, forest_scores
    from smiexlm.forests.members import forest_oof

    texts = [s.strip() for s in task.smiles]
    y = task.labels.astype(np.float64)
    out = {"valid": npz.get("valid_forest"), "test": npz.get("test_forest")}
    if out["valid"] is None:  # a run of the network alone
        features = ForestFeatures(texts, "rdkit2d", cache=True)
        x = features.matrix(features.scaler(split.train))
        fitted = fit_forests(x[split.train], y[split.train], "regression", seed,
                             BaselineConfig("rdkit2d", n_trees=n_trees))  # fmt: skip
        out = {p: forest_scores(fitted, x[np.asarray(rows)], "regression")
               for p, rows in (("valid", split.valid), ("test", split.test))}  # fmt: skip
    oof = forest_oof(texts, y, np.asarray(split.train), groups, seed, "rdkit2d",
                     min(n_trees, oof_trees))  # fmt: skip
    return out | {"oof": oof}


def seed_rows(task, split, kernels: dict, npz: dict, cliffs: np.ndarray, seed: int,
              n_trees: int, oof_trees: int) -> list[dict]:  # fmt: skip
    """Every member and combination of one seed (see the module docstring)."""
    from smiexlm.forests.members import COMBINES, combine, least_squares_weights, rmse
    from smiexlm.moleculenet.cliffs import cliff_rmse

    y = task.labels.astype(np.float64)
    train, valid, test = (np.asarray(p) for p in (split.train, split.valid, split.test))
    groups, in_place = kernels["groups"], kernels.get("forest")  # a screen's forest, if any
    kernels = {k: v for k, v in kernels.items() if k not in ("groups", "forest")}
    network = {p: npz.get(f"{p}_model", npz[p]) for p in ("valid", "test")}  # alone or blended
    forest_scores = in_place or forest(task, split, groups, seed, n_trees, npz, oof_trees)
    members = {"model": network, "forest": forest_scores, **kernels}
    weights = {name: {name: 1.0} for name in members}
    oof = {n: m["oof"] for n, m in members.items() if "oof" in m}
    valids = {n: m["valid"] for n, m in members.items()}
    for rule in COMBINES:
        weights[rule] = combine(rule, oof, y[train], valids, y[valid], 0.5)
    weights["blend-gated"] = blend_gated(weights["oof-weights"], valids, y[valid], 0.5)
    weights["equal"] = dict.fromkeys(members, 1 / len(members))
    fitted = least_squares_weights(list(valids.values()), y[valid])
    weights["valid-weights"] = dict(zip(members, map(float, fitted), strict=True))
    rows = []
    for name, w in weights.items():
        v, t = (sum(wi * np.asarray(members[n][p], np.float64) for n, wi in w.items())
                for p in ("valid", "test"))  # fmt: skip
        rmse_cliff, n = cliff_rmse(y[test], t, cliffs[test])
        rows.append({"combination": name, "valid": rmse(y[valid], v), "test": rmse(y[test], t),
                     "test_cliff": rmse_cliff, "n_cliff": n,
                     "weights": {k: round(x, 4) for k, x in w.items() if x}})  # fmt: skip
    return rows


def blend_gated(weights: dict[str, float], valids: dict[str, np.ndarray], y_valid: np.ndarray,
                network_weight: float) -> dict[str, float]:  # fmt: skip
    """A screen beside ``gated``: the network joins the out-of-fold weights at
    ``network_weight`` where the blend with it, not the network alone, scores better on the
    validation rows than the members without it."""
    from smiexlm.forests.members import rmse

    others = sum(w * np.asarray(valids[n], np.float64) for n, w in weights.items() if w)
    joined = (
        network_weight * np.asarray(valids["model"], np.float64) + (1 - network_weight) * others
    )
    if rmse(y_valid, joined) >= rmse(y_valid, others):
        return dict(weights)
    return {n: w * (1 - network_weight) for n, w in weights.items()} | {"model": network_weight}


def network_scores(name: str, roots: list[Path], kept: Path) -> dict[int, dict]:
    """Each finished seed's validation and test scores of the network (and its forest) on
    set ``name``: from the run folders under ``roots``, kept compact in ``kept`` (a JSON a
    seed, four decimals: what a later run of this script reads where the runs are gone)."""
    found: dict[int, dict] = {}
    for path in sorted(kept.glob(f"{name}-seed*.json")):
        doc = json.loads(path.read_text())
        found[int(doc["seed"])] = {k: np.asarray(v) for k, v in doc.items() if k != "seed"}
    for root in roots:
        for folder in sorted((root / "runs" / name).glob("seed*")):
            if not (folder / "result.json").is_file():  # a seed still running
                continue
            npz = dict(np.load(folder / "predictions.npz"))
            seed = int(folder.name.removeprefix("seed"))
            keys = [k for k in ("valid_rows", "test_rows", "valid", "test", "valid_model",
                                "test_model", "valid_forest", "test_forest") if k in npz]  # fmt: skip
            doc = {k: np.round(npz[k].astype(np.float64), 4).tolist() if "rows" not in k
                   else npz[k].tolist() for k in keys}  # fmt: skip
            kept.mkdir(parents=True, exist_ok=True)
            (kept / f"{name}-seed{seed}.json").write_text(json.dumps({"seed": seed} | doc))
            found[seed] = {k: np.asarray(v) for k, v in doc.items()}
    return dict(sorted(found.items()))


def run_set(name: str, roots: list[Path], out: Path, n_trees: int, oof_trees: int,
            members_of=None, kept: Path | None = None) -> dict:  # fmt: skip
    """One set measured (read back when ``out`` holds it): ``members_of(task, split)`` gives
    the kernel members (:func:`kernel_members` when None), ``kept`` the folder of the network's
    compact scores (``out/network`` when None)."""
    from smiexlm.moleculenet.cliffs import task_cliffs
    from smiexlm.moleculenet.splits import make_split

    path = out / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    task = load(name)
    split = make_split(task.smiles, "scaffold")
    kernels = (members_of or kernel_members)(task, split)
    cliffs = task_cliffs(task)
    seeds = {}
    for seed, npz in network_scores(task.name, roots, kept or out / "network").items():
        if not np.array_equal(npz["test_rows"], split.test):
            sys.exit(f"{task.name} seed {seed}: its test rows are not the scaffold split's")
        seeds[f"seed{seed}"] = seed_rows(task, split, kernels, npz, cliffs, seed, n_trees,
                                          oof_trees)  # fmt: skip
    doc = {"set": name, "sizes": list(split.sizes), "oof_trees": min(n_trees, oof_trees),
           "n_cliff_molecules": int(cliffs.any(1).sum()),
           "kernels": {k: {"cv_rmse": v["cv_rmse"], "chosen": v["chosen"], "cpu_s": v["cpu_s"]}
                       for k, v in kernels.items() if k != "groups"},
           "seeds": seeds}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return doc


CHEMPROP_MEAN = 1.311  # chemprop's mean test RMSE over ESOL, FreeSolv, Lipophilicity (scaffold)


def _by_combination(doc: dict) -> dict[str, dict[str, np.ndarray]]:
    """Each combination's valid, test and test_cliff RMSE over the seeds."""
    by: dict[str, dict[str, list[float]]] = {}
    for rows in doc["seeds"].values():
        for row in rows:
            cells = by.setdefault(row["combination"], {"valid": [], "test": [], "test_cliff": []})
            for key, values in cells.items():
                values.append(row[key])
    return {name: {k: np.array(v) for k, v in cells.items()} for name, cells in by.items()}


def _cell(values: np.ndarray) -> str:
    std = f" ± {values.std(ddof=1):.3f}" if len(values) > 1 else ""
    return f"{values.mean():.3f}{std}"


def summary(docs: list[dict]) -> list[str]:
    """What ``finetune`` serves (``picked``) beside the blend served before (``fixed``), the
    Tanimoto SVR and the best member alone, each set's test RMSE (cliff molecules after)."""
    lines = ["| set | served: picked (cliff) | before: fixed (cliff) | SVR, Tanimoto on ECFP4 "
             "(cliff) | best member alone |", "|---|---|---|---|---|"]  # fmt: skip
    served = {}
    for doc in docs:
        by = _by_combination(doc)
        best = min(["model", "forest", *doc["kernels"]], key=lambda m: by[m]["test"].mean())
        served[doc["set"]] = by["picked"]["test"].mean()
        lines.append(f"| {doc['set']} | " + " | ".join(
            f"{by[c]['test'].mean():.3f} ({by[c]['test_cliff'].mean():.3f})"
            for c in ("picked", "fixed", "svr_tanimoto")) +
            f" | {best} {by[best]['test'].mean():.3f} |")  # fmt: skip
    trio = ("esol", "freesolv", "lipophilicity")
    if all(name in served for name in trio):
        mean = np.mean([served[name] for name in trio])
        lines += ["", f"Served mean test RMSE over ESOL, FreeSolv and Lipophilicity: {mean:.3f} "
                  f"(chemprop {CHEMPROP_MEAN})."]  # fmt: skip
    return lines


def report(docs: list[dict], command: str) -> str:
    lines = ["# Potency members: each alone and combined (test RMSE; on cliff molecules)", "",
             f"`{command}`", "", *summary(docs), "",
             "Mean ± sample std over seeds; the kernels are deterministic, the seeds are the "
             "network's and its forest's. Cliff: RMSE on the test molecules that form activity "
             "cliffs (count in the header). ``picked`` was chosen on BACE's pIC50, ESOL and "
             "FreeSolv and checked on Lipophilicity; its fourth candidate, ``oof-best``, came "
             "after that check and changes no set but BACE's pIC50 (benchmarks/notes).", ""]  # fmt: skip
    for doc in docs:
        by = _by_combination(doc)
        n_cliff = next(iter(doc["seeds"].values()))[0]["n_cliff"] if doc["seeds"] else 0
        lines += [f"## {doc['set']} ({'/'.join(map(str, doc['sizes']))}; {n_cliff} test cliff "
                  f"molecules; {len(doc['seeds'])} seeds)", "",
                  "| served by | valid | test | test, cliff molecules |", "|---|---|---|---|"]  # fmt: skip
        for name, cells in by.items():
            lines.append(f"| {name} | " + " | ".join(_cell(cells[k]) for k in cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, nargs="*", default=[])
    parser.add_argument("--sets", nargs="+", default=["bace_pic50"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/potency"))
    parser.add_argument("--n-trees", type=int, default=500, help="trees of each forest")
    parser.add_argument("--oof-trees", type=int, default=None,
                        help="trees of the forests refitted for out-of-fold predictions "
                        "(default: as fine-tuning, OOF_TREES)")  # fmt: skip
    args = parser.parse_args()
    from smiexlm.forests.members import OOF_TREES

    oof_trees = OOF_TREES if args.oof_trees is None else args.oof_trees
    docs = [run_set(name, args.runs, args.out, args.n_trees, oof_trees) for name in args.sets]
    text = report(docs, "python benchmarks/potency_members.py " + " ".join(sys.argv[1:]))
    (args.out / "report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
