"""A compact set of 64-bit hashes for deduplicating tens of millions of molecules.

Hashes live in a few sorted, unique ``uint64`` numpy runs (8 bytes per molecule: 19M
molecules take about 150 MB). A new batch is checked against every run with a binary search;
its new members become a run, and runs of similar size are merged, so there are only
O(log n) runs. With 64-bit hashes the chance of any collision among 19M molecules is ~1e-5.
"""

from __future__ import annotations

import numpy as np


class HashSet64:
    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []  # each sorted, unique uint64

    def __len__(self) -> int:
        return sum(len(r) for r in self._runs)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self._runs)

    def __contains__(self, value: int) -> bool:
        return bool(self.contains(np.array([value], dtype=np.uint64))[0])

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        """(n,) bool: which of ``hashes`` are already in the set."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        seen = np.zeros(len(hashes), dtype=bool)
        for run in self._runs:
            at = np.minimum(np.searchsorted(run, hashes), len(run) - 1)
            seen |= run[at] == hashes
        return seen

    def add_new(self, hashes: np.ndarray) -> np.ndarray:
        """Insert ``hashes`` in order; return (n,) bool, True where a hash is new (the first
        occurrence within the batch, and not seen before)."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        is_new = np.zeros(len(hashes), dtype=bool)
        if not len(hashes):
            return is_new
        unique, first = np.unique(hashes, return_index=True)
        fresh = ~self.contains(unique)
        is_new[first[fresh]] = True
        self._push(unique[fresh])
        return is_new

    def update(self, hashes: np.ndarray) -> None:
        """Insert ``hashes`` (a restored state); duplicates are ignored."""
        self.add_new(hashes)

    def _push(self, run: np.ndarray) -> None:
        if not len(run):
            return
        self._runs.append(run)
        # Merge while the newest run is at least half the size of the one before it.
        while len(self._runs) > 1 and 2 * len(self._runs[-1]) >= len(self._runs[-2]):
            last = self._runs.pop()
            merged = np.concatenate([self._runs.pop(), last])
            merged.sort(kind="stable")
            self._runs.append(merged)
