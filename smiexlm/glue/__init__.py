"""GLUE: the nine tasks read from GLUE's TSV layout, their metrics, and fine-tuning."""

from smiexlm.glue.metrics import compute_metrics, majority_baseline
from smiexlm.glue.tasks import TASKS, GlueSplit, GlueTask, get_task, load_task

__all__ = [
    "TASKS",
    "GlueSplit",
    "GlueTask",
    "compute_metrics",
    "get_task",
    "load_task",
    "majority_baseline",
]
