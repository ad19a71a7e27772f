"""MoleculeNet: the sets, their splits and scores, the runs and the reports.

Its modules: ``registry``/``loaders``/``task`` (the sets, their files, a typed task, the
evaluation molecules widening excludes), ``splits``, ``metrics``/``compare`` (scores and
paired bootstraps), ``cliffs`` (activity cliffs and the RMSE on their molecules), ``runs`` (a
resumable cell per set and seed) with ``score_store`` (its compact committed scores) and
``report``. The paper's per-task settings (Table 8) are data,
``smiexlm/configs/finetune/moleculenet.toml``, read by :mod:`smiexlm.finetuning.config`.
Fine-tuning on a set is :mod:`smiexlm.finetuning` (``adapter``, ``probe``, ``ensemble``), its
forests :mod:`smiexlm.forests`, and ``predict`` :mod:`smiexlm.serving.prediction`.

``from smiexlm.moleculenet import load_task, scaffold_split`` is the stable entry point:
``load_task``/``read_task`` give a typed :class:`MoleculeTask` (what fine-tuning, the probe
and the baseline take), ``load_dataset`` a MoleculeNet set's table as a DataFrame for display. Names load lazily.
"""

from __future__ import annotations

from smiexlm.core.lazy import lazy_names

_LAZY = {
    "load_dataset": "smiexlm.moleculenet.loaders",
    "load_task": "smiexlm.moleculenet.loaders",
    "read_task": "smiexlm.moleculenet.loaders",
    "DATASETS": "smiexlm.moleculenet.registry",
    "PAPER_TASKS": "smiexlm.moleculenet.registry",
    "get_spec": "smiexlm.moleculenet.registry",
    "balanced_scaffold_split": "smiexlm.moleculenet.splits",
    "make_split": "smiexlm.moleculenet.splits",
    "random_split": "smiexlm.moleculenet.splits",
    "scaffold_split": "smiexlm.moleculenet.splits",
    "MoleculeTask": "smiexlm.moleculenet.task",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_names(__name__, _LAZY)
