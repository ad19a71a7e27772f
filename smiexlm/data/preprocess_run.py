"""One ``preprocess`` run (:func:`smiexlm.data.pipeline.preprocess` describes the whole):
:class:`PreprocessRun` holds its state, and its methods are the steps.

* progress and resume: :meth:`~PreprocessRun.open` starts a folder or continues an
  interrupted one, :meth:`~PreprocessRun.save_progress` records a commit;
* reading: :meth:`~PreprocessRun.chunks` streams the inputs and skips consumed chunks;
* dispatching: :meth:`~PreprocessRun.process` sends chunks to the workers (:func:`_work`)
  and takes their results back in submission order;
* deduplication and writing: :meth:`~PreprocessRun.handle` accounts and buffers one result,
  :meth:`~PreprocessRun.commit` writes the shards;
* :meth:`~PreprocessRun.finish` writes the manifest.
"""

from __future__ import annotations

import csv
import json
import os
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from smiexlm.chemistry.fingerprints import compute_descriptors, descriptor_version
from smiexlm.data.dedup import HashSet64
from smiexlm.data.descriptors import count_nan, finish_descriptors
from smiexlm.data.normalize import REJECT_REASONS, NormalizeConfig, process_chunk
from smiexlm.data.readers import detect_format, read_chunks
from smiexlm.data.resume import check_resume, drop_uncommitted
from smiexlm.data.shards import read_hashes, write_shard
from smiexlm.errors import DataError
from smiexlm.paths import VOCAB_NAME, file_sha256, write_json
from smiexlm.tokenizer import SmilesTokenizer
from smiexlm.tokenizer.fast import ChunkEncoder

