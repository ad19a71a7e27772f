"""Loss curves of a run (``RUN_DIR/metrics.jsonl``) drawn to PNG with matplotlib."""

from __future__ import annotations

import json
from pathlib import Path

from smiexlm.errors import DataError
from smiexlm.paths import atomic_path


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of ``RUN_DIR/metrics.jsonl``; a resumed run's repeated steps keep the last."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"run folder {str(run_dir)!r} has no metrics.jsonl")
    by_step: dict[int, dict] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path} line {number}: not JSON ({error})") from None
        if "step" not in record or "loss" not in record:
            raise DataError(f"{path} line {number}: expected 'step' and 'loss' keys")
        by_step[int(record["step"])] = record
    if not by_step:
        raise DataError(f"{path} holds no records")
    return [by_step[s] for s in sorted(by_step)]


def plot_run(run_dir: Path, output: Path | None = None) -> Path:
    """Training loss (and validation loss where measured) against step; returns the PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    output = Path(output) if output is not None else Path(run_dir) / "loss.png"
    fig, (ax_loss, ax_lr) = plt.subplots(
        2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    steps = [r["step"] for r in records]
    ax_loss.plot(steps, [r["loss"] for r in records], label="train loss", lw=1.2)
    valid = [(r["step"], r["valid_loss"]) for r in records if r.get("valid_loss") is not None]
    if valid:
        ax_loss.plot(*zip(*valid, strict=True), "o-", label="valid loss", ms=3)
    ax_loss.set_ylabel("loss")
    ax_loss.set_title(Path(run_dir).resolve().name)
    ax_loss.grid(alpha=0.3)
    ax_loss.legend()
    if all("lr" in r for r in records):
        ax_lr.plot(steps, [r["lr"] for r in records], color="tab:gray")
    ax_lr.set_ylabel("lr")
    ax_lr.set_xlabel("step")
    ax_lr.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(output) as tmp:  # savefig picks the format from the kept suffix
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return output
