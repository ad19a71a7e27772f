"""MoleculeNet: dataset registry and loaders, scaffold splits, metrics, baseline, fine-tuning.

``from smiexlm.moleculenet import load_dataset, scaffold_split`` is the stable entry point.
"""

from smiexlm.moleculenet.loaders import load_csv, load_dataset
from smiexlm.moleculenet.registry import DATASETS, PAPER_TASKS, get_spec
from smiexlm.moleculenet.splits import (
    balanced_scaffold_split,
    make_split,
    random_split,
    scaffold_split,
)

__all__ = [
    "DATASETS",
    "PAPER_TASKS",
    "balanced_scaffold_split",
    "get_spec",
    "load_csv",
    "load_dataset",
    "make_split",
    "random_split",
    "scaffold_split",
]
