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
from smiexlm.data.normalize import REJECT_REASONS, NormalizeConfig, process_chunk
from smiexlm.data.readers import detect_format, file_sha256, read_chunks
from smiexlm.data.shards import (
    SHARD_SUFFIXES,
    ShardInfo,
    atomic_write_json,
    read_hashes,
    write_shard,
)
from smiexlm.errors import ConfigError, DataError, VocabularyMismatchError
from smiexlm.paths import check_output, is_temporary_name
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

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ConfigError("valid_fraction", self.valid_fraction, "a number in [0, 1)")
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
        return (
            f"{m['molecules_in']:,} in -> {m['molecules_out']:,} out ({splits}); "
            f"{m['duplicates']:,} duplicates; rejected: {rejected}; "
            f"[UNK] tokens: {m['unk_tokens']:,} in {m['molecules_with_unk']:,} molecules; "
            f"{self.elapsed_s:.1f} s, {self.rate:,.0f} molecules/s -> {self.out_dir}"
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
    return process_chunk(items, _WORKER[0], _WORKER[1])


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

    def handle(source, role, lines, result):
        nonlocal processed
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
                buffers[split].append((ids[np.repeat(mask, lengths)], lengths[mask], hashes[mask]))
                pending[split] += int(mask.sum())
        state.chunks_done += 1
        bar.update(result.n_rows)
        if max(pending.values()) >= config.shard_size:
            commit()

    def commit():
        for split in SPLITS:
            if not buffers[split]:
                continue
            ids, lengths, hashes = (
                np.concatenate(parts) for parts in zip(*buffers[split], strict=False)
            )
            name = f"{split}-{len(state.shards[split]):05d}"
            state.shards[split].append(write_shard(out, name, ids, lengths, hashes).to_dict())
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


def _check_resume(saved, vocab_hash, cfg_doc, source_docs, out) -> None:
    if saved.get("vocab_hash") != vocab_hash:
        raise VocabularyMismatchError(
            f"dataset {str(out)!r} was started with vocabulary hash {saved.get('vocab_hash')!r} "
            f"but this run uses {vocab_hash!r}: resume with the same vocabulary "
            f"(its copy is {str(out / 'vocab.json')!r}) or start a new folder"
        )
    saved_cfg = dict(saved["config"])
    if "max_tokens" in saved_cfg:  # a dataset started before max_length had its name
        saved_cfg["max_length"] = saved_cfg.pop("max_tokens")
    for key, value in cfg_doc.items():
        if saved_cfg.get(key) != value:
            raise ConfigError(
                key, value, f"{saved_cfg.get(key)!r}, the value the interrupted run used"
            )
    old = [(s["path"], s["role"], s["sha256"]) for s in saved["sources"]]
    new = [(s["path"], s["role"], s["sha256"]) for s in source_docs]
    if old != new:
        raise DataError(
            f"inputs {new!r} differ from those of the interrupted run {old!r} (paths, roles or "
            "sha256): resume with the same files or start a new folder"
        )


def _drop_uncommitted(out: Path, state: _State) -> None:
    """Remove what an interrupted run wrote after its last recorded commit."""
    committed = {s["name"] for split in SPLITS for s in state.shards[split]}
    for path in out.iterdir():
        stem, suffix = os.path.splitext(path.name)
        if (
            is_temporary_name(path.name)
            or path.name.endswith(".tmp")
            or (suffix in SHARD_SUFFIXES and stem.split("-")[0] in SPLITS and stem not in committed)
        ):
            path.unlink()
    with open(out / "rejects.csv", "r+b") as handle:
        handle.truncate(state.rejects_bytes)


def _remove_run(out: Path, folder_existed: bool) -> None:
    """Delete what a run that committed no shard wrote (only the pipeline's own files)."""
    if not out.is_dir():
        return
    for path in out.iterdir():
        stem, suffix = os.path.splitext(path.name)
        ours = path.name in ("vocab.json", "rejects.csv", "progress.json", "manifest.json") or (
            suffix in SHARD_SUFFIXES and stem.split("-")[0] in SPLITS
        )
        if path.is_file() and (ours or is_temporary_name(path.name)):
            path.unlink()
    if not folder_existed and not any(out.iterdir()):
        out.rmdir()


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
