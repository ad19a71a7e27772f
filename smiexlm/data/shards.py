"""The on-disk dataset format: indexed token shards, written atomically, read by memmap.

A dataset folder holds, per split (``train``, ``valid``) and shard number ``k``:

- ``{split}-{k:05d}.bin``  token ids, uint16 little-endian, molecules back to back
  (each ``[BOS] ... [EOS]``);
- ``{split}-{k:05d}.idx``  int64 little-endian offsets into ``.bin``, ``n + 1`` of them,
  starting at 0 (molecule ``i`` is ``bin[idx[i]:idx[i+1]]``);
- ``{split}-{k:05d}.hash`` uint64 hash of each molecule's SMILES (used for deduplication and
  for rebuilding the dedup state when a run is resumed);
- ``{split}-{k:05d}.desc`` (with ``--descriptors``) the (n, D) float32 descriptor rows of the
  shard's molecules in NumPy's ``.npy`` layout (see :mod:`smiexlm.data.descriptors`);

plus ``manifest.json`` (counts, vocabulary hash, sources, config, shard list), ``vocab.json``
and ``rejects.csv``. Every file is written to a temporary name, flushed and renamed, so a
crash never leaves a half-written shard under its final name.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from smiexlm.atomic import write_bytes_atomic
from smiexlm.errors import ConfigError, DataError
from smiexlm.paths import file_sha256, read_json_file

Split = Literal["train", "valid"]
SHARD_SUFFIXES = (".bin", ".idx", ".hash", ".desc")
SHA_SUFFIXES = ("bin", "idx")  # checked when a split is opened (.hash only feeds dedup)
COUNT_FIELDS = ("molecules_in", "molecules_out", "duplicates", "unk_tokens", "molecules_with_unk")


@dataclass
class ShardInfo:
    name: str
    molecules: int
    tokens: int
    sha256: dict[str, str] | None = None  # suffix ("bin", "idx", "hash") -> hex digest

    def to_dict(self) -> dict:
        doc: dict = {"name": self.name, "molecules": self.molecules, "tokens": self.tokens}
        if self.sha256 is not None:
            doc["sha256"] = self.sha256
        return doc


def write_shard(
    out_dir: Path, name: str, ids: np.ndarray, lengths: np.ndarray, hashes: np.ndarray,
    descriptors: np.ndarray | None = None,
) -> ShardInfo:  # fmt: skip
    """Write one shard (three files, four with ``descriptors`` (n, D)) atomically; ``ids``
    (T,) uint16, ``lengths`` (n,)."""
    offsets = np.zeros(len(lengths) + 1, dtype="<i8")
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] != len(ids):
        raise ValueError(f"shard {name}: lengths sum to {offsets[-1]} but there are {len(ids)} ids")
    payloads = {} if descriptors is None else {"desc": _npy_bytes(descriptors, len(lengths))}
    payloads["bin"] = np.asarray(ids, dtype="<u2").tobytes()
    payloads["hash"] = np.asarray(hashes, dtype="<u8").tobytes()
    payloads["idx"] = offsets.tobytes()
    for suffix, payload in payloads.items():  # .idx last: it is what a reader opens first
        write_bytes_atomic(out_dir / f"{name}.{suffix}", payload)
    summed = [*SHA_SUFFIXES, *(["desc"] if descriptors is not None else [])]
    digests = {suffix: hashlib.sha256(payloads[suffix]).hexdigest() for suffix in summed}
    return ShardInfo(name, len(lengths), len(ids), digests)


def _npy_bytes(rows: np.ndarray, n: int) -> bytes:
    """(n, D) float32 rows in NumPy's .npy layout (header + raw little-endian values)."""
    rows = np.ascontiguousarray(rows, dtype="<f4")
    if rows.ndim != 2 or len(rows) != n:
        raise ValueError(f"descriptor rows of shape {rows.shape}: expected ({n}, D)")
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, rows, version=(1, 0), allow_pickle=False)
    return buffer.getvalue()


