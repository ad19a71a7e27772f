"""Loss curves of one or several runs (``metrics.jsonl``) drawn to PNG with matplotlib."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from smiexlm.atomic import atomic_path
from smiexlm.errors import DataError


def metrics_path(run: Path) -> Path:
    """A run folder's ``metrics.jsonl``, or the path itself when it names a ``.jsonl`` file."""
    run = Path(run)
    if run.suffix == ".jsonl":
        if not run.is_file():
            raise DataError(f"metrics file {str(run)!r} does not exist")
        return run
    if not (run / "metrics.jsonl").is_file():
        raise DataError(f"run folder {str(run)!r} has no metrics.jsonl")
    return run / "metrics.jsonl"


def read_metrics(run: Path) -> list[dict]:
    """The records of a run's metrics; a resumed run's repeated steps keep the last. A last
    line cut short by a killed run is left out, as a resume leaves it out."""
    path = metrics_path(run)
    by_step: dict[int, dict] = {}
    lines = path.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines) and not line.rstrip().endswith("}"):  # cut short
                continue
            raise DataError(f"{path} line {number}: not JSON ({error})") from None
        if "step" not in record or "loss" not in record:
            raise DataError(f"{path} line {number}: expected 'step' and 'loss' keys")
        by_step[int(record["step"])] = record
    if not by_step:
        raise DataError(f"{path} holds no records")
    return [by_step[s] for s in sorted(by_step)]


def _label(run: Path) -> str:
    run = Path(run).resolve()
    return run.stem.removesuffix("_metrics") if run.suffix == ".jsonl" else run.name


PLOT_SUFFIXES = (".png", ".svg", ".pdf")  # what the curves are drawn to


def plot_run(runs: Path | Sequence[Path], output: Path | None = None) -> Path:
    """Training loss (and validation loss where measured) against step; returns the PNG path.

    One run draws to ``RUN/loss.png`` unless ``output`` is given; several runs (folders or
    their ``metrics.jsonl`` files) share one plot, one colour each, and need ``output``.
    """
    runs = [Path(runs)] if isinstance(runs, str | Path) else [Path(r) for r in runs]
    if not runs:
        raise DataError("plot-run: expected at least one run folder")
    if output is None and (len(runs) > 1 or runs[0].suffix == ".jsonl"):
        raise DataError(
            "plot-run: name the PNG to write with --out (RUN/loss.png is the default for one run "
            f"folder only; given {', '.join(map(str, runs))})"
        )
    records = {run: read_metrics(run) for run in runs}  # every run read before drawing
    output = Path(output) if output is not None else runs[0] / "loss.png"
    if output.suffix.lower() not in PLOT_SUFFIXES:
        raise DataError(f"--out {str(output)!r}: expected a picture's path ending in "
                        f"{', '.join(PLOT_SUFFIXES)}")  # fmt: skip

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_lr) = plt.subplots(
        2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    several = len(runs) > 1
    for i, (run, rows) in enumerate(records.items()):
        name, colour = _label(run), f"C{i}"
        prefix = f"{name}, " if several else ""
        steps = [r["step"] for r in rows]
        ax_loss.plot(steps, [r["loss"] for r in rows], lw=1.0 if several else 1.2,
                     alpha=0.5 if several else 1.0, color=colour, label=f"{prefix}train loss")  # fmt: skip
        valid = [(r["step"], r["valid_loss"]) for r in rows if r.get("valid_loss") is not None]
        if valid:
            ax_loss.plot(*zip(*valid, strict=True), "o-", ms=3, color=colour if several else "C1",
                         label=f"{prefix}valid loss")  # fmt: skip
        if all("lr" in r for r in rows):
            ax_lr.plot(steps, [r["lr"] for r in rows], color=colour if several else "tab:gray")
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(" vs ".join(_label(r) for r in runs))
    ax_loss.grid(alpha=0.3)
    ax_loss.legend()
    ax_lr.set_ylabel("lr")
    ax_lr.set_xlabel("step")
    ax_lr.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(output) as tmp:  # savefig picks the format from the kept suffix
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return output
