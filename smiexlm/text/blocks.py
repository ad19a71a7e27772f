"""Text documents -> fixed-length blocks of token ids (fairseq's ``--sample-break-mode none``).

The official text run (``--tokens-per-sample 128 --sample-break-mode none``) treats the
corpus as one stream: every line is encoded and followed by ``[EOS]``, the stream is cut into
blocks of ``tokens_per_sample - 1`` tokens regardless of line or document boundaries, and
each block gets ``[BOS]`` in front. So an item holds at most ``tokens_per_sample`` ids,
starts with ``[BOS]``, and carries an ``[EOS]`` wherever a line ended inside it. The last,
shorter block is kept. ``frame="bos_eos"`` instead closes every block with its own ``[EOS]``
(``tokens_per_sample - 2`` stream tokens per block) for code that wants SMILES-like framing.

Blank lines are skipped (they would only add a lone ``[EOS]``). Lines are read from ``.txt``
or ``.txt.gz`` files as UTF-8; a file that is not valid UTF-8 is an error naming the line.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from smiexlm.data.preprocess_run import FORMAT
from smiexlm.data.shards import write_shard
from smiexlm.errors import ConfigError, DataError
from smiexlm.paths import VOCAB_NAME, file_sha256, write_json
from smiexlm.tokenizer.special import BOS_ID, EOS_ID

Frame = Literal["bos", "bos_eos"]


def read_lines(path: str | Path) -> Iterator[str]:
    """Non-blank lines of a ``.txt`` / ``.txt.gz`` file, without their newline."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"text file {str(path)!r} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                raise DataError(f"{str(path)!r} line {number} is not UTF-8: {err}") from None
            if line.strip():
                yield line


def make_blocks(
    documents: Iterable[Iterable[int]],
    tokens_per_sample: int = 128,
    frame: Frame = "bos",
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
) -> Iterator[np.ndarray]:
    """Cut the stream ``doc_0 [EOS] doc_1 [EOS] ...`` into blocks (uint16 arrays).

    ``documents`` are id sequences *without* BOS/EOS (``tokenizer.encode(text,
    add_special_tokens=False)``)."""
    if not isinstance(tokens_per_sample, int) or tokens_per_sample < 3:
        raise ConfigError("tokens_per_sample", tokens_per_sample, "an integer >= 3")
    if frame not in ("bos", "bos_eos"):
        raise ConfigError("frame", frame, "'bos' or 'bos_eos'")
    body = tokens_per_sample - (1 if frame == "bos" else 2)
    tail = [eos_id] if frame == "bos_eos" else []
    pending: list[int] = []
    for doc in documents:
        pending.extend(doc)
        pending.append(eos_id)
        if len(pending) >= body:
            full = len(pending) // body * body
            for start in range(0, full, body):
                yield np.asarray([bos_id, *pending[start : start + body], *tail], dtype=np.uint16)
            pending = pending[full:]
    if pending:
        yield np.asarray([bos_id, *pending, *tail], dtype=np.uint16)


def text_blocks(
    paths: Iterable[str | Path],
    tokenizer,
    tokens_per_sample: int = 128,
    frame: Frame = "bos",
    batch_lines: int = 1024,
) -> Iterator[np.ndarray]:
    """Blocks of the non-blank lines of ``paths`` (in order), encoded by ``tokenizer``."""

    def documents() -> Iterator[list[int]]:
        for path in paths:
            batch: list[str] = []
            for line in read_lines(path):
                batch.append(line)
                if len(batch) == batch_lines:
                    yield from _encode_lines(tokenizer, batch)
                    batch = []
            if batch:
                yield from _encode_lines(tokenizer, batch)

    return make_blocks(documents(), tokens_per_sample, frame, tokenizer.bos_id, tokenizer.eos_id)


def _encode_lines(tokenizer, lines: list[str]) -> list[list[int]]:
    # encode_many frames each line with BOS ... EOS; the stream wants the bare ids.
    return [row[1:-1] for row in tokenizer.encode_many(lines)]


def _block_hashes(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """A uint64 content hash per block (the shard format stores one per item)."""
    import hashlib

    out = np.empty(len(lengths), dtype="<u8")
    start = 0
    for i, n in enumerate(lengths.tolist()):
        digest = hashlib.blake2b(ids[start : start + n].tobytes(), digest_size=8).digest()
        out[i] = int.from_bytes(digest, "little")
        start += n
    return out


def _write_split(out: Path, split: str, blocks, shard_size: int, progress: bool) -> list[dict]:
    """The blocks of one split as shards of ``shard_size`` blocks; their records."""
    from tqdm import tqdm

    shards: list[dict] = []
    pending: list[np.ndarray] = []

    def flush() -> None:
        lengths = np.array([len(b) for b in pending], dtype=np.int64)
        ids = np.concatenate(pending).astype(np.uint16)
        name = f"{split}-{len(shards):05d}"
        shards.append(write_shard(out, name, ids, lengths, _block_hashes(ids, lengths)).to_dict())
        pending.clear()

    with tqdm(desc=f"{split} blocks", unit=" blocks", disable=not progress) as bar:
        for block in blocks:
            pending.append(block)
            bar.update(1)
            if len(pending) == shard_size:
                flush()
        if pending:
            flush()
    return shards


def build_text_dataset(
    train_inputs: Sequence[str | Path],
    valid_inputs: Sequence[str | Path],
    out_dir: str | Path,
    tokenizer,
    tokens_per_sample: int = 128,
    frame: Frame = "bos",
    shard_size: int = 1_000_000,
    progress: bool = True,
) -> dict:
    """Encode text files into the corpus pipeline's shard format (``TokenDataset`` reads it).

    ``train_inputs`` and ``valid_inputs`` are ``.txt``/``.txt.gz`` files, one paragraph per
    line; each split is its own stream of blocks. Writes ``{split}-NNNNN.bin/.idx/.hash``,
    ``vocab.json`` and ``manifest.json`` (its "molecules" counts are blocks here). Returns the
    manifest."""

    if not train_inputs:
        raise ConfigError("train_inputs", list(train_inputs), "at least one text file")
    if shard_size < 1:
        raise ConfigError("shard_size", shard_size, "a positive integer")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "manifest.json").exists():
        raise DataError(f"{str(out)!r} already holds a dataset (manifest.json): use a new folder")
    splits: dict[str, dict] = {}
    sources = []
    unk_before = tokenizer.n_unk
    for split, inputs in (("train", train_inputs), ("valid", valid_inputs)):
        blocks = text_blocks(inputs, tokenizer, tokens_per_sample, frame)
        shards = _write_split(out, split, blocks, shard_size, progress)
        splits[split] = {
            "molecules": sum(s["molecules"] for s in shards),
            "tokens": sum(s["tokens"] for s in shards),
            "shards": shards,
        }
        sources += [{"path": str(p), "role": split, "sha256": file_sha256(Path(p))} for p in inputs]
    tokenizer.save(out / VOCAB_NAME)
    manifest = {
        "format": FORMAT,
        "dtype": "uint16",
        "kind": "text-blocks",
        "molecules_out": splits["train"]["molecules"] + splits["valid"]["molecules"],
        "unk_tokens": tokenizer.n_unk - unk_before,
        "vocab_hash": tokenizer.vocab_hash,
        "vocab_size": tokenizer.vocab_size,
        "splits": splits,
        "sources": sources,
        "config": {"tokens_per_sample": tokens_per_sample, "frame": frame, "break_mode": "none"},
    }
    write_json(manifest, out / "manifest.json")
    return manifest
