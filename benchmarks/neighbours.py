"""How good are a model's nearest neighbours? A leave-one-out k-NN vote on labelled sets.

    SMIEXLM_DATA=../shared/data python benchmarks/neighbours.py [--checkpoint DIR] [-k 10]
        [--tasks bace bbbp clintox sider] [--poolings cls mean cls+max] [--fit 20000]
        [--layers N]

Every molecule of a set is scored by the mean label of its k nearest other molecules: by
cosine on the model's embeddings (raw; whitened with the folder's stored whitening where it
has one; with ``--fit N``, whitened with one fitted here on the first N MOSES training
molecules, jointly for a combined pooling such as ``cls+max``, as ``smiexlm whiten --pooling``
fits it) and by Tanimoto on ECFP4. ROC-AUC x 100 per set (the
mean over a set's tasks), no training and no split: it measures the neighbourhoods that
``smiexlm search`` and the demo return, on more molecules than the demo's 21 drugs. Each
pooling is of the model's own blocks (its ``embedding.json``; ``--layers N``: the last N).
Molecules the model cannot embed (too long) are left out of every row alike.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def knn_auc(sim: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Mean ROC-AUC x 100 over the tasks of the k-NN vote, given an (n, n) similarity."""
    from sklearn.metrics import roc_auc_score

    sim = sim.copy()
    np.fill_diagonal(sim, -np.inf)
    nearest = np.argpartition(-sim, k, axis=1)[:, :k]  # (n, k), any order
    aucs = []
    for t in range(labels.shape[1]):
        known = ~np.isnan(labels[:, t])
        vote = np.nanmean(labels[nearest, t], axis=1)
        keep = known & ~np.isnan(vote)
        if len(np.unique(labels[keep, t])) == 2:
            aucs.append(roc_auc_score(labels[keep, t], vote[keep]))
    return 100 * float(np.mean(aucs))


def cosine(x: np.ndarray) -> np.ndarray:
    unit = x / np.linalg.norm(x, axis=1, keepdims=True).clip(min=1e-12)
    return unit @ unit.T


def tanimoto(bits: np.ndarray) -> np.ndarray:
    b = bits.astype(np.float64)
    inter = b @ b.T
    counts = b.sum(axis=1)
    return inter / (counts[:, None] + counts[None, :] - inter).clip(min=1e-12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: shipped model")
    parser.add_argument("-k", type=int, default=10)
    parser.add_argument("--tasks", nargs="+", default=["bace", "bbbp", "clintox", "sider"])
    parser.add_argument("--poolings", nargs="+", default=["cls", "mean"])
    parser.add_argument("--fit", type=int, default=0, help="MOSES molecules to fit a whitening on")
    parser.add_argument("--layers", type=int, default=None, help="the last N blocks (default: "
                        "the model's own)")  # fmt: skip
    args = parser.parse_args()
    import torch

    from smiexlm import Featurizer
    from smiexlm.chemistry.fingerprints import molecule_features
    from smiexlm.data.pipeline import read_smiles
    from smiexlm.model.pooling import last_blocks
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.paths import data_dir
    from smiexlm.whitening import fit_whitening, pooling_whitening

    torch.set_num_threads(1)
    feat = Featurizer.from_pretrained(args.checkpoint)
    n = args.layers or feat.layers
    blocks = last_blocks(n)
    fitted = {}
    if args.fit:
        corpus = read_smiles(data_dir() / "pretrain" / "moses_train.smi.gz", args.fit)
        for pooling in args.poolings:
            x = feat.featurize(corpus, pooling=pooling, layer=blocks, whiten=False, errors="nan")
            fitted[pooling] = fit_whitening(x)
    rows: dict[str, list[float]] = {}
    for name in args.tasks:
        task = load_task(name)
        variants = {}
        for pooling in args.poolings:
            raw = feat.featurize(task.smiles, pooling=pooling, layer=blocks, whiten=False,
                                 errors="nan", log_failures=False)  # fmt: skip
            variants[f"{pooling}, raw"] = raw
            whitening = pooling_whitening(feat.whitening, pooling, n)
            if whitening is not None:
                variants[f"{pooling}, whitened (stored)"] = whitening(raw)
            if pooling in fitted:
                variants[f"{pooling}, whitened (fitted on {args.fit:,})"] = fitted[pooling](raw)
        ok = ~np.isnan(next(iter(variants.values()))).any(axis=1)
        labels = task.labels[ok]
        for label, x in variants.items():
            rows.setdefault(label, []).append(knn_auc(cosine(x[ok]), labels, args.k))
        bits = molecule_features(
            [s for s, good in zip(task.smiles, ok, strict=True) if good], "ecfp4"
        )
        rows.setdefault("ECFP4 Tanimoto", []).append(knn_auc(tanimoto(bits), labels, args.k))
    print(f"model: {args.checkpoint or 'shipped default'}, last {n} block(s); {args.k}-NN "
          "leave-one-out vote, ROC-AUC")  # fmt: skip
    print("| neighbours by | " + " | ".join(args.tasks) + " | mean |")
    print("|---|" + "---|" * (len(args.tasks) + 1))
    for label, values in rows.items():
        print(
            f"| {label} | " + " | ".join(f"{v:.1f}" for v in values) + f" | {np.mean(values):.1f} |"
        )


if __name__ == "__main__":
    main()
