"""How much of MoleculeNet's chemistry the pretraining corpus covers, before and after
``smiexlm widen``.

    python benchmarks/corpus_coverage.py [--sample 50000] [--seed 0] [--steps all]
                                         [--per-molecule 1] [--fraction 1.0] [--workdir DIR]
                                         [--sets bace,bbbp,...] [--out FILE]

Draws a seeded random sample of ``--sample`` molecules from the MOSES training corpus,
widens it (the library path of ``smiexlm widen``, timed), and measures the coverage
(:mod:`smiexlm.chemistry.coverage`) of the sample, the widened sample and each MoleculeNet
set of Table 1 against both. Prints the tables and writes them, with the command and the
timings, to ``--out`` (``benchmarks/results/corpus_coverage.md``). Needs SMIEXLM_DATA.
"""

from __future__ import annotations

import argparse
import gzip
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

from smiexlm.atomic import write_text_atomic
from smiexlm.chemistry.coverage import (
    collect_facts,
    comparison_table,
    corpus_range,
    corpus_table,
    summarize,
)
from smiexlm.data.readers import iter_smiles
from smiexlm.data.widen.chem import vocabulary_tokens
from smiexlm.data.widen.exclusion import exclusion_keys
from smiexlm.data.widen.run import widen
from smiexlm.data.widen.steps import STEPS, WidenConfig
from smiexlm.moleculenet.loaders import evaluation_sets, load_task
from smiexlm.paths import data_dir

TABLE1 = ("bace", "bbbp", "clintox", "sider", "tox21", "toxcast", "muv")
RESULT = Path(__file__).resolve().parent / "results" / "corpus_coverage.md"


def _sample(n: int, seed: int, path: Path) -> Path:
    """A seeded random sample of ``n`` MOSES training molecules, written to ``path``."""
    corpus = data_dir() / "pretrain" / "moses_train.smi.gz"
    lines = list(iter_smiles(corpus))
    chosen = sorted(random.Random(seed).sample(range(len(lines)), n))
    path.write_bytes(gzip.compress("".join(lines[i] + "\n" for i in chosen).encode(), mtime=0))
    return path


def _corpus(name: str, path: Path):
    facts, invalid = collect_facts(iter_smiles(path))
    limits = corpus_range(facts)
    elements = set().union(*(f.elements for f in facts))
    return summarize(name, facts, invalid, limits), limits, elements


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", default="all")
    parser.add_argument("--per-molecule", type=int, default=1)
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--sets", default=",".join(TABLE1), help="MoleculeNet sets to measure")
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args()
    steps = STEPS if args.steps == "all" else tuple(args.steps.split(","))
    work = args.workdir or Path(tempfile.mkdtemp(prefix="corpus-coverage-"))
    work.mkdir(parents=True, exist_ok=True)
    sample = _sample(args.sample, args.seed, work / "moses_sample.smi.gz")
    started = time.time()
    excluded = exclusion_keys(evaluation_sets(), progress=True)
    key_seconds = time.time() - started
    config = WidenConfig(steps=steps, per_molecule=args.per_molecule, seed=args.seed,
                         fraction=args.fraction)  # fmt: skip
    started = time.time()
    report = widen(sample, work / "moses_sample_widened.smi.gz", config, excluded,
                   vocabulary_tokens(), progress=True)  # fmt: skip
    widen_seconds = time.time() - started
    before, limits_before, elements_before = _corpus("MOSES sample", sample)
    after, limits_after, elements_after = _corpus("widened", work / "moses_sample_widened.smi.gz")
    old, new = [], []
    for name in args.sets.split(","):
        facts, invalid = collect_facts(load_task(name, allow_download=False).smiles)
        old.append(summarize(name.upper(), facts, invalid, limits_before, elements_before))
        new.append(summarize(name.upper(), facts, invalid, limits_after, elements_after))
    text = _document(args, report, key_seconds, widen_seconds,
                     corpus_table([(before, limits_before), (after, limits_after)]),
                     comparison_table(old, new))  # fmt: skip
    print(text)
    write_text_atomic(args.out, text)


def _document(args, report, key_seconds, widen_seconds, corpora: str, sets: str) -> str:
    words = sys.argv[1:]
    for option in ("--workdir", "--out"):  # where the files go does not change the figures
        if option in words:
            del words[words.index(option) : words.index(option) + 2]
    command = "python benchmarks/corpus_coverage.py " + shlex.join(words)
    steps = "\n".join(
        f"| {name} | {c['made']:,} | {c['written']:,} | {c['duplicate']:,} | {c['excluded']:,} "
        f"| {_reasons(c['failed'])} | {_reasons(c['skipped'])} |"
        for name, c in report["steps"].items()
    )
    return f"""# Corpus coverage: MOSES before and after `smiexlm widen`

Command: `{command.strip()}` (one core, `OMP_NUM_THREADS=1`).
Widening {report["inputs"]:,} molecules took {widen_seconds:.0f} s
({1000 * widen_seconds / report["inputs"]:.1f} ms a molecule); the exclusion set
({report["exclusion_keys"]:,} keys from every MoleculeNet file) took {key_seconds:.0f} s
(0 when cached). Sample: {args.sample:,} molecules of `moses_train.smi.gz`, seed {args.seed}.
Steps: {", ".join(report["config"]["steps"])}, {args.per_molecule} product(s) per step and
molecule, each step run on a seeded {args.fraction:.0%} of the molecules.
Percentages are of each set's parsed molecules; weight is the average molecular weight of
all components; heavy atoms count all components.

## The corpora

{corpora}
## MoleculeNet (Table 1) against the corpus before → after

{sets}
## What each step did

{report["rejected_inputs"]:,} input rows rejected; {report["originals_written"]:,} originals
and {report["products_written"]:,} products written.

| step | made | written | duplicate | evaluation molecule | failed (reason: n) | nothing to do |
|---|---:|---:|---:|---:|---|---|
{steps}
"""


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v:,}" for k, v in counts.items()) or "-"


if __name__ == "__main__":
    main()
