"""``preprocess``: raw SMILES files -> a deduplicated, split, sharded token dataset.

The main process streams every input in fixed-size chunks (valid-only inputs first, then the
others, in the order given). Worker processes normalise and encode chunks; results come back
in submission order, so the output is identical whatever the number of workers. The main
process deduplicates by 64-bit hash (first occurrence wins), splits by hash, and writes a
shard whenever a split has ``shard_size`` molecules at the end of a chunk.

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

import csv
import json
import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from smiexlm.data.dedup import HashSet64
from smiexlm.data.descriptors import (
    check_kind,
    compute_descriptors,
    count_nan,
    descriptor_version,
    finish_descriptors,
)
from smiexlm.data.normalize import REJECT_REASONS, NormalizeConfig, process_chunk
from smiexlm.data.readers import detect_format, file_sha256, read_chunks
from smiexlm.data.resume import check_resume as _check_resume
from smiexlm.data.resume import drop_uncommitted as _drop_uncommitted
from smiexlm.data.resume import remove_run as _remove_run
from smiexlm.data.shards import (
    ShardInfo,
    atomic_write_json,
    read_hashes,
    write_shard,
)
from smiexlm.errors import ConfigError, DataError
from smiexlm.paths import check_output
from smiexlm.tokenizer import SmilesTokenizer
from smiexlm.tokenizer.fast import ChunkEncoder

FORMAT = "smiexlm-token-shards/1"
SPLITS = ("train", "valid")


@dataclass(frozen=True)
class PreprocessConfig(NormalizeConfig):
    """Everything that decides the output (the worker count does not): the normalisation
    (the fields of :class:`NormalizeConfig`) and the splitting and sharding."""

    valid_fraction: float = 0.01  # of the hash-split inputs; --valid-input files go all to valid
    smiles_col: str | None = None  # CSV/TSV/Parquet column (LMDB key); None = guess "smiles"
    shard_size: int = 1_000_000  # molecules per shard (a shard closes at a chunk end)
    chunk_size: int = 4096  # rows per work unit
    descriptors: str | None = None  # "rdkit2d": descriptor targets per molecule (.desc shards)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ConfigError("valid_fraction", self.valid_fraction, "a number in [0, 1)")
        if self.shard_size < 1:
            raise ConfigError("shard_size", self.shard_size, "a positive integer")
        if self.chunk_size < 1:
            raise ConfigError("chunk_size", self.chunk_size, "a positive integer")
        check_kind(self.descriptors)


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
        return (
            f"{m['molecules_in']:,} in -> {m['molecules_out']:,} out ({splits}); "
            f"{m['duplicates']:,} duplicates; rejected: {rejected}; "
            f"[UNK] tokens: {m['unk_tokens']:,} in {m['molecules_with_unk']:,} molecules; "
            f"{described}{self.elapsed_s:.1f} s, {self.rate:,.0f} molecules/s -> {self.out_dir}"
        )


@dataclass
class _State:
    chunks_done: int = 0
    molecules_in: int = 0
    duplicates: int = 0
    rejected: dict = field(default_factory=lambda: dict.fromkeys(REJECT_REASONS, 0))
    unk_tokens: int = 0
    molecules_with_unk: int = 0
    shards: dict = field(default_factory=lambda: {s: [] for s in SPLITS})
    rejects_bytes: int = 0
    descriptor_nan: dict = field(default_factory=dict)  # split -> NaN values per descriptor


# ---------------------------------------------------------------------- worker side
_WORKER: tuple | None = None


def _init_worker(tokens: list[str], config: NormalizeConfig) -> None:
    global _WORKER
    try:
        from rdkit import RDLogger

        RDLogger.DisableLog("rdApp.*")
    except ImportError:  # pragma: no cover - rdkit is a dependency
        pass
    _WORKER = (config, ChunkEncoder(SmilesTokenizer(tokens)))


def _work(items: list):
    assert _WORKER is not None  # set by _init_worker (internal invariant)
    result = process_chunk(items, _WORKER[0], _WORKER[1])
    kind = getattr(_WORKER[0], "descriptors", None)
    return result, (compute_descriptors(result.smiles, kind) if kind else None)


# ---------------------------------------------------------------------- main side
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
) -> PreprocessResult:
    """Build a token dataset in ``out_dir`` from SMILES files; see the module docstring."""
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
        detect_format(path)
    source_docs = [
        {"path": str(p), "role": role, "format": detect_format(p), "sha256": file_sha256(p)}
        for p, role in sources
    ]
    cfg_doc = asdict(config)
    if config.descriptors:  # another RDKit gives other columns or values: resume refuses it
        cfg_doc["descriptor_version"] = descriptor_version(config.descriptors)
    state = _State()
    progress_path = out / "progress.json"
    folder_existed = out.exists()
    if resume and progress_path.is_file():
        saved = json.loads(progress_path.read_text())
        _check_resume(saved, tokenizer.vocab_hash, cfg_doc, source_docs, out)
        if saved.get("complete"):
            manifest = json.loads((out / "manifest.json").read_text())
            return PreprocessResult(out, manifest, 0.0, 0)
        state = _State(**saved["state"])
        state.rejected = dict.fromkeys(REJECT_REASONS, 0) | state.rejected  # newer reasons
        _drop_uncommitted(out, state)
    else:
        if (out / "manifest.json").exists() or progress_path.exists():
            raise DataError(
                f"output folder {str(out)!r} already holds a dataset: pass --resume to finish "
                "an interrupted run, or choose an empty folder"
            )
        out.mkdir(parents=True, exist_ok=True)
        tokenizer.save(out / "vocab.json")
        with open(out / "rejects.csv", "w", newline="", encoding="utf-8") as handle:
            csv.writer(handle).writerow(["source", "line", "input", "reason"])
        state.rejects_bytes = (out / "rejects.csv").stat().st_size
        _save_progress(out, state, tokenizer.vocab_hash, cfg_doc, source_docs)

    seen = HashSet64()
    for split in SPLITS:
        for shard in state.shards[split]:
            seen.update(read_hashes(out, shard["name"]))

    start = time.perf_counter()
    try:
        processed = _run(out, config, tokenizer, sources, state, seen, workers, progress,
                         cfg_doc, source_docs)  # fmt: skip
    except BaseException:
        if not any(state.shards.values()):  # nothing worth resuming: leave no trace
            _remove_run(out, folder_existed)
        raise
    elapsed = time.perf_counter() - start
    if not any(state.shards.values()):
        _remove_run(out, folder_existed)
        rejected = ", ".join(f"{k}={v:,}" for k, v in state.rejected.items() if v) or "none"
        names = ", ".join(repr(str(p)) for p, _ in sources)
        raise DataError(
            f"input {names} gave no molecule: {state.molecules_in:,} rows read, rejected: "
            f"{rejected}; duplicates: {state.duplicates:,}. Expected at least one valid SMILES "
            f"(one per line, or a --smiles-col column); nothing was written to {str(out)!r}"
        )
    manifest = _manifest(state, tokenizer, cfg_doc, source_docs)
    if config.descriptors:
        manifest["descriptors"] = finish_descriptors(
            out, config.descriptors, state.shards, state.descriptor_nan
        )
    atomic_write_json(out / "manifest.json", manifest)
    _save_progress(out, state, tokenizer.vocab_hash, cfg_doc, source_docs, complete=True)
    return PreprocessResult(out, manifest, elapsed, processed)


def _run(out, config, tokenizer, sources, state, seen, workers, progress, cfg_doc, source_docs):
    from tqdm import tqdm

    threshold = np.uint64(int(config.valid_fraction * 2**53)) if config.valid_fraction else None
    buffers: dict[str, list] = {s: [] for s in SPLITS}
    pending = dict.fromkeys(SPLITS, 0)
    rejects = open(out / "rejects.csv", "a", newline="", encoding="utf-8")  # noqa: SIM115
    writer = csv.writer(rejects)
    bar = tqdm(desc="preprocess", unit="mol", unit_scale=True, disable=not progress)
    processed = 0

    def chunks():
        index = 0
        for (path, role), doc in zip(sources, source_docs, strict=True):
            fmt = doc["format"]
            for lines, items in read_chunks(path, config.chunk_size, config.smiles_col, fmt):
                if index >= state.chunks_done:  # consumed before an interruption: skip
                    yield str(path), role, lines, items
                index += 1

    def handle(source, role, lines, work):
        nonlocal processed
        result, desc = work  # desc: (n, D) float32 descriptor rows, or None
        state.molecules_in += result.n_rows
        processed += result.n_rows
        for row, text, reason in result.rejects:
            if reason != "empty":  # blank lines are counted, not listed
                writer.writerow([source, lines[row], text, reason])
            state.rejected[reason] += 1
        is_new = seen.add_new(result.hashes)
        state.duplicates += int(len(is_new) - is_new.sum())
        keep_tok = np.repeat(is_new, result.lengths)
        ids, lengths, hashes = result.ids[keep_tok], result.lengths[is_new], result.hashes[is_new]
        desc = None if desc is None else desc[is_new]
        if len(ids):
            unk = ids == tokenizer.unk_id
            state.unk_tokens += int(unk.sum())
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            state.molecules_with_unk += int((np.add.reduceat(unk, offsets) > 0).sum())
        if role == "valid":
            valid = np.ones(len(lengths), dtype=bool)
        elif threshold is None:
            valid = np.zeros(len(lengths), dtype=bool)
        else:
            valid = (hashes >> np.uint64(11)) < threshold
        for split, mask in (("train", ~valid), ("valid", valid)):
            if mask.any():
                rows = None if desc is None else desc[mask]
                if rows is not None:
                    count_nan(state.descriptor_nan, split, rows)
                part = (ids[np.repeat(mask, lengths)], lengths[mask], hashes[mask], rows)
                buffers[split].append(part)
                pending[split] += int(mask.sum())
        state.chunks_done += 1
        bar.update(result.n_rows)
        if max(pending.values()) >= config.shard_size:
            commit()

    def commit():
        for split in SPLITS:
            if not buffers[split]:
                continue
            ids, lengths, hashes, desc = zip(*buffers[split], strict=True)
            ids, lengths, hashes = (np.concatenate(parts) for parts in (ids, lengths, hashes))
            desc = None if desc[0] is None else np.concatenate(desc)
            name = f"{split}-{len(state.shards[split]):05d}"
            shard = write_shard(out, name, ids, lengths, hashes, desc)
            state.shards[split].append(shard.to_dict())
            buffers[split].clear()
            pending[split] = 0
        rejects.flush()
        os.fsync(rejects.fileno())
        state.rejects_bytes = rejects.tell()
        _save_progress(out, state, tokenizer.vocab_hash, cfg_doc, source_docs)

    try:
        if workers == 1:
            _init_worker(tokenizer.tokens, config)
            for source, role, lines, items in chunks():
                handle(source, role, lines, _work(items))
        else:
            import multiprocessing as mp

            ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else None)
            with ctx.Pool(workers, _init_worker, (tokenizer.tokens, config)) as pool:
                inflight: deque = deque()  # bounded: memory stays flat on any input size
                for source, role, lines, items in chunks():
                    inflight.append((source, role, lines, pool.apply_async(_work, (items,))))
                    if len(inflight) >= 2 * workers + 2:
                        source_, role_, lines_, res = inflight.popleft()
                        handle(source_, role_, lines_, res.get())
                while inflight:
                    source_, role_, lines_, res = inflight.popleft()
                    handle(source_, role_, lines_, res.get())
        commit()
    finally:
        bar.close()
        rejects.close()
    return processed


def _save_progress(out, state, vocab_hash, cfg_doc, source_docs, complete=False) -> None:
    doc = {
        "format": FORMAT,
        "complete": complete,
        "vocab_hash": vocab_hash,
        "config": cfg_doc,
        "sources": source_docs,
        "state": asdict(state),
    }
    atomic_write_json(out / "progress.json", doc)


def _manifest(state: _State, tokenizer, cfg_doc, source_docs) -> dict:
    splits = {}
    for split in SPLITS:
        shards = state.shards[split]
        splits[split] = {
            "molecules": sum(s["molecules"] for s in shards),
            "tokens": sum(s["tokens"] for s in shards),
            "shards": shards,
        }
    out_count = splits["train"]["molecules"] + splits["valid"]["molecules"]
    manifest = {
        "format": FORMAT,
        "dtype": "uint16",
        "molecules_in": state.molecules_in,
        "molecules_out": out_count,
        "duplicates": state.duplicates,
        "rejected": dict(state.rejected),
        "unk_tokens": state.unk_tokens,
        "molecules_with_unk": state.molecules_with_unk,
        "vocab_hash": tokenizer.vocab_hash,
        "vocab_size": tokenizer.vocab_size,
        "splits": splits,
        "sources": source_docs,
        "config": cfg_doc,
    }
    total = out_count + state.duplicates + sum(state.rejected.values())
    if total != state.molecules_in:  # an internal accounting bug, never user input
        raise RuntimeError(f"accounting mismatch: {total} accounted for, {state.molecules_in} read")
    return manifest


__all__ = ["PreprocessConfig", "PreprocessResult", "ShardInfo", "preprocess"]
