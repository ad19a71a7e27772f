"""MoleculeNet: dataset registry and loaders, scaffold splits, metrics, baseline, fine-tuning.

Its modules: ``registry``/``loaders``/``task`` (the sets, their files, a typed task, the
evaluation molecules widening excludes), ``splits``, ``metrics``/``compare`` (scores and
paired bootstraps), ``configs`` (the paper's per-task settings and the default), ``finetune``
with ``targets`` (labels and scores of a run), ``finetune_outputs`` (what a seed keeps),
``backbone``/``adapt``/``features``/``ensemble``/``blend``/``forest``/``baseline``/``probe``,
``runs`` (a resumable cell per set and seed) with ``score_store`` (its compact committed
scores), ``report``, and serving: ``prediction`` (``predict``) with
``served`` (one folder's scores and blend members), ``predict_trust`` (the domain and
conformal columns), ``predict_parts``, ``folder`` and ``reference``.

``from smiexlm.moleculenet import load_task, scaffold_split`` is the stable entry point:
``load_task``/``read_task`` give a typed :class:`MoleculeTask` (what fine-tuning, the probe
and the baseline take), ``load_dataset`` a MoleculeNet set's table as a DataFrame for display. Names load lazily.
"""

from __future__ import annotations

from smiexlm.lazy import lazy_names

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
