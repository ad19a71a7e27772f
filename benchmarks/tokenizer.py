"""SMILES tokenizer throughput: smiexlm's batch encoding (ids + padding) against DeepChem.

    SMIEXLM_DATA=../shared/data python benchmarks/tokenizer.py [--n N] [--repeats 3]

Reads every SMILES of Tox21, ToxCast, HIV and MUV (about 150k), then times, side by side in
one run and on one thread: DeepChem's ``BasicSmilesTokenizer.tokenize`` (strings only),
smiexlm's ``encode_batch`` to padded id tensors (batches of 1,024, and one call over
everything), and the exact pure-Python ``encode``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import time

FILES = ["tox21.csv", "toxcast.csv.gz", "hiv.csv.gz", "muv.csv.gz"]


def best_of(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n", type=int, default=None, help="the first N SMILES only (default: all)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from smiexlm.data.readers import iter_smiles
    from smiexlm.paths import data_dir
    from smiexlm.tokenizer import SmilesTokenizer

    root = data_dir() / "moleculenet"
    every = (s for name in FILES for s in iter_smiles(root / name) if s)
    smiles = list(itertools.islice(every, args.n))
    n = len(smiles)

    from deepchem.feat.smiles_tokenizer import BasicSmilesTokenizer

    reference = BasicSmilesTokenizer()
    tok = SmilesTokenizer()

    def deepchem_tokenize():
        for s in smiles:
            reference.tokenize(s)

    def ours_chunks(size=1024):
        for i in range(0, n, size):
            tok.encode_batch(smiles[i : i + size])

    def ours_single_call():
        tok.encode_batch(smiles)

    def ours_python():
        for s in smiles:
            tok.encode(s)

    r = args.repeats
    rows = [("DeepChem BasicSmilesTokenizer.tokenize (strings)", *best_of(deepchem_tokenize, r))]
    rows.append(("smiexlm encode_batch, batches of 1024 (ids+pad)", *best_of(ours_chunks, r)))
    rows.append(("smiexlm encode_batch, one call (ids+pad)", *best_of(ours_single_call, r)))
    rows.append(("smiexlm encode, pure Python, one at a time (ids)", *best_of(ours_python, r)))
    base = rows[0][1]
    print(
        f"{n:,} SMILES ({'' if args.n is None else 'the first of '}Tox21, ToxCast, HIV, MUV); "
        f"python {platform.python_version()}, "
        f"{os.cpu_count()}-core {platform.machine()} CPU, one thread"
    )
    print(f"{'method':52s} {'best s':>8s} {'median s':>9s} {'SMILES/s':>11s} {'vs DeepChem':>11s}")
    for name, best, median in rows:
        print(f"{name:52s} {best:8.3f} {median:9.3f} {n / best:11,.0f} {base / best:10.2f}x")


if __name__ == "__main__":
    main()
