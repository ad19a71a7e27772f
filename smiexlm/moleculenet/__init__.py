"""MoleculeNet: dataset registry and loaders, scaffold splits, metrics, baseline, fine-tuning.

``from smiexlm.moleculenet import load_task, scaffold_split`` is the stable entry point:
``load_task``/``read_task`` give a typed :class:`MoleculeTask` (what fine-tuning, the probe
and the baseline take), ``load_dataset`` a MoleculeNet set's table as a DataFrame for display.
"""

from smiexlm.moleculenet.loaders import load_dataset, load_task, read_task
from smiexlm.moleculenet.registry import DATASETS, PAPER_TASKS, get_spec
from smiexlm.moleculenet.splits import (
    balanced_scaffold_split,
    make_split,
    random_split,
    scaffold_split,
)
from smiexlm.moleculenet.task import MoleculeTask

__all__ = [
    "DATASETS",
    "MoleculeTask",
    "PAPER_TASKS",
    "balanced_scaffold_split",
    "get_spec",
    "load_dataset",
    "load_task",
    "make_split",
    "random_split",
    "read_task",
    "scaffold_split",
]