FORMAT = "smiexlm-token-shards/1"
SPLITS = ("train", "valid")


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
    """A pool worker's setup. SIGTERM is put back to its default first: a worker forked from a
    process that handles SIGTERM (a training job's stop request) would otherwise take the
    pool's own SIGTERM at its end as a request and never exit, and the pool would wait for it
    forever."""
    global _WORKER
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_DFL)
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
class PreprocessRun:
    """Writes the dataset of ``sources`` ((path, role) pairs, role ``"valid"`` or ``"hash"``)
    into ``out`` with ``config`` (a ``PreprocessConfig``) and ``tokenizer``."""

    def __init__(self, out: Path, config, tokenizer: SmilesTokenizer, sources: list):
        self.out, self.config, self.tokenizer, self.sources = out, config, tokenizer, sources
        self.source_docs = [
            {"path": str(p), "role": role, "format": detect_format(p), "sha256": file_sha256(p)}
            for p, role in sources
        ]
        # a blank line of a SMILES file is counted, not listed; a table's row without a
        # SMILES is a row of the user's lost, listed in rejects.csv as every other
        self.line_files = {d["path"] for d in self.source_docs if d["format"] == "smi"}
        self.cfg_doc = asdict(config)
        if config.descriptors:  # another RDKit gives other columns or values: resume refuses it
            self.cfg_doc["descriptor_version"] = descriptor_version(config.descriptors)
        self.state = _State()
        self.seen = HashSet64()  # hashes of the molecules kept so far
        fraction = config.valid_fraction
        self.threshold = np.uint64(int(fraction * 2**53)) if fraction else None
        self.buffers: dict[str, list] = {s: [] for s in SPLITS}  # parts of the next shards
        self.pending = dict.fromkeys(SPLITS, 0)  # molecules in the buffers
        self.processed = 0  # rows read by this run
        self.rejects = self.writer = self.bar = None  # open while chunks are processed
        self.started = False  # whether the folder is this run's to clean up when it stops

    # ------------------------------------------------------------ progress and resume
    def open(self, resume: bool) -> dict | None:
        """Start the folder, or continue an interrupted run in it; the manifest of a run that
        had already finished, else None."""
        out, progress_path = self.out, self.out / "progress.json"
        if resume and progress_path.is_file():
            saved = json.loads(progress_path.read_text())
            check_resume(saved, self.tokenizer.vocab_hash, self.cfg_doc, self.source_docs, out)
            if saved.get("complete"):
                return json.loads((out / "manifest.json").read_text())
            self.state = _State(**saved["state"])
            self.started = True
            newer = dict.fromkeys(REJECT_REASONS, 0)  # reasons added since the run started
            self.state.rejected = newer | self.state.rejected
            drop_uncommitted(out, self.state)
        else:
            if resume and (out / "manifest.json").exists():
                raise DataError(
                    f"output folder {str(out)!r} holds a dataset without its progress.json "
                    "(made before runs kept one, or edited): --resume cannot go on from it; "
                    "choose an empty folder"
                )
            if (out / "manifest.json").exists() or progress_path.exists():
                raise DataError(
                    f"output folder {str(out)!r} already holds a dataset: pass --resume to "
                    "finish an interrupted run, or choose an empty folder"
                )
            self.started = True
            out.mkdir(parents=True, exist_ok=True)
            self.tokenizer.save(out / VOCAB_NAME)
            with open(out / "rejects.csv", "w", newline="", encoding="utf-8") as handle:
                csv.writer(handle).writerow(["source", "line", "input", "reason"])
            self.state.rejects_bytes = (out / "rejects.csv").stat().st_size
            self.save_progress()
        for split in SPLITS:
            for shard in self.state.shards[split]:
                self.seen.update(read_hashes(out, shard["name"]))
        return None

    def save_progress(self, complete: bool = False) -> None:
        doc = {
            "format": FORMAT,
            "complete": complete,
            "vocab_hash": self.tokenizer.vocab_hash,
            "config": self.cfg_doc,
            "sources": self.source_docs,
            "state": asdict(self.state),
        }
        write_json(doc, self.out / "progress.json")

    @property
    def committed(self) -> bool:
        """Whether a shard has been written (then the folder is worth resuming)."""
        return any(self.state.shards.values())

    # ------------------------------------------------------------ reading and dispatching
    def chunks(self):
        """Yield (source, role, line numbers, items) of every chunk not consumed before."""
        index, size, column = 0, self.config.chunk_size, self.config.smiles_col
        for (path, role), doc in zip(self.sources, self.source_docs, strict=True):
            for lines, items in read_chunks(path, size, column, doc["format"]):
                if index >= self.state.chunks_done:  # consumed before an interruption: skip
                    yield str(path), role, lines, items
                index += 1

    def process(self, workers: int, progress: bool) -> None:
        """Encode every chunk on ``workers`` processes, handle the results in order, commit."""
        from tqdm import tqdm

        path = self.out / "rejects.csv"
        self.rejects = open(path, "a", newline="", encoding="utf-8")  # noqa: SIM115
        self.writer = csv.writer(self.rejects)
        self.bar = tqdm(desc="preprocess", unit="mol", unit_scale=True, disable=not progress)
        try:
            if workers == 1:
                _init_worker(self.tokenizer.tokens, self.config)
                for source, role, lines, items in self.chunks():
                    self.handle(source, role, lines, _work(items))
            else:
                self._dispatch(workers)
            self.commit()
        finally:
            self.bar.close()
            self.rejects.close()

    def _dispatch(self, workers: int) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else None)
        with ctx.Pool(workers, _init_worker, (self.tokenizer.tokens, self.config)) as pool:
            inflight: deque = deque()  # bounded: memory stays flat on any input size
            for source, role, lines, items in self.chunks():
                inflight.append((source, role, lines, pool.apply_async(_work, (items,))))
                if len(inflight) >= 2 * workers + 2:
                    source_, role_, lines_, res = inflight.popleft()
                    self.handle(source_, role_, lines_, res.get())
            while inflight:
                source_, role_, lines_, res = inflight.popleft()
                self.handle(source_, role_, lines_, res.get())

    # ------------------------------------------------------------ deduplication and writing
    def handle(self, source: str, role: str, lines, work) -> None:
        """Account one chunk's result (rejects, duplicates, [UNK]s), buffer its new molecules
        by split, and commit once a split has ``shard_size`` of them."""
        state, result, desc = self.state, work[0], work[1]  # desc: (n, D) float32, or None
        state.molecules_in += result.n_rows
        self.processed += result.n_rows
        for row, text, reason in result.rejects:
            if reason != "empty" or source not in self.line_files:
                self.writer.writerow([source, lines[row], text, reason])
            state.rejected[reason] += 1
        is_new = self.seen.add_new(result.hashes)
        state.duplicates += int(len(is_new) - is_new.sum())
        keep_tok = np.repeat(is_new, result.lengths)
        ids, lengths, hashes = result.ids[keep_tok], result.lengths[is_new], result.hashes[is_new]
        desc = None if desc is None else desc[is_new]
        if len(ids):
            unk = ids == self.tokenizer.unk_id
            state.unk_tokens += int(unk.sum())
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            state.molecules_with_unk += int((np.add.reduceat(unk, offsets) > 0).sum())
        self._buffer(role, ids, lengths, hashes, desc)
        state.chunks_done += 1
        self.bar.update(result.n_rows)
        if max(self.pending.values()) >= self.config.shard_size:
            self.commit()

    def _buffer(self, role: str, ids, lengths, hashes, desc) -> None:
        """Split new molecules (``--valid-input`` files all to valid, the others by hash)."""
        if role == "valid":
            valid = np.ones(len(lengths), dtype=bool)
        elif self.threshold is None:
            valid = np.zeros(len(lengths), dtype=bool)
        else:
            valid = (hashes >> np.uint64(11)) < self.threshold
        for split, mask in (("train", ~valid), ("valid", valid)):
            if mask.any():
                rows = None if desc is None else desc[mask]
                if rows is not None:
                    count_nan(self.state.descriptor_nan, split, rows)
                part = (ids[np.repeat(mask, lengths)], lengths[mask], hashes[mask], rows)
                self.buffers[split].append(part)
                self.pending[split] += int(mask.sum())

    def commit(self) -> None:
        """Write a shard of each split with buffered molecules, then record the progress."""
        for split in SPLITS:
            if not self.buffers[split]:
                continue
            ids, lengths, hashes, desc = zip(*self.buffers[split], strict=True)
            ids, lengths, hashes = (np.concatenate(parts) for parts in (ids, lengths, hashes))
            desc = None if desc[0] is None else np.concatenate(desc)
            name = f"{split}-{len(self.state.shards[split]):05d}"
            shard = write_shard(self.out, name, ids, lengths, hashes, desc)
            self.state.shards[split].append(shard.to_dict())
            self.buffers[split].clear()
            self.pending[split] = 0
        self.rejects.flush()
        os.fsync(self.rejects.fileno())
        self.state.rejects_bytes = self.rejects.tell()
        self.save_progress()

    # ------------------------------------------------------------ the end
    def empty_error(self) -> DataError:
        """The error of a run that kept no molecule."""
        state = self.state
        rejected = ", ".join(f"{k}={v:,}" for k, v in state.rejected.items() if v) or "none"
        names = ", ".join(repr(str(p)) for p, _ in self.sources)
        return DataError(
            f"input {names} gave no molecule: {state.molecules_in:,} rows read, rejected: "
            f"{rejected}; duplicates: {state.duplicates:,}. Expected at least one valid SMILES "
            f"(one per line, or a --smiles-col column); nothing was written to {str(self.out)!r}"
        )

    def finish(self) -> dict:
        """Write the manifest (and normalise the descriptors); mark the run complete."""
        manifest = _manifest(self.state, self.tokenizer, self.cfg_doc, self.source_docs)
        if self.config.descriptors:
            manifest["descriptors"] = finish_descriptors(
                self.out, self.config.descriptors, self.state.shards, self.state.descriptor_nan
            )
        write_json(manifest, self.out / "manifest.json")
        self.save_progress(complete=True)
        return manifest


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
