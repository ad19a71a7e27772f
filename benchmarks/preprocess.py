"""Corpus pipeline throughput and memory, measured side by side in one run.

    python benchmarks/preprocess.py [--n-canon 6000] [--n-fast 300000] [--big-lines 0]

Rows: RDKit parse + canonicalize alone (the per-core bound), the pipeline with
canonicalization on 1 and 2 workers, the pipeline with --no-canonicalize, and (with
--big-lines N) a memory run over an N-line input made by repeating the MOSES corpus with a
cheap per-repeat variation, run in a child process whose peak RSS is reported.
Needs SMIEXLM_DATA (pretrain/moses_train.smi.gz). Temporary files go to the system temp dir.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from smiexlm.data import PreprocessConfig, preprocess
from smiexlm.paths import data_dir
from smiexlm.tokenizer import SmilesTokenizer


def _moses(n: int) -> list[str]:
    with gzip.open(data_dir() / "pretrain" / "moses_train.smi.gz", "rt") as handle:
        return [line.strip() for line in itertools.islice(handle, n)]


def _rdkit_bound(smiles: list[str]) -> float:
    from rdkit import Chem

    start = time.perf_counter()
    for s in smiles:
        Chem.MolToSmiles(Chem.MolFromSmiles(s))
    return len(smiles) / (time.perf_counter() - start)


def _pipeline(path: Path, vocab: Path, out: Path, workers: int, canonicalize: bool) -> float:
    config = PreprocessConfig(canonicalize=canonicalize, valid_fraction=0.01)
    result = preprocess([path], out, config, vocab=vocab, workers=workers, progress=False)
    return result.rate


_BIG_SCRIPT = """
import resource, sys, time
from smiexlm.data import PreprocessConfig, preprocess
config = PreprocessConfig(canonicalize=False, valid_fraction=0.01)
r = preprocess([sys.argv[1]], sys.argv[2], config, vocab=sys.argv[3], progress=False)
print(r.summary())
print("peak_rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def _big(lines: int, vocab: Path, tmp: Path) -> str:
    base = _moses(2_000_000)
    path = tmp / "big.smi"
    with open(path, "w") as handle:
        written, rep = 0, 0
        while written < lines:
            suffix = "." + "C" * (rep + 1) if rep else ""  # each repeat is a new set of strings
            take = base[: lines - written]
            handle.write("\n".join(s + suffix for s in take) + "\n")
            written += len(take)
            rep += 1
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _BIG_SCRIPT, str(path), str(tmp / "big-out"), str(vocab)],
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    return proc.stdout.strip() + f"\nwall_s {wall:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-canon", type=int, default=6000)
    parser.add_argument("--n-fast", type=int, default=300_000)
    parser.add_argument("--big-lines", type=int, default=0)
    args = parser.parse_args()
    smiles = _moses(max(args.n_canon, args.n_fast))
    hardware = f"{os.cpu_count()}-core {platform.machine()} CPU"
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        vocab = SmilesTokenizer.build(smiles).save(tmp / "vocab.json")
        canon = tmp / "canon.smi"
        canon.write_text("\n".join(smiles[: args.n_canon]) + "\n")
        fast = tmp / "fast.smi"
        fast.write_text("\n".join(smiles[: args.n_fast]) + "\n")
        bound = _rdkit_bound(smiles[: args.n_canon])
        one = _pipeline(canon, vocab, tmp / "c1", 1, True)
        two = _pipeline(canon, vocab, tmp / "c2", 2, True)
        raw = _pipeline(fast, vocab, tmp / "f1", 1, False)
        print(f"hardware: {hardware}; molecules: {args.n_canon} canonicalized, {args.n_fast} raw")
        print(f"{'measurement':<44}{'molecules/s':>14}{'ratio':>10}")
        print(f"{'RDKit parse+canonicalize (1 core, bound)':<44}{bound:>14,.0f}{1:>10.2f}")
        print(f"{'pipeline, canonicalize, 1 worker':<44}{one:>14,.0f}{one / bound:>10.2f}")
        print(
            f"{'pipeline, canonicalize, 2 workers':<44}{two:>14,.0f}{two / one:>10.2f}  (vs 1 worker)"
        )
        print(f"{'pipeline, --no-canonicalize, 1 worker':<44}{raw:>14,.0f}")
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak RSS of this process: {rss:.0f} MB")
        if args.big_lines:
            print(f"--- memory run, {args.big_lines:,} lines, --no-canonicalize, 1 worker ---")
            print(_big(args.big_lines, vocab, tmp))


if __name__ == "__main__":
    main()
