"""Peak memory of ``smiexlm embed`` against the number of input SMILES.

    SMIEXLM_DATA=../shared/data OMP_NUM_THREADS=1 python benchmarks/embed_memory.py \
        --sizes 30000 1000000 --format npy

For each size it writes the first N SMILES of the MOSES training set as a CSV (an ``id``
column and a ``smiles`` column) in a scratch folder, runs the real command

    smiexlm embed IN.csv --out OUT.npy --device cpu

in a fresh process, and reports that process's peak resident set size (``ru_maxrss`` of the
child), its wall time and the output's shape. The model is the one shipped with the package.
Target: peak RSS at 1M SMILES within 1.2x of the peak at 30k.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# Run in a fresh interpreter: the command, then the child's peak RSS (kB on Linux).
MEASURE = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
    "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def smiexlm_command() -> str:
    beside = Path(sys.executable).with_name("smiexlm")
    return str(beside) if beside.is_file() else (shutil.which("smiexlm") or "smiexlm")


def write_input(source: Path, n: int, path: Path) -> int:
    with gzip.open(source, "rt") as src, open(path, "w") as out:
        out.write("id,smiles\n")
        count = 0
        for count, line in enumerate(src, start=1):
            out.write(f"mol{count},{line.strip()}\n")
            if count == n:
                break
    return count


def measure(input_csv: Path, out: Path) -> dict:
    cmd = [smiexlm_command(), "embed", str(input_csv), "--out", str(out), "--device", "cpu"]
    start = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-c", MEASURE, *cmd], capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - start
    rc, max_rss_kb = map(int, res.stdout.split())
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit code {rc}: {res.stderr[-2000:]}")
    shape = np.load(out, mmap_mode="r").shape if out.suffix == ".npy" else None
    return {"peak_rss_mib": max_rss_kb / 1024, "wall_s": wall, "shape": shape, "command": cmd}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[30_000, 1_000_000])
    parser.add_argument("--format", choices=("npy", "parquet"), default="npy")
    parser.add_argument("--scratch", type=Path, default=None, help="default: a temp folder")
    args = parser.parse_args()
    from smiexlm.paths import data_dir

    source = data_dir() / "pretrain" / "moses_train.smi.gz"
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="embed-memory-"))
    scratch.mkdir(parents=True, exist_ok=True)
    print(f"hardware: {platform.machine()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    results = []
    for n in args.sizes:
        input_csv = scratch / f"moses_{n}.csv"
        rows = write_input(source, n, input_csv)
        out = scratch / f"emb_{n}.{args.format}"
        result = {"n": rows, **measure(input_csv, out)}
        results.append(result)
        print(json.dumps(result), flush=True)
        input_csv.unlink()
        out.unlink()
        out.with_suffix(".ids.csv").unlink(missing_ok=True)
    base = results[0]["peak_rss_mib"]
    print("\n| SMILES | peak RSS (MiB) | ratio to the first | wall (s) |")
    print("|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['n']:,} | {r['peak_rss_mib']:.0f} | {r['peak_rss_mib'] / base:.3f} | "
              f"{r['wall_s']:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
