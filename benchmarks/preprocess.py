"""Corpus pipeline throughput and memory, measured side by side in one run.

    python benchmarks/preprocess.py [--n-canon 6000] [--n-fast 300000] [--big-lines 0]
    python benchmarks/preprocess.py --descriptors 5000

Rows: RDKit parse + canonicalize alone (the per-core bound), the pipeline with
canonicalization on 1 and 2 workers, the pipeline with --no-canonicalize, and (with
--big-lines N) a memory run over an N-line input made by repeating the MOSES corpus with a
cheap per-repeat variation, run in a child process whose peak RSS is reported.
``--descriptors N`` measures instead, on N molecules: RDKit 2D descriptors alone, and the
pipeline (canonicalize on) without descriptors, with ``--descriptors rdkit2d`` on 1 worker
and on 2 workers, in molecules/s and molecules/s per core.
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


def _pipeline(
    path: Path, vocab: Path, out: Path, workers: int, canonicalize: bool, descriptors=None,
    chunk_size: int = 4096,
) -> float:  # fmt: skip
    config = PreprocessConfig(
        canonicalize=canonicalize, valid_fraction=0.01, descriptors=descriptors,
        chunk_size=chunk_size,
    )  # fmt: skip
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


def _descriptors(n: int) -> None:
    """Throughput with and without descriptor targets, 1 and 2 workers, on ``n`` molecules."""
    from smiexlm.fingerprints import rdkit2d_descriptors

    smiles = _moses(n)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        vocab = SmilesTokenizer.build(smiles).save(tmp / "vocab.json")
        path = tmp / "mols.smi"
        path.write_text("\n".join(smiles) + "\n")
        load = os.getloadavg()[0]
        start = time.perf_counter()
        rdkit2d_descriptors(smiles[:500])
        bound = 500 / (time.perf_counter() - start)
        # 250-molecule chunks: 20 work units, so that 2 workers share them evenly
        plain = _pipeline(path, vocab, tmp / "p1", 1, True, None, 250)
        one = _pipeline(path, vocab, tmp / "d1", 1, True, "rdkit2d", 250)
        two = _pipeline(path, vocab, tmp / "d2", 2, True, "rdkit2d", 250)
        print(f"hardware: {os.cpu_count()}-core {platform.machine()} CPU")
        print(f"molecules: {n}, chunks of 250; 1-minute load average at the start: {load:.2f}, "
              f"at the end: {os.getloadavg()[0]:.2f}")  # fmt: skip
        print(f"{'measurement':<52}{'molecules/s':>12}{'per core':>10}")
        rows = [
            ("RDKit 2D descriptors alone (500 molecules, 1 core)", bound, bound),
            ("pipeline, canonicalize, no descriptors, 1 worker", plain, plain),
            ("pipeline, --descriptors rdkit2d, 1 worker", one, one),
            ("pipeline, --descriptors rdkit2d, 2 workers", two, two / 2),
        ]
        for name, rate, per_core in rows:
            print(f"{name:<52}{rate:>12,.0f}{per_core:>10,.0f}")
        print(f"2 workers / 1 worker with descriptors: {two / one:.2f}x; "
              f"cost of the descriptors: {1e3 / one - 1e3 / plain:.2f} ms per molecule")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n-canon", type=int, default=6000)
    parser.add_argument("--n-fast", type=int, default=300_000)
    parser.add_argument("--big-lines", type=int, default=0)
    parser.add_argument("--descriptors", type=int, default=0, metavar="N")
    args = parser.parse_args()
    if args.descriptors:
        _descriptors(args.descriptors)
        return
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
