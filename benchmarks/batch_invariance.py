"""What batch-invariant inference costs and what it buys, side by side in one run.

    SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1 python benchmarks/batch_invariance.py \
        [--n 10000] [--source moses] [--repeats 2]

On the first ``--n`` molecules of ``--source`` (MOSES training SMILES, BBBP or ESOL) with
the shipped default model and its own embedding (cls+mean+max, 384 wide), canonicalised and
tokenised beforehand, it times ``model.encode`` over the featurizer's token-budget batches,
the variants alternating, best of ``--repeats`` by process CPU time:

- plain fp32;
- float64 attention over the padded batch and no padding of small products (the served path
  before);
- served: :func:`smiexlm.model.encoder.batch_invariant` (attention per group of one length,
  without padding or mask, in SDPA's fp32 kernel; small matrix products padded to 16 rows).

For each it reports the largest change of any embedding coordinate between a molecule's batch
and a batch of its own, and how many molecules changed at all. Then the corpus whitening of the
served embeddings: one (n, d) @ (d, d) float64 product (as before) against one product per row
(served), their time and the same two figures, and ``featurize`` end to end (whitened) for scale.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import itertools
import platform
import time
from collections.abc import Callable, Iterator

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from smiexlm import Featurizer
from smiexlm.data.collate import collate
from smiexlm.data.sampler import token_budget_batches
from smiexlm.model import encoder
from smiexlm.paths import data_dir
from smiexlm.whitening import pooling_whitening


def read_source(source: str, n: int) -> list[str]:
    if source != "moses":  # a MoleculeNet set (ESOL holds molecules of 1 to 3 atoms)
        return pd.read_csv(data_dir() / "moleculenet" / f"{source}.csv")["smiles"].tolist()[:n]
    with gzip.open(data_dir() / "pretrain" / "moses_train.smi.gz", "rt") as handle:
        return [line.strip() for line in itertools.islice(handle, n)]


def padded_float64(q, k, v, key_mask):
    """The previous served attention: float64 SDPA over the padded batch."""
    y = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=key_mask)
    return y.float()


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    if name == "plain fp32":
        yield
        return
    saved = encoder.attention_by_length, encoder.linear
    if name.startswith("float64 attention, padded"):
        encoder.attention_by_length, encoder.linear = padded_float64, F.linear
    try:
        with encoder.batch_invariant():
            yield
    finally:
        encoder.attention_by_length, encoder.linear = saved


VARIANTS = ("plain fp32", "float64 attention, padded batch (before)", "served (batch_invariant)")


def embed(feat: Featurizer, rows: list[list[int]], name: str) -> np.ndarray:
    out = np.empty((len(rows), feat.dim), dtype=np.float32)
    lengths = feat.inputs.encoder_lengths(rows)
    for batch in token_budget_batches(lengths, 16384, None):
        x, mask = collate([rows[j] for j in batch])
        with torch.inference_mode(), variant(name):
            out[batch] = feat.model.encode(x, mask, feat.pooling, feat.blocks).pooled.numpy()
    return out


def best_cpu(repeats: int, runs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Best process CPU seconds of each run, the runs alternating."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.process_time()
            run()
            times[name].append(time.process_time() - start)
    return {name: min(t) for name, t in times.items()}


def changes(together: np.ndarray, alone: np.ndarray) -> str:
    diff = np.abs(together - alone).max(axis=1)
    return f"{diff.max():.2e} | {int((diff > 0).sum()):,}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--source", choices=("moses", "bbbp", "esol"), default="moses")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    smiles = read_source(args.source, args.n)
    feat = Featurizer.from_pretrained(device="cpu")
    ids, _, _ = feat.prepare(smiles)
    rows = sorted((r for r in ids if r is not None), key=len)
    cpu = best_cpu(args.repeats, {v: lambda v=v: embed(feat, rows, v) for v in VARIANTS})
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} thread(s), "
          f"torch {torch.__version__}, {len(rows):,} {args.source} molecules, pooling "
          f"{feat.pooling} ({feat.dim} wide), best of {args.repeats} by CPU time\n")  # fmt: skip
    print("| inference | molecules per CPU s | time ratio | max change, batch vs alone | "
          "molecules changed |\n|---|---:|---:|---:|---:|")  # fmt: skip
    for name in VARIANTS:
        together = embed(feat, rows, name)
        alone = np.concatenate([embed(feat, [r], name) for r in rows])
        print(f"| {name} | {len(rows) / cpu[name]:,.0f} | {cpu[name] / cpu[VARIANTS[0]]:.2f}x | "
              f"{changes(together, alone)} |")  # fmt: skip
    raw = embed(feat, rows, VARIANTS[-1])
    w = pooling_whitening(feat.whitening, feat.pooling, feat.layers)
    mean, matrix = w.mean.astype(np.float64), w.matrix.astype(np.float64)
    products = {
        "one (n, d) product (before)": lambda x: ((x - mean) @ matrix).astype(np.float32),
        "one product per row (served)": w,
    }
    wcpu = best_cpu(args.repeats, {name: lambda f=f: f(raw) for name, f in products.items()})
    end_to_end = best_cpu(args.repeats, {"featurize": lambda: feat.featurize(smiles)})
    print(f"\nwhitening of the served embeddings; `featurize` end to end (whitened): "
          f"{end_to_end['featurize']:.2f} CPU s\n")  # fmt: skip
    print("| whitening | CPU ms | share of featurize | max change, batch vs alone | "
          "molecules changed |\n|---|---:|---:|---:|---:|")  # fmt: skip
    for name, f in products.items():
        alone = np.concatenate([f(raw[i : i + 1]) for i in range(len(raw))])
        share = wcpu[name] / end_to_end["featurize"]
        print(f"| {name} | {1e3 * wcpu[name]:,.0f} | {share:.1%} | {changes(f(raw), alone)} |")


if __name__ == "__main__":
    main()
