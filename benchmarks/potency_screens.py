"""Three screens beside the regression members (:mod:`smiexlm.forests.members`), none kept.

    export SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1
    python benchmarks/potency_screens.py descriptors --sets freesolv esol \\
        --out benchmarks/results/potency/screens
    python benchmarks/potency_screens.py gp-spread --sets freesolv esol bace_pic50 lipophilicity \\
        --out benchmarks/results/potency/screens
    python benchmarks/potency_screens.py trees --member boosted \\
        --sets freesolv esol lipophilicity bace_pic50 --out benchmarks/results/potency/screens
    python benchmarks/potency_screens.py trees --member extra \\
        --sets freesolv esol lipophilicity bace_pic50 --out benchmarks/results/potency/screens
    python benchmarks/potency_screens.py trees --member boosted --in-place-of-forest \\
        --sets freesolv esol lipophilicity bace_pic50 --out benchmarks/results/potency/screens
    python benchmarks/potency_screens.py trees --member forest-cv --in-place-of-forest \\
        --sets freesolv esol lipophilicity bace_pic50 --out benchmarks/results/potency/screens
    python benchmarks/potency_screens.py trees --member forest-cv --max-features 1.0 \\
        --in-place-of-forest --sets freesolv esol lipophilicity bace_pic50 \\
        --out benchmarks/results/potency/screens

``descriptors``: :mod:`potency_members` with a fourth kernel member, an RBF SVR on the
forest's scaled RDKit 2D features (``svr_rdkit2d``; ``C`` and ``gamma`` chosen in the same
scaffold-whole folds), every combination measured again with it among the members; writes
``descriptors/<set>.json`` and ``descriptors/report.md``.

``trees``: :mod:`potency_members` with a fourth member of trees on the forest's scaled RDKit
2D features, fitted on the training rows (fixed settings, seed 0) and refitted in the kernels'
scaffold-whole folds for its out-of-fold predictions: ``boosted`` (histogram gradient
boosting, 500 rounds at rate 0.05), ``extra`` (500 extremely randomised trees) or
``forest-cv`` (500 random-forest trees whose share of features drawn at each split,
``max_features``, is the one of ``--max-features`` of the lowest out-of-fold RMSE, 100 trees a
fold; one value: that forest, seed 0, the control of the per-seed forest served); writes
``trees-<member>/<set>.json`` and ``trees-<member>/report.md``. With ``--in-place-of-forest``
the member takes the RDKit 2D forest's place (``trees-<member>-as-forest/``).

``gp-spread``: whether a Gaussian process on the Tanimoto kernel of ECFP4 (noise chosen by
out-of-fold RMSE in the same folds) gives conformal intervals a useful spread: split-conformal
intervals at 90 % of the blend of the network and its forest (half each; the kept scores of
``benchmarks/results/potency/network``), calibrated on the validation molecules, with a
constant half-width, normalised by the GP's posterior standard deviation, or by the two
members' disagreement; each seed's mean width and test coverage. Writes ``gp_spread.json``
and ``gp_spread.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import potency_members as pm  # noqa: E402

NETWORK = Path(__file__).resolve().parent / "results" / "potency" / "network"
ALPHA = 0.1
NOISES = (0.03, 0.1, 0.3, 1.0)  # the GP's noise variance, in the standardised labels' units


def descriptors(args: argparse.Namespace) -> None:
    """potency_members with the descriptor SVR among the kernel members."""
    from smiexlm.forests.baseline import ForestFeatures
    from smiexlm.forests.kernels import KernelInputs

    def with_descriptor_svr(task, split) -> dict[str, dict]:
        out = pm.kernel_members(task, split)
        table = ForestFeatures([s.strip() for s in task.smiles], "rdkit2d", cache=True)
        inputs = KernelInputs(None, table.matrix(table.scaler(split.train)).astype(np.float64))
        out["svr_rdkit2d"] = pm.fitted_member("rbf", inputs, task, split, out["groups"])
        return out

    out = args.out / "descriptors"
    docs = [pm.run_set(name, [], out, 500, 100, with_descriptor_svr, NETWORK) for name in args.sets]
    command = "python benchmarks/potency_screens.py " + " ".join(sys.argv[1:])
    (out / "report.md").write_text(pm.report(docs, command))


#: the share of the features each split of ``forest-cv`` draws from, chosen in the folds
MAX_FEATURES = (1.0, 0.5, 0.33)


def _trees(member: str, max_features: float = 1.0, n_trees: int = 500):
    from sklearn.ensemble import (
        ExtraTreesRegressor,
        HistGradientBoostingRegressor,
        RandomForestRegressor,
    )

    if member == "boosted":
        return HistGradientBoostingRegressor(max_iter=500, learning_rate=0.05, random_state=0)
    if member == "forest-cv":
        return RandomForestRegressor(n_trees, max_features=max_features, n_jobs=1, random_state=0)
    return ExtraTreesRegressor(500, n_jobs=1, random_state=0)


def _oof(member: str, table, train, y, groups, **settings) -> np.ndarray:
    """Out-of-fold predictions (len(train), 1) of ``member`` in the kernels' scaffold-whole
    folds, the descriptors scaled on each fold's own rows."""
    from smiexlm.forests.kernels import _folds

    oof = np.full((len(train), 1), np.nan)
    for fit, held in _folds(groups, len(train)):
        x_fold = table.matrix(table.scaler(train[fit]))
        oof[held, 0] = _trees(member, **settings).fit(x_fold[train[fit]], y[train[fit]]).predict(
            x_fold[train[held]])  # fmt: skip
    return oof


