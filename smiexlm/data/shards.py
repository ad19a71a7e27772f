"""The on-disk dataset format: indexed token shards, written atomically, read by memmap.

A dataset folder holds, per split (``train``, ``valid``) and shard number ``k``:

- ``{split}-{k:05d}.bin``  token ids, uint16 little-endian, molecules back to back
  (each ``[BOS] ... [EOS]``);
- ``{split}-{k:05d}.idx``  int64 little-endian offsets into ``.bin``, ``n + 1`` of them,
  starting at 0 (molecule ``i`` is ``bin[idx[i]:idx[i+1]]``);
- ``{split}-{k:05d}.hash`` uint64 hash of each molecule's SMILES (used for deduplication and
  for rebuilding the dedup state when a run is resumed);

plus ``manifest.json`` (counts, vocabulary hash, sources, config, shard list), ``vocab.json``
and ``rejects.csv``. Every file is written to a temporary name, flushed and renamed, so a
crash never leaves a half-written shard under its final name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from smiexlm.errors import ConfigError, DataError
from smiexlm.paths import write_bytes_atomic

Split = Literal["train", "valid"]
SHARD_SUFFIXES = (".bin", ".idx", ".hash")


def atomic_write_bytes(path: Path, payload: bytes) -> None:
    write_bytes_atomic(path, payload)


def atomic_write_json(path: Path, doc: dict) -> None:
    atomic_write_bytes(path, (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode())


@dataclass
class ShardInfo:
    name: str
    molecules: int
    tokens: int

    def to_dict(self) -> dict:
        return {"name": self.name, "molecules": self.molecules, "tokens": self.tokens}


def write_shard(
    out_dir: Path, name: str, ids: np.ndarray, lengths: np.ndarray, hashes: np.ndarray
) -> ShardInfo:
    """Write one shard (three files) atomically; ``ids`` (T,) uint16, ``lengths`` (n,)."""
    offsets = np.zeros(len(lengths) + 1, dtype="<i8")
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] != len(ids):
        raise ValueError(f"shard {name}: lengths sum to {offsets[-1]} but there are {len(ids)} ids")
    atomic_write_bytes(out_dir / f"{name}.bin", np.asarray(ids, dtype="<u2").tobytes())
    atomic_write_bytes(out_dir / f"{name}.hash", np.asarray(hashes, dtype="<u8").tobytes())
    atomic_write_bytes(out_dir / f"{name}.idx", offsets.tobytes())
    return ShardInfo(name, len(lengths), len(ids))


def read_hashes(out_dir: Path, name: str) -> np.ndarray:
    return np.fromfile(out_dir / f"{name}.hash", dtype="<u8")


class TokenDataset:
    """Random access over one split of a preprocessed dataset.

    ``dataset[i]`` is a (L,) uint16 array of token ids including BOS and EOS;
    ``dataset.lengths`` is (N,) int64 (what ``TokenBudgetSampler`` takes). Shards are
    memory-mapped, so opening a 19M-molecule split costs only its offsets."""

    def __init__(self, path: str | Path, split: Split = "train") -> None:
        self.path = Path(path)
        manifest_path = self.path / "manifest.json"
        if not manifest_path.is_file():
            raise DataError(
                f"dataset folder {str(self.path)!r} has no manifest.json: expected the output "
                "of `smiexlm preprocess` (an interrupted run is finished with --resume)"
            )
        self.manifest = json.loads(manifest_path.read_text())
        splits = self.manifest["splits"]
        if split not in splits:
            raise ConfigError("split", split, f"one of {sorted(splits)}")
        self.split = split
        self.vocab_hash: str = self.manifest["vocab_hash"]
        self._bins: list[np.ndarray] = []
        offsets: list[np.ndarray] = []
        for shard in splits[split]["shards"]:
            name = shard["name"]
            idx = np.fromfile(self.path / f"{name}.idx", dtype="<i8")
            if len(idx) != shard["molecules"] + 1:
                raise DataError(
                    f"shard {name!r} index has {len(idx) - 1} molecules: the manifest says "
                    f"{shard['molecules']}; the dataset is corrupted"
                )
            size = int(idx[-1])
            self._bins.append(
                np.memmap(self.path / f"{name}.bin", dtype="<u2", mode="r", shape=(size,))
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
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for {n} molecules")
        shard = int(np.searchsorted(self._starts, index, side="right")) - 1
        local = index - int(self._starts[shard])
        offsets = self._offsets[shard]
        return np.array(self._bins[shard][offsets[local] : offsets[local + 1]])

    def __repr__(self) -> str:
        return f"TokenDataset({str(self.path)!r}, split={self.split!r}, molecules={len(self)})"
