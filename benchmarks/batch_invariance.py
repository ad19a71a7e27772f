"""What batch-invariant inference costs and what it buys, side by side in one run.

    SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1 python benchmarks/batch_invariance.py \
        [--n 2000] [--repeats 3]

On the first ``--n`` BBBP molecules with the shipped default model, canonicalised and tokenised
beforehand, it times ``model.encode`` over the featurizer's token-budget batches in plain fp32
and under :func:`smiexlm.model.encoder.batch_invariant` (float64 CPU attention), alternating
the two, best of ``--repeats``. It also reports, for both, the largest change of any molecule's
embedding between its batch and a batch of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import time

import numpy as np
import pandas as pd
import torch

from smiexlm import Featurizer
from smiexlm.data.collate import collate
from smiexlm.data.sampler import token_budget_batches
from smiexlm.model.encoder import batch_invariant
from smiexlm.paths import data_dir


def embed(feat: Featurizer, rows: list[list[int]], invariant: bool) -> np.ndarray:
    out = np.empty((len(rows), feat.dim), dtype=np.float32)
    lengths = feat.inputs.encoder_lengths(rows)
    for batch in token_budget_batches(lengths, 16384, None):
        x, mask = collate([rows[j] for j in batch])
        scope = batch_invariant() if invariant else contextlib.nullcontext()
        with torch.inference_mode(), scope:
            out[batch] = feat.model.encode(x, mask, "cls").pooled.numpy()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    smiles = pd.read_csv(data_dir() / "moleculenet" / "bbbp.csv")["smiles"].tolist()
    feat = Featurizer.from_pretrained(device="cpu")
    ids, _, _ = feat.prepare(smiles[: args.n])
    rows = sorted((r for r in ids if r is not None), key=len)
    times = {False: [], True: []}
    for _ in range(args.repeats):
        for invariant in (False, True):
            start = time.perf_counter()
            embed(feat, rows, invariant)
            times[invariant].append(time.perf_counter() - start)
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s), "
          f"torch {torch.__version__}, {len(rows)} molecules")  # fmt: skip
    print("| inference | molecules/s | time ratio | max change, batch vs alone |")
    print("|---|---:|---:|---:|")
    for invariant in (False, True):
        together = embed(feat, rows, invariant)
        alone = np.concatenate([embed(feat, [r], invariant) for r in rows])
        best = min(times[invariant])
        print(f"| {'batch_invariant' if invariant else 'plain fp32'} | {len(rows) / best:,.0f} | "
              f"{best / min(times[False]):.2f}x | {np.abs(together - alone).max():.2e} |")  # fmt: skip


if __name__ == "__main__":
    main()
