"""Uni-Mol LMDB archives as input (a ``.lmdb`` file or a folder holding ``data.mdb``;
preprocessing only), behind the optional ``lmdb`` extra.

Uni-Mol stores each record as a Python pickle, and unpickling can run arbitrary code: only
read archives you trust. Nothing else smiexlm reads is ever unpickled.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from smiexlm.errors import DataError, first_line


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
    try:
        env = lmdb.open(str(path), subdir=path.is_dir(), readonly=True, lock=False,
                        readahead=False)  # fmt: skip
    except lmdb.Error as err:
        raise DataError(f"input {str(path)!r} is not a readable LMDB archive ({first_line(err)}): "
                        "expected a Uni-Mol style archive of pickled records") from None  # fmt: skip
    try:
        with env.begin() as txn:
            lines: list[int] = []
            items: list[str | None] = []
            for record, (_, value) in enumerate(txn.cursor(), start=1):
                # Uni-Mol archives are pickled dicts: trusted input only (module docstring).
                try:
                    entry = pickle.loads(value)  # noqa: S301
                except Exception as err:  # pickle raises many types for bytes it cannot read
                    raise DataError(f"input {str(path)!r} record {record} is not a pickled "
                                    f"record ({type(err).__name__}: {first_line(err)}): expected "
                                    f"a dict with the SMILES under {key!r}") from None  # fmt: skip
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
