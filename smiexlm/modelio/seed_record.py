"""The record a ``finetune --save-dir`` folder keeps of its seed folders: ``seeds.json``.

``predict --checkpoint DIR`` serves every ``DIR/seed<N>`` as one ensemble. Without a record,
a seed folder deleted (or damaged past reading) would shrink that ensemble silently: the
mean would move and ``<label>_std`` would shrink, with exit code 0. ``finetune`` records the
seeds it saved, adding to what the record held (several runs may fill one save-dir), and the
loader checks the record (:func:`check_seeds_kept`)::

    {"format": "smiexlm-save-dir/1", "seeds": [0, 1, 2]}

A save-dir written before the record existed has none, and loads as it did.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from smiexlm.errors import DataError
from smiexlm.paths import read_json_file, write_json

SEEDS_NAME = "seeds.json"
SEEDS_FORMAT = "smiexlm-save-dir/1"


def recorded_seeds(save_dir: Path | str) -> list[int] | None:
    """The seeds ``save_dir``'s record lists, or None when it keeps no record; DataError for
    a record that is not one."""
    path = Path(save_dir).expanduser() / SEEDS_NAME
    if not path.is_file():
        return None
    _, doc = read_json_file(path, "seed record", SEEDS_FORMAT)
    seeds = doc.get("seeds")
    if not isinstance(seeds, list) or not all(type(s) is int and s >= 0 for s in seeds):
        raise DataError(f"seed record {str(path)!r}: 'seeds' is {seeds!r}, expected a list of "
                        "seeds (integers from 0)")  # fmt: skip
    return seeds


def record_seeds(save_dir: Path | str, seeds: Iterable[int]) -> Path:
    """Add ``seeds`` (just saved in ``save_dir``) to its record, written atomically."""
    kept = set(recorded_seeds(save_dir) or []) | {int(s) for s in seeds}
    return write_json({"format": SEEDS_FORMAT, "seeds": sorted(kept)}, Path(save_dir) / SEEDS_NAME)


def check_seeds_kept(save_dir: Path | str, found: Sequence[Path | str]) -> None:
    """DataError naming the first seed folder ``save_dir``'s record lists that is not among
    ``found`` (the seed folders the loader read from it): missing, or no fine-tuned model
    any more. Nothing for a folder without a record."""
    seeds = recorded_seeds(save_dir)
    have = {Path(f).name for f in found}
    for seed in seeds or []:
        folder = Path(save_dir) / f"seed{seed}"  # where finetune --save-dir keeps it
        if folder.name in have:
            continue
        what = "is missing" if not folder.exists() else "holds no fine-tuned model"
        listed = ", ".join(map(str, seeds))
        fewer = " ".join(f"--checkpoint {str(f)!r}" for f in found)
        raise DataError(
            f"--checkpoint {str(save_dir)!r}: its seed folder {str(folder)!r} {what} (its "
            f"{SEEDS_NAME} lists seeds {listed}, saved by finetune --save-dir): expected every "
            "seed of the ensemble" + (f"; to serve fewer, name them ({fewer})" if fewer else "")
        )