def trees(args: argparse.Namespace) -> None:
    """potency_members with a member of boosted or extra trees on RDKit 2D features."""
    from smiexlm.forests.baseline import ForestFeatures
    from smiexlm.forests.members import rmse

    def with_trees(task, split) -> dict[str, dict]:
        out = pm.kernel_members(task, split)
        table = ForestFeatures([s.strip() for s in task.smiles], "rdkit2d", cache=True)
        train, valid, test = (np.asarray(p) for p in (split.train, split.valid, split.test))
        y = task.labels[:, 0].astype(np.float64)
        t0 = time.process_time()
        chosen, settings = {}, {}
        if args.member == "forest-cv":  # max_features by out-of-fold RMSE (100 trees a fold)
            oofs = {f: _oof(args.member, table, train, y, out["groups"], max_features=f,
                            n_trees=100) for f in args.max_features}  # fmt: skip
            chosen = {f"cv_rmse_max_features_{f}": rmse(y[train], o[:, 0]) for f, o in oofs.items()}
            best = min(args.max_features, key=lambda f: rmse(y[train], oofs[f][:, 0]))
            settings, oof = {"max_features": best}, oofs[best]
            chosen["max_features"] = best
        else:
            oof = _oof(args.member, table, train, y, out["groups"])
        x = table.matrix(table.scaler(train))
        fitted = _trees(args.member, **settings).fit(x[train], y[train])
        out["forest" if args.in_place_of_forest else args.member] = {
            "valid": fitted.predict(x[valid])[:, None], "test": fitted.predict(x[test])[:, None],
            "oof": oof, "cv_rmse": rmse(y[train], oof[:, 0]), "chosen": chosen,
            "cpu_s": round(time.process_time() - t0, 1),
        }  # fmt: skip
        return out

    fixed = f"-{args.max_features[0]}" if len(args.max_features) == 1 else ""  # a control
    out = args.out / f"trees-{args.member}{fixed}{'-as-forest' if args.in_place_of_forest else ''}"
    docs = [pm.run_set(name, [], out, 500, 100, with_trees, NETWORK) for name in args.sets]
    command = "python benchmarks/potency_screens.py " + " ".join(sys.argv[1:])
    (out / "report.md").write_text(pm.report(docs, command))


