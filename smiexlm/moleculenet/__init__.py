"""MoleculeNet: dataset registry and loaders, scaffold splits, metrics, baseline, fine-tuning.

Its modules: ``registry``/``loaders``/``task`` (the sets, their files, a typed task, the
evaluation molecules widening excludes), ``splits``, ``metrics``/``compare`` (scores and
paired bootstraps), ``configs`` (the paper's per-task settings and the default), ``finetune``
with ``backbone``/``adapt``/``features``/``ensemble``/``blend``/``forest``/``baseline``/``probe``,
``runs`` (a resumable cell per set and seed) with ``score_store`` (its compact committed
scores), ``report``, ``hpopt*`` (the search), and serving: ``prediction``/``predict_parts``/
``folder``/``reference``.

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
