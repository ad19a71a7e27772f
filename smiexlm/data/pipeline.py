"""``preprocess``: raw SMILES files -> a deduplicated, split, sharded token dataset.

The main process streams every input in fixed-size chunks (valid-only inputs first, then the
others, in the order given). Worker processes normalise and encode chunks; results come back
in submission order, so the output is identical whatever the number of workers. The main
process deduplicates by 64-bit hash (first occurrence wins), splits by hash, and writes a
shard whenever a split has ``shard_size`` molecules at the end of a chunk (by default a
million, 50,000 with descriptors).

Resuming: after each shard, ``progress.json`` records how many chunks were consumed, the
counters, the shard list and the length of ``rejects.csv``, all written atomically after the
shard files. A resumed run drops anything written after that point, rebuilds the dedup set
from the committed shards' ``.hash`` files and skips the consumed chunks, so it finishes
with exactly the molecules (and byte-identical shards) of an uninterrupted run.

With ``descriptors="rdkit2d"`` the workers also compute the descriptors of each kept molecule;
they are written with its token shard and normalised on the train split at the end
(:mod:`smiexlm.data.descriptors`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from smiexlm.chemistry.fingerprints import check_descriptor_kind
from smiexlm.data.normalize import NormalizeConfig
from smiexlm.data.preprocess_run import SPLITS, PreprocessRun
from smiexlm.data.readers import detect_format, iter_smiles
from smiexlm.data.resume import remove_run as _remove_run
from smiexlm.errors import ConfigError, DataError
from smiexlm.paths import check_output
from smiexlm.tokenizer import SmilesTokenizer

#: molecules per shard: progress is committed a shard at a time, so an interrupted run loses
#: at most the molecules of its unfinished shards. A million tokenised molecules are minutes of
#: work; with descriptors (7-20 ms a molecule and core) they would be hours, hence the smaller
#: default there (50,000 molecules: 6-17 minutes of one core).
SHARD_SIZE = 1_000_000
DESCRIPTOR_SHARD_SIZE = 50_000


@dataclass(frozen=True)
class PreprocessConfig(NormalizeConfig):
    """Everything that decides the output (the worker count does not): the normalisation
    (the fields of :class:`NormalizeConfig`) and the splitting and sharding."""

    valid_fraction: float = 0.01  # of the hash-split inputs; --valid-input files go all to valid
    smiles_col: str | None = None  # CSV/TSV/Parquet column (LMDB key); None = guess "smiles"
    # molecules per shard (a shard closes at a chunk end); None: SHARD_SIZE, or
    # DESCRIPTOR_SHARD_SIZE with descriptors (a run commits a shard at a time)
    shard_size: int | None = None
    chunk_size: int = 4096  # rows per work unit
    descriptors: str | None = None  # "rdkit2d": descriptor targets per molecule (.desc shards)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ConfigError("valid_fraction", self.valid_fraction, "a number in [0, 1)")
        check_descriptor_kind(self.descriptors)
        if self.shard_size is None:
            default = DESCRIPTOR_SHARD_SIZE if self.descriptors else SHARD_SIZE
            object.__setattr__(self, "shard_size", default)  # recorded, so resume compares it
        if self.shard_size < 1:
            raise ConfigError("shard_size", self.shard_size, "a positive integer")
        if self.chunk_size < 1:
            raise ConfigError("chunk_size", self.chunk_size, "a positive integer")


@dataclass
class PreprocessResult:
    out_dir: Path
    manifest: dict
    elapsed_s: float
    molecules_processed: int  # rows read by this call (less than molecules_in after --resume)

    @property
    def rate(self) -> float:
        return self.molecules_processed / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def summary(self) -> str:
        m = self.manifest
        rejected = ", ".join(f"{k}={v}" for k, v in m["rejected"].items() if v) or "none"
        splits = ", ".join(f"{s}={m['splits'][s]['molecules']:,}" for s in SPLITS)
        desc = m.get("descriptors")
        nan = sum(sum(c.values()) for c in desc["nan"].values()) if desc else 0
        described = f"{desc['count']} descriptors ({nan:,} NaN values); " if desc else ""
        tokens = sum(m["splits"][s]["tokens"] for s in SPLITS)
        return (
            f"{m['molecules_in']:,} in -> {m['molecules_out']:,} out ({splits}); "
            f"{m['duplicates']:,} duplicates; rejected: {rejected}; "
            f"[UNK] tokens: {m['unk_tokens']:,} ({m['unk_tokens'] / max(tokens, 1):.3%} of "
            f"{tokens:,}) in {m['molecules_with_unk']:,} molecules; "
            f"{described}{self.elapsed_s:.1f} s, {self.rate:,.0f} molecules/s -> {self.out_dir}"
        )


MAX_UNKNOWN = 0.01  # the share of [UNK] tokens a vocabulary may leave in a corpus's first molecules
SAMPLE_MOLECULES = 5000  # how many first molecules that share is measured on


def check_vocabulary_fits(
    tokenizer: SmilesTokenizer, vocab: str | Path | None, sources: Sequence[tuple[Path, str]],
    smiles_col: str | None, max_unknown: float = MAX_UNKNOWN,
) -> float:  # fmt: skip
    """The share of [UNK] tokens ``tokenizer`` gives the first :data:`SAMPLE_MOLECULES`
    SMILES of ``sources``; DataError above ``max_unknown``: a dataset built with a vocabulary
    of another corpus (or of an empty one) would be mostly ``[UNK]`` and train nothing."""
    from smiexlm.data.readers import read_chunks, split_smiles_line
    from smiexlm.errors import InvalidSmilesError
    from smiexlm.tokenizer.smiles import split_smiles

    if isinstance(max_unknown, bool) or not 0 <= max_unknown <= 1:
        raise ConfigError("--max-unknown", max_unknown, "a share of tokens in [0, 1]")
    sample: list[str] = []
    for path, _ in sources:  # the rows preprocessing would reject are left out here too
        for _, items in read_chunks(path, 4096, smiles_col):
            for item in items:
                try:
                    text = (split_smiles_line(item.decode("utf-8"))[0]
                            if isinstance(item, bytes) else (item or "").strip())  # fmt: skip
                    if text and split_smiles(text):
                        sample.append(text)
                except (UnicodeDecodeError, InvalidSmilesError):
                    continue
            if len(sample) >= SAMPLE_MOLECULES:
                break
    sample = sample[:SAMPLE_MOLECULES]
    share, read = 1.0 - tokenizer.coverage(sample), len(sample)
    if share > max_unknown:
        name = "the shipped vocabulary" if vocab is None else f"--vocab {str(vocab)!r}"
        raise DataError(
            f"{name} leaves {share:.1%} of the tokens of the first {read:,} molecules unknown "
            f"([UNK]; {tokenizer.vocab_size} tokens in it): expected at most {max_unknown:.1%} "
            "(--max-unknown); build one from this corpus with `smiexlm vocab build`"
        )
    return share


def preprocess(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    config: PreprocessConfig | None = None,
    *,
    valid_inputs: Sequence[str | Path] = (),
    vocab: str | Path | None = None,
    workers: int = 1,
    resume: bool = False,
    progress: bool = True,
    max_unknown: float = MAX_UNKNOWN,
) -> PreprocessResult:
    """Build a token dataset in ``out_dir`` from SMILES files; see the module docstring.
    Before any is written, DataError when ``vocab`` leaves more than ``max_unknown`` of the
    tokens of the inputs' first molecules unknown (:func:`check_vocabulary_fits`)."""
    config = config or PreprocessConfig()
    if workers < 1:
        raise ConfigError("workers", workers, "a positive integer")
    if not inputs and not valid_inputs:
        raise ConfigError("inputs", list(inputs), "at least one input file")
    tokenizer = SmilesTokenizer.load(vocab) if vocab else SmilesTokenizer()
    out = check_output(out_dir, "--out", "folder")
    sources = [(Path(p), "valid") for p in valid_inputs] + [(Path(p), "hash") for p in inputs]
    for path, _ in sources:
        if not path.exists():
            raise DataError(f"input {str(path)!r} does not exist")
        if detect_format(path) == "smi" and config.smiles_col is not None:
            raise DataError(
                f"--smiles-col {config.smiles_col!r}: input {str(path)!r} is read as a SMILES "
                "file (.smi, .smiles, .txt: a SMILES and a name a line, no columns); expected a "
                "table (.csv, .tsv, .parquet, gzipped or not) to pick a column from: rename a "
                "tab-separated file to .tsv"
            )
    check_vocabulary_fits(tokenizer, vocab, sources, config.smiles_col, max_unknown)
    run = PreprocessRun(out, config, tokenizer, sources)
    folder_existed = out.exists()
    try:  # an interrupt while the folder is being started is cleaned up too
        finished = run.open(resume)
        if finished is not None:
            return PreprocessResult(out, finished, 0.0, 0)
        start = time.perf_counter()
        run.process(workers, progress)
    except BaseException:
        if run.started and not run.committed:  # nothing worth resuming: leave no trace
            _remove_run(out, folder_existed)
        raise
    elapsed = time.perf_counter() - start
    if not run.committed:
        _remove_run(out, folder_existed)
        raise run.empty_error()
    return PreprocessResult(out, run.finish(), elapsed, run.processed)


__all__ = ["PreprocessConfig", "PreprocessResult", "preprocess"]


def read_smiles(path: Path, max_molecules: int | None = None) -> list[str]:
    """The first ``max_molecules`` non-blank SMILES of a file that ``smiexlm preprocess``
    reads (one per line, optionally gzipped, or a table with a SMILES column)."""
    smiles = (s for s in iter_smiles(Path(path), what="--smiles-file") if s)
    out = list(islice(smiles, max_molecules))
    if not out:
        raise DataError(
            f"--smiles-file {str(path)!r}: no SMILES found; expected one per line or a "
            "table with a SMILES column"
        )
    return out