def _gp(k_train: np.ndarray, y: np.ndarray, noise: float):
    """The posterior of a GP of kernel ``k_train`` (unit prior variance) on standardised ``y``
    with ``noise``: a function of (N, n_train) kernel rows to (mean, standard deviation) in
    the labels' units."""
    mean, scale = y.mean(), y.std()
    factor = np.linalg.cholesky(k_train + noise * np.eye(len(k_train)))
    weights = np.linalg.solve(factor.T, np.linalg.solve(factor, (y - mean) / scale))

    def posterior(k_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        v = np.linalg.solve(factor, k_rows.T)
        variance = np.maximum(1.0 - (v * v).sum(axis=0) + noise, 1e-12)
        return k_rows @ weights * scale + mean, np.sqrt(variance) * scale

    return posterior


def _conformal(y_valid, p_valid, s_valid, y_test, p_test, s_test) -> tuple[float, float]:
    """(mean width, test coverage) of split-conformal intervals at 1 - ALPHA, spread ``s``."""
    from smiexlm.trust.conformal import conformal_quantile

    q = conformal_quantile(np.abs(y_valid - p_valid) / s_valid, ALPHA)
    return float(np.mean(2 * q * s_test)), float(np.mean(np.abs(y_test - p_test) <= q * s_test))


def gp_spread(args: argparse.Namespace) -> None:
    import pandas as pd

    from smiexlm.chemistry.fingerprints import bit_tanimoto, morgan_fingerprints
    from smiexlm.forests.kernels import _folds
    from smiexlm.moleculenet.splits import make_split, murcko_scaffolds
    from smiexlm.trust.conformal import difficulty

    docs = []
    for name in args.sets:
        task = pm.load(name)
        split = make_split(task.smiles, "scaffold")
        train, valid, test = (np.asarray(p) for p in (split.train, split.valid, split.test))
        bits = morgan_fingerprints([s.strip() for s in task.smiles])
        y = task.labels[:, 0].astype(np.float64)
        scaffolds = murcko_scaffolds([task.smiles[i] for i in train])
        groups = pd.factorize(pd.Series(scaffolds).fillna(""))[0]
        k = bit_tanimoto(bits[train], bits[train])
        cv = {}
        for noise in NOISES:
            oof = np.empty(len(train))
            for fit, held in _folds(groups, len(train)):
                oof[held] = _gp(k[np.ix_(fit, fit)], y[train][fit], noise)(k[np.ix_(held, fit)])[0]
            cv[noise] = float(np.sqrt(np.mean((oof - y[train]) ** 2)))
        noise = min(cv, key=cv.get)
        posterior = _gp(k, y[train], noise)
        (_, gp_valid), (gp_mean, gp_test) = (posterior(bit_tanimoto(bits[r], bits[train]))
                                             for r in (valid, test))  # fmt: skip
        doc = {"set": name, "noise": noise, "cv_rmse": cv,
               "gp_test_rmse": float(np.sqrt(np.mean((gp_mean - y[test]) ** 2))), "seeds": {}}  # fmt: skip
        for seed, kept in pm.network_scores(name, [], NETWORK).items():
            part = {p: (kept[f"{p}_model"][:, 0], kept[f"{p}_forest"][:, 0]) for p in ("valid", "test")}  # fmt: skip
            blend = {p: 0.5 * (a + b) for p, (a, b) in part.items()}
            spreads = {"constant": (np.ones(len(valid)), np.ones(len(test))),
                       "gp": (gp_valid, gp_test),
                       "members": tuple(difficulty([a, b])[:, 0] for a, b in part.values())}  # fmt: skip
            doc["seeds"][seed] = {
                s: _conformal(y[valid], blend["valid"], sv, y[test], blend["test"], st)
                for s, (sv, st) in spreads.items()
            }
        docs.append(doc)
        print(name, json.dumps(doc["seeds"]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gp_spread.json").write_text(json.dumps(docs, indent=1))
    lines = ["# A GP's spread for conformal intervals (90 %): mean width (test coverage)", "",
             f"`python benchmarks/potency_screens.py {' '.join(sys.argv[1:])}`", "",
             "| set | constant | normalised by the GP's std | by the members' disagreement |",
             "|---|---|---|---|"]  # fmt: skip
    for doc in docs:
        cells = []
        for spread in ("constant", "gp", "members"):
            width, cover = np.mean([s[spread] for s in doc["seeds"].values()], axis=0)
            cells.append(f"{width:.3f} ({100 * cover:.0f} %)")
        lines.append(f"| {doc['set']} | " + " | ".join(cells) + " |")
    lines += ["", "Mean over the seeds of the network and its forest (the GP is deterministic)."]
    (args.out / "gp_spread.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("descriptors", "gp-spread", "trees"):
        p = sub.add_parser(name)
        p.add_argument("--sets", nargs="+", default=["freesolv", "esol"])
        p.add_argument("--out", type=Path, default=Path("benchmarks/results/potency/screens"))
        if name == "trees":
            p.add_argument("--member", choices=("boosted", "extra", "forest-cv"),
                           default="boosted")  # fmt: skip
            p.add_argument("--in-place-of-forest", action="store_true")
            p.add_argument("--max-features", type=float, nargs="+", default=list(MAX_FEATURES),
                           help="forest-cv's candidates (one: that value, a control)")  # fmt: skip
    args = parser.parse_args()
    {"descriptors": descriptors, "gp-spread": gp_spread, "trees": trees}[args.command](args)


if __name__ == "__main__":
    main()
