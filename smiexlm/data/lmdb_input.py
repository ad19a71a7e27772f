"""Uni-Mol LMDB archives as input (a ``.lmdb`` file or a folder holding ``data.mdb``;
preprocessing only), behind the optional ``lmdb`` extra.

Uni-Mol stores each record as a Python pickle, and unpickling can run arbitrary code: only
read archives you trust. Nothing else smiexlm reads is ever unpickled.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from smiexlm.errors import DataError


def lmdb_chunks(path: Path, chunk_size: int, col: str | None) -> Iterator[tuple[list[int], list]]:
    """Chunks ``(record numbers, SMILES or None)`` of ``chunk_size`` records, the SMILES under
    ``col`` (default ``smi``) of each record's dict, as :func:`~smiexlm.data.readers.read_chunks`
    yields them."""
    try:
        import lmdb
    except ImportError:
        raise DataError(
            f"input {str(path)!r} is an LMDB archive: install the optional extra "
            "(pip install 'smiexlm[lmdb]')"
        ) from None
    import pickle

    key = col or "smi"
    env = lmdb.open(str(path), subdir=path.is_dir(), readonly=True, lock=False, readahead=False)
    try:
        with env.begin() as txn:
            lines: list[int] = []
            items: list[str | None] = []
            for record, (_, value) in enumerate(txn.cursor(), start=1):
                # Uni-Mol archives are pickled dicts: trusted input only (module docstring).
                entry = pickle.loads(value)  # noqa: S301
                smiles = entry.get(key) if isinstance(entry, dict) else None
                lines.append(record)
                items.append(smiles if isinstance(smiles, str) else None)
                if len(items) == chunk_size:
                    yield lines, items
                    lines, items = [], []
            if items:
                yield lines, items
    finally:
        env.close()
