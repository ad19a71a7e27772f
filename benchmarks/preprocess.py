"""Corpus pipeline throughput and memory, measured side by side in one run.

    python benchmarks/preprocess.py [--n-canon 6000] [--n-fast 300000] [--big-lines 0]
    python benchmarks/preprocess.py --descriptors 5000

Rows: RDKit parse + canonicalize alone (the per-core bound), the pipeline with
canonicalization on 1 and 2 workers, the pipeline with --no-canonicalize, and (with
--big-lines N) a memory run over an N-line input made by repeating the MOSES corpus with a
cheap per-repeat variation, run in a child process whose peak RSS is reported.
``--descriptors N`` measures instead, on N molecules: RDKit 2D descriptors alone (beside
RDKit's own ``CalcMolDescriptors`` loop, the same values), and the
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


def _cpu_seconds() -> float:
    """User + system CPU time of this process and its reaped children (pool workers)."""
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(n: int, run) -> tuple[float, float]:
    """(molecules per wall second, molecules per CPU second) of ``run()`` over n molecules."""
    cpu, wall = _cpu_seconds(), time.perf_counter()
    run()
    return n / (time.perf_counter() - wall), n / (_cpu_seconds() - cpu)


def _median(rates: list[tuple[float, float]]) -> tuple[float, float]:
    """The median of each of the two rates over the repeats."""
    wall, cpu = (sorted(column)[len(column) // 2] for column in zip(*rates, strict=True))
    return wall, cpu


def _rdkit_reference(smiles: list[str]) -> None:
    """The same 217 values the plain way: RDKit's own loop over ``descList``, a molecule at a
    time (the EState extremes each recompute the indices)."""
    from rdkit import Chem
    from rdkit.Chem import Descriptors

    for s in smiles:
        Descriptors.CalcMolDescriptors(Chem.MolFromSmiles(s))


def _descriptors(n: int) -> None:
    """Throughput with and without descriptor targets, 1 and 2 workers, on ``n`` molecules.

    Molecules per CPU second (all processes) is the per-core rate whatever else the machine
    runs; the wall-clock rates, and so the 2-worker speed-up, need otherwise idle cores."""
    from smiexlm.chemistry.fingerprints import rdkit2d_descriptors

    smiles = _moses(n)
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        vocab = SmilesTokenizer.build(smiles).save(tmp / "vocab.json")
        path = tmp / "mols.smi"
        path.write_text("\n".join(smiles) + "\n")
        load = os.getloadavg()[0]

        def pipeline(out: str, workers: int, descriptors: str | None):
            # 250-molecule chunks: 20 work units, so that 2 workers share them evenly
            return lambda: _pipeline(path, vocab, tmp / out, workers, True, descriptors, 250)

        rdkit2d_descriptors(smiles[:20])  # RDKit's first-call set-up, outside both rows
        # the two alternate, three times each on the same molecules: the median rate
        few = smiles[:1000]
        pair = [
            (_timed(len(few), lambda: _rdkit_reference(few)),
             _timed(len(few), lambda: rdkit2d_descriptors(few)))
            for _ in range(3)
        ]  # fmt: skip
        reference, ours = _median([p[0] for p in pair]), _median([p[1] for p in pair])
        rows = [
            (f"RDKit's CalcMolDescriptors ({len(few):,} molecules)", reference),
            (f"RDKit 2D descriptors alone ({len(few):,} molecules)", ours),
            ("pipeline, no descriptors, 1 worker", _timed(n, pipeline("p1", 1, None))),
            ("pipeline, --descriptors rdkit2d, 1 worker", _timed(n, pipeline("d1", 1, "rdkit2d"))),
            ("pipeline, --descriptors rdkit2d, 2 workers", _timed(n, pipeline("d2", 2, "rdkit2d"))),
        ]  # fmt: skip
        print(f"hardware: {os.cpu_count()}-core {platform.machine()} CPU")
        print(f"molecules: {n}, chunks of 250; 1-minute load average at the start: {load:.2f}, "
              f"at the end: {os.getloadavg()[0]:.2f}")  # fmt: skip
        print(f"{'measurement':<48}{'mol/s (wall)':>14}{'mol per CPU s':>15}")
        for name, (wall, cpu) in rows:
            print(f"{name:<48}{wall:>14,.0f}{cpu:>15,.1f}")
        (_, plain), (one, one_cpu), (two, two_cpu) = (r[1] for r in rows[2:])
        print(f"rdkit2d_descriptors / RDKit's own loop (CPU): {ours[1] / reference[1]:.2f}x")
        print(f"2 workers / 1 worker (wall): {two / one:.2f}x; CPU efficiency of 2 workers: "
              f"{two_cpu / one_cpu:.2f}; descriptors cost {1e3 / one_cpu - 1e3 / plain:.2f} "
              "CPU ms per molecule")  # fmt: skip


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
