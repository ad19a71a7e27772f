"""The nine GLUE tasks, read from GLUE's own TSV layout under ``SMIEXLM_DATA/glue/``.

GLUE's files are tab-separated but *not* CSV-quoted (sentences hold bare ``"``), some begin
with a UTF-8 byte-order mark (MRPC), some lack a final newline (CoLA dev), and CoLA's train
and dev files have no header. This loader therefore splits each line on ``\\t`` itself, reads
``utf-8-sig``, and finds columns by header name (or by GLUE's fixed positions for CoLA).

Nothing is dropped silently: a line with the wrong number of fields, or a label outside the
task's label set, is a :class:`~smiexlm.errors.DataError` that lists every bad line number
(``errors="raise"``, the default), or, with ``errors="skip"``, a warning listing them while
the good rows are kept; the skipped line numbers stay on the result.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from smiexlm.errors import ConfigError, DataError

Metric = Literal["mcc", "accuracy", "f1", "spearman", "pearson"]


@dataclass(frozen=True)
class GlueTask:
    """How one GLUE task is laid out and scored.

    ``labels`` is None for regression (STS-B). ``files`` maps split names to file names;
    ``headerless`` lists the files without a header row, with their column names."""

    name: str
    text_a: str
    text_b: str | None
    label: str
    labels: tuple[str, ...] | None
    metrics: tuple[Metric, ...]
    files: dict[str, str]
    headerless: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def is_regression(self) -> bool:
        return self.labels is None

    @property
    def num_labels(self) -> int:
        """Output width of the sequence head: 1 for regression."""
        return 1 if self.labels is None else len(self.labels)

    @property
    def primary_metric(self) -> Metric:
        """The metric the paper reports (MCC for CoLA, Spearman for STS-B, else accuracy)."""
        return self.metrics[0]


_STD = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
_COLA_COLUMNS = ("source", "label", "original_label", "sentence")

TASKS: dict[str, GlueTask] = {
    t.name: t
    for t in [
        GlueTask(
            "CoLA", "sentence", None, "label", ("0", "1"), ("mcc", "accuracy"), _STD,
            headerless={"train.tsv": _COLA_COLUMNS, "dev.tsv": _COLA_COLUMNS},
        ),
        GlueTask("SST-2", "sentence", None, "label", ("0", "1"), ("accuracy",), _STD),
        GlueTask(
            "MRPC", "#1 String", "#2 String", "Quality", ("0", "1"), ("accuracy", "f1"), _STD
        ),
        GlueTask(
            "STS-B", "sentence1", "sentence2", "score", None, ("spearman", "pearson"), _STD
        ),
        GlueTask(
            "QQP", "question1", "question2", "is_duplicate", ("0", "1"), ("accuracy", "f1"), _STD
        ),
        GlueTask(
            "MNLI", "sentence1", "sentence2", "gold_label",
            ("contradiction", "entailment", "neutral"), ("accuracy",),
            {
                "train": "train.tsv",
                "dev": "dev_matched.tsv",
                "dev_matched": "dev_matched.tsv",
                "dev_mismatched": "dev_mismatched.tsv",
                "test": "test_matched.tsv",
                "test_matched": "test_matched.tsv",
                "test_mismatched": "test_mismatched.tsv",
            },
        ),
        GlueTask(
            "QNLI", "question", "sentence", "label", ("entailment", "not_entailment"),
            ("accuracy",), _STD,
        ),
        GlueTask(
            "RTE", "sentence1", "sentence2", "label", ("entailment", "not_entailment"),
            ("accuracy",), _STD,
        ),
        GlueTask("WNLI", "sentence1", "sentence2", "label", ("0", "1"), ("accuracy",), _STD),
    ]
}  # fmt: skip

_ALIASES = {name.lower().replace("-", ""): name for name in TASKS}


def get_task(name: str) -> GlueTask:
    """The task called ``name`` (case and hyphens ignored: ``sst2``, ``STS-B``, ``mnli``)."""
    key = str(name).lower().replace("-", "").replace("_", "")
    if key not in _ALIASES:
        raise ConfigError("task", name, f"one of {', '.join(TASKS)}")
    return TASKS[_ALIASES[key]]


@dataclass
class GlueSplit:
    """Rows of one split. ``labels`` holds class indices (int) or scores (float); it is
    None for test files, which have no labels. ``line_numbers`` are 1-based file lines."""

    task: GlueTask
    split: str
    path: Path
    text_a: list[str]
    text_b: list[str] | None
    labels: list[int] | list[float] | None
    line_numbers: list[int]
    skipped_lines: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.text_a)

    def subset(self, n: int | None) -> GlueSplit:
        """The first ``n`` rows (all rows when n is None)."""
        if n is None or n >= len(self):
            return self
        return GlueSplit(
            self.task,
            self.split,
            self.path,
            self.text_a[:n],
            None if self.text_b is None else self.text_b[:n],
            None if self.labels is None else self.labels[:n],
            self.line_numbers[:n],
            self.skipped_lines,
        )


def task_path(task: GlueTask, split: str, root: Path | None = None) -> Path:
    """Where ``split`` of ``task`` lives: ``root/TASK/FILE`` (root = SMIEXLM_DATA/glue)."""
    if split not in task.files:
        raise ConfigError("split", split, f"one of {', '.join(task.files)} for {task.name}")
    if root is None:
        from smiexlm.paths import data_dir

        root = data_dir() / "glue"
    return Path(root) / task.name / task.files[split]


def load_task(
    name: str,
    split: str = "train",
    root: str | Path | None = None,
    errors: Literal["raise", "skip"] = "raise",
) -> GlueSplit:
    """Rows of ``split`` ("train", "dev", "test"; MNLI also "dev_mismatched", ...) of the
    GLUE task ``name``, read from ``root`` (default ``SMIEXLM_DATA/glue``)."""
    task = get_task(name)
    if errors not in ("raise", "skip"):
        raise ConfigError("errors", errors, "'raise' or 'skip'")
    path = task_path(task, split, None if root is None else Path(root))
    if not path.is_file():
        raise DataError(
            f"GLUE file {task.name}/{task.files[split]} is missing (looked for {str(path)!r}): "
            f"expected GLUE's download layout under the glue/ data folder"
        )
    return _parse(task, split, path, errors)


def _table_lines(task: GlueTask, path: Path) -> tuple[list[str], list[str], int]:
    """The file's lines (BOM, CR and the final newline removed), its columns, and the index
    of the first data line."""
    try:
        lines = path.read_text(encoding="utf-8-sig").split("\n")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise DataError(f"{str(path)!r} line {line}: byte {err.object[err.start]:#04x} is not "
                        "UTF-8; expected a UTF-8 TSV, as GLUE ships it") from None  # fmt: skip
    if lines and lines[-1] == "":
        lines.pop()  # final newline (CoLA dev has none)
    lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    headerless = task.headerless.get(path.name)
    if headerless is not None:
        return lines, list(headerless), 0
    if not lines:
        raise DataError(f"{str(path)!r} is empty: expected a header row")
    return lines, lines[0].split("\t"), 1


def _column_index(task: GlueTask, path: Path, columns: list[str], is_test: bool) -> dict[str, int]:
    """Field index of text_a, text_b and label (no label in a test split)."""
    index = {}
    for role, col in (("text_a", task.text_a), ("text_b", task.text_b), ("label", task.label)):
        if col is None or (role == "label" and is_test):
            continue
        if col not in columns:
            raise DataError(f"{str(path)!r} has no column {col!r} ({role}): header is {columns!r}")
        index[role] = columns.index(col)
    return index


def _label(raw: str, task: GlueTask, label_ids: dict[str, int] | None) -> tuple[Any, str | None]:
    """(label id or score, None), or (None, what is wrong with ``raw``)."""
    if label_ids is not None:
        if raw not in label_ids:
            return None, f"label {raw!r} not in {list(task.labels)}"
        return label_ids[raw], None
    try:
        score = float(raw)
    except ValueError:
        return None, f"score {raw!r} is not a number"
    if not 0.0 <= score <= 5.0:  # STS-B's similarity scale; NaN fails it too
        return None, f"score {raw!r} is outside STS-B's scale [0, 5]"
    return score, None


def _parse(task: GlueTask, split: str, path: Path, errors: str) -> GlueSplit:
    lines, columns, first = _table_lines(task, path)
    index = _column_index(task, path, columns, split.startswith("test"))
    label_ids = None if task.labels is None else {lab: i for i, lab in enumerate(task.labels)}
    text_a, text_b, labels, numbers, bad = [], [], [], [], []
    for number, line in enumerate(lines[first:], start=first + 1):
        fields = line.split("\t")
        if len(fields) != len(columns):
            bad.append((number, f"{len(fields)} fields, expected {len(columns)}"))
            continue
        if "label" in index:
            value, problem = _label(fields[index["label"]], task, label_ids)
            if problem:
                bad.append((number, problem))
                continue
            labels.append(value)
        text_a.append(fields[index["text_a"]])
        if "text_b" in index:
            text_b.append(fields[index["text_b"]])
        numbers.append(number)

    if bad:
        shown = "; ".join(f"line {n}: {why}" for n, why in bad[:20])
        more = f" (and {len(bad) - 20} more)" if len(bad) > 20 else ""
        message = f"{str(path)!r}: {len(bad)} malformed line(s): {shown}{more}"
        if errors == "raise":
            raise DataError(message)
        warnings.warn(f"skipping {message}", stacklevel=3)
    return GlueSplit(
        task,
        split,
        path,
        text_a,
        text_b if "text_b" in index else None,
        labels if "label" in index else None,
        numbers,
        [n for n, _ in bad],
    )