def read_hashes(out_dir: Path, name: str) -> np.ndarray:
    return np.fromfile(out_dir / f"{name}.hash", dtype="<u8")


# ---------------------------------------------------------------------- validation
def _count(doc: dict, key: str, where: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataError(f"{where}: {key} = {value!r}, expected a non-negative integer")
    return value


def read_manifest(folder: Path) -> dict:
    """``folder/manifest.json``, checked for consistency: counts are non-negative integers,
    each split's totals are the sums over its shards, ``molecules_out`` is the sum of the
    splits and ``molecules_in`` = out + duplicates + rejected. Raises DataError naming the
    file and the first inconsistency."""
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        raise DataError(
            f"dataset folder {str(folder)!r} has no manifest.json: expected the output "
            "of `smiexlm preprocess` (an interrupted run is finished with --resume)"
        )
    _, doc = read_json_file(path, "dataset manifest")
    where = f"dataset manifest {str(path)!r}"
    splits = doc.get("splits")
    if not isinstance(splits, dict) or not splits:
        raise DataError(f"{where}: expected a 'splits' object with train/valid entries")
    total_out = 0
    for split, entry in splits.items():
        shards = entry.get("shards") if isinstance(entry, dict) else None
        if not isinstance(shards, list):
            raise DataError(f"{where}: split {split!r} has no 'shards' list")
        for key in ("molecules", "tokens"):
            stated = _count(entry, key, f"{where} split {split!r}")
            summed = sum(_count(s, key, f"{where} shard {s.get('name')!r}") for s in shards)
            if stated != summed:
                raise DataError(
                    f"{where}: split {split!r} says {key} = {stated:,} but its shards hold "
                    f"{summed:,}; the manifest does not describe these shards"
                )
        total_out += entry["molecules"]
    for key in COUNT_FIELDS:
        if key in doc:
            _count(doc, key, where)
    rejected = doc.get("rejected", {})
    if not isinstance(rejected, dict):
        raise DataError(f"{where}: rejected = {rejected!r}, expected an object of counts")
    n_rejected = sum(_count(rejected, key, f"{where} rejected") for key in rejected)
    if "molecules_out" in doc and doc["molecules_out"] != total_out:
        raise DataError(
            f"{where}: molecules_out = {doc['molecules_out']:,} but the splits hold {total_out:,}"
        )
    if "molecules_in" in doc:
        accounted = total_out + doc.get("duplicates", 0) + n_rejected
        if doc["molecules_in"] != accounted:
            raise DataError(
                f"{where}: molecules_in = {doc['molecules_in']:,} but out + duplicates + "
                f"rejected = {accounted:,}"
            )
    return doc


def check_shard(folder: Path, shard: dict, vocab_size: int | None) -> np.ndarray:
    """The (n + 1,) offsets of one shard after checking its files against the manifest
    entry: sizes, offsets, sha256 (when recorded) and token ids below ``vocab_size``."""
    name = shard.get("name")
    if not isinstance(name, str) or not name:
        raise DataError(f"dataset manifest in {str(folder)!r}: a shard entry has no name")
    molecules, tokens = shard["molecules"], shard["tokens"]
    idx_path, bin_path = folder / f"{name}.idx", folder / f"{name}.bin"
    for path, width, count in ((idx_path, 8, molecules + 1), (bin_path, 2, tokens)):
        if not path.is_file():
            raise DataError(f"shard file {str(path)!r} is missing: the dataset is incomplete")
        size = path.stat().st_size
        if size != width * count:
            raise DataError(
                f"shard file {str(path)!r} has {size:,} bytes: the manifest's counts need "
                f"{width * count:,}; the file is truncated or does not belong to this dataset"
            )
    digests = shard.get("sha256") or {}
    if "idx" in digests:
        _check_digest(idx_path, digests["idx"])
    idx = np.fromfile(idx_path, dtype="<i8")
    if idx[0] != 0 or idx[-1] != tokens or (len(idx) > 1 and (np.diff(idx) < 0).any()):
        raise DataError(
            f"shard file {str(idx_path)!r}: offsets must rise from 0 to {tokens:,}; "
            "the index is corrupted"
        )
    largest = _scan_bin(bin_path, digests.get("bin"))
    if vocab_size is not None and largest >= vocab_size:
        raise DataError(
            f"shard file {str(bin_path)!r} holds token id {largest}: expected ids below the "
            f"vocabulary size {vocab_size}; the shard is corrupted or from another vocabulary"
        )
    return idx


def _check_digest(path: Path, expected: str, digest: str | None = None) -> None:
    """DataError when ``path`` (whose sha256 is ``digest``, when known) is not ``expected``."""
    digest = digest or file_sha256(path)
    if digest != expected:
        raise DataError(
            f"shard file {str(path)!r} has sha256 {digest[:16]}…: the manifest records "
            f"{expected[:16]}…; the file was changed or corrupted"
        )


def _scan_bin(path: Path, expected: str | None) -> int:
    """The largest token id in a ``.bin`` file, checking its sha256 on the same pass."""
    largest = -1

    def track(block: bytes) -> None:
        nonlocal largest
        largest = max(largest, int(np.frombuffer(block, dtype="<u2").max()))

    digest = file_sha256(path, each_block=track)
    if expected is not None:
        _check_digest(path, expected, digest)
    return largest


class TokenDataset:
    """Random access over one split of a preprocessed dataset.

    ``dataset[i]`` is a (L,) uint16 array of token ids including BOS and EOS;
    ``dataset.lengths`` is (N,) int64 (what ``TokenBudgetSampler`` takes). Shards are
    memory-mapped, so opening a 19M-molecule split costs only its offsets."""

    def __init__(self, path: str | Path, split: Split = "train") -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        splits = self.manifest["splits"]
        if split not in splits:
            raise ConfigError("split", split, f"one of {sorted(splits)}")
        self.split = split
        self.vocab_hash: str = self.manifest.get("vocab_hash")  # type: ignore[assignment]
        self._bins: list[np.ndarray] = []
        offsets: list[np.ndarray] = []
        for shard in splits[split]["shards"]:
            idx = check_shard(self.path, shard, self.manifest.get("vocab_size"))
            size = int(idx[-1])
            self._bins.append(
                np.memmap(self.path / f"{shard['name']}.bin", dtype="<u2", mode="r", shape=(size,))
                if size
                else np.zeros(0, dtype="<u2")
            )
            offsets.append(idx)
        self._offsets = offsets
        counts = np.array([len(o) - 1 for o in offsets], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])  # (n_shards + 1,)
        self.lengths = (
            np.concatenate([np.diff(o) for o in offsets]) if offsets else np.zeros(0, np.int64)
        )

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index: int) -> np.ndarray:
        shard, local = locate_row(self._starts, index)
        offsets = self._offsets[shard]
        return np.array(self._bins[shard][offsets[local] : offsets[local + 1]])

    def token_counts(self, vocab_size: int) -> np.ndarray:
        """(vocab_size,) int64: how often each token id occurs in the split, BOS and EOS
        included."""
        counts = np.zeros(vocab_size, dtype=np.int64)
        for tokens in self._bins:
            for start in range(0, len(tokens), 1 << 24):  # bounded memory on a 19M corpus
                counts += np.bincount(tokens[start : start + (1 << 24)], minlength=vocab_size)
        return counts

    def __repr__(self) -> str:
        return f"TokenDataset({str(self.path)!r}, split={self.split!r}, molecules={len(self)})"


def locate_row(starts: np.ndarray, index: int) -> tuple[int, int]:
    """(shard, row within it) of molecule ``index`` (negative counts from the end) over shards
    whose first rows are ``starts`` (n_shards + 1 cumulative counts); IndexError outside."""
    n = int(starts[-1])
    if index < 0:
        index += n
    if not 0 <= index < n:
        raise IndexError(f"index {index} out of range for {n} molecules")
    shard = int(np.searchsorted(starts, index, side="right")) - 1
    return shard, index - int(starts[shard])
