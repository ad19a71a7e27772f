"""Execute the notebooks in place with nbclient, so that their stored outputs are fresh.

    export SMIEXLM_DATA=../shared/data
    python notebooks/execute.py                      # all notebooks, the shipped default model
    python notebooks/execute.py 03 --checkpoint DIR  # one notebook, another checkpoint
    python notebooks/execute.py --fast --out /tmp/nb # CI settings, copies written elsewhere

``--checkpoint`` sets ``SMIEXLM_NOTEBOOK_CHECKPOINT`` and ``--fast`` sets
``SMIEXLM_NOTEBOOK_FAST=1`` for the kernel; without ``--out`` the notebooks are rewritten with
their new outputs.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def notebook_paths(selection: list[str]) -> list[Path]:
    """All notebooks, or those whose file name starts with one of ``selection``."""
    paths = sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
    if selection:
        paths = [p for p in paths if any(p.name.startswith(s) for s in selection)]
    if not paths:
        raise SystemExit(f"no notebook matches {selection} in {HERE}")
    return paths


def execute(path: Path, out: Path, timeout: int = 600, kernel: str = "python3") -> float:
    """Run every cell of ``path`` (working directory: the notebooks folder), write to ``out``."""
    book = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = NotebookClient(
        book, timeout=timeout, kernel_name=kernel, resources={"metadata": {"path": str(HERE)}}
    )
    client.execute()
    elapsed = time.perf_counter() - start
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(book, out)
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", help="name prefixes, e.g. 01 03 (default: all)")
    parser.add_argument("--checkpoint", help="checkpoint folder (default: the shipped model)")
    parser.add_argument("--fast", action="store_true", help="the small CI settings")
    parser.add_argument("--out", type=Path, help="write executed copies here instead")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    if args.checkpoint:
        os.environ["SMIEXLM_NOTEBOOK_CHECKPOINT"] = str(Path(args.checkpoint).resolve())
    if args.fast:
        os.environ["SMIEXLM_NOTEBOOK_FAST"] = "1"
    for path in notebook_paths(args.notebooks):
        target = (args.out / path.name) if args.out else path
        elapsed = execute(path, target, args.timeout)
        size = target.stat().st_size / 1e6
        print(f"{path.name}: {elapsed:.1f} s, {size:.2f} MB -> {target}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
