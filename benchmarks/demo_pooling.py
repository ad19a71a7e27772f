"""The demo's same-family nearest-neighbour count for each pooling and embedding normalisation.

    SMIEXLM_DATA=../shared/data python benchmarks/demo_pooling.py [--checkpoint DIR] [--corpus 5000]
        [--layers -1 -2] [--poolings cls mean max cls+max]

For each encoder layer asked for (default: the last) and each pooling (default cls, mean and
max; combined ones such as ``cls+max`` put side by side, the stored whitening applied to each
part): the
21-drug panel of ``smiexlm demo`` embedded raw, centred on the mean embedding of the first N
MOSES training molecules, whitened with that corpus's principal components, and whitened
with the whitening stored in the model folder (``smiexlm whiten``), where it has one. Prints,
per variant, how many drugs have a nearest neighbour (cosine) of their own family, and the
range of those cosines. ECFP4 Tanimoto gets 15/21.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
from pathlib import Path

import numpy as np


def family_hits(x: np.ndarray, families: list[str]) -> tuple[int, float, float]:
    from smiexlm.cli.demo import cosine_matrix, nearest

    nn, cos = nearest(cosine_matrix(x))
    return sum(families[i] == families[j] for i, j in enumerate(nn)), min(cos), max(cos)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: shipped model")
    parser.add_argument("--corpus", type=int, default=5000, help="MOSES molecules to fit on")
    parser.add_argument("--layers", type=int, nargs="+", default=[-1], help="encoder blocks")
    parser.add_argument("--poolings", nargs="+", default=["cls", "mean", "max"])
    args = parser.parse_args()
    import torch

    from smiexlm import Featurizer
    from smiexlm.cli.demo import DRUG_PANEL
    from smiexlm.paths import data_dir
    from smiexlm.whitening import fit_whitening, pooling_whitening

    torch.set_num_threads(1)
    feat = Featurizer.from_pretrained(args.checkpoint)
    smiles = [s for _, s, _ in DRUG_PANEL]
    families = [f for _, _, f in DRUG_PANEL]
    with gzip.open(data_dir() / "pretrain" / "moses_train.smi.gz", "rt") as handle:
        corpus = [next(handle).strip() for _ in range(args.corpus)]
    print(f"model: {args.checkpoint or 'shipped default'}; fitted on {len(corpus):,} MOSES")
    print("| layer | pooling | normalisation | family hits / 21 | cosine range |")
    print("|---|---|---|---|---|")
    last = feat.model.config.n_layers - 1
    for layer, pooling in itertools.product(args.layers, args.poolings):
        x = feat.featurize(smiles, pooling=pooling, layer=layer, whiten=False)  # (21, d)
        c = feat.featurize(corpus, pooling=pooling, layer=layer, whiten=False)  # (N, d)
        whitening = fit_whitening(c)
        variants = {"raw": x, "centred": x - whitening.mean, "whitened": whitening(x)}
        stored = pooling_whitening(feat.whitening, pooling)
        if stored is not None and layer % (last + 1) == last:
            variants["whitened (stored)"] = stored(x)
        for name, v in variants.items():
            hits, low, high = family_hits(v, families)
            print(f"| {layer} | {pooling} | {name} | {hits} | {low:.3f}-{high:.3f} |")


if __name__ == "__main__":
    main()
