"""fp32 against bf16 autocast: two pre-training runs' loss curves in one plot and one table.

    smiexlm pretrain --config mol_tiny_exlm --data DATA --out runs/fp32 --max-steps 300 --nproc 1 \
        precision=fp32 num_threads=1 max_tokens=4096 update_freq=1 log_every=10 valid_every=100
    smiexlm pretrain ... --out runs/bf16 ... precision=bf16 ...   (the same otherwise)
    python benchmarks/precision_curves.py runs/fp32 runs/bf16 --out curves.png

Both runs draw the same batches and masks (same seed), so the curves differ only by the
arithmetic.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from smiexlm.pretraining.plot import read_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fp32", type=Path)
    parser.add_argument("bf16", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    parser.add_argument("--every", type=int, default=50, help="table rows every N steps")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {"fp32": read_metrics(args.fp32), "bf16 autocast": read_metrics(args.bf16)}
    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, rows), width in zip(runs.items(), (4, 1.5), strict=True):  # fp32 drawn wide, under
        steps, losses = [r["step"] for r in rows], [r["loss"] for r in rows]
        ax.plot(steps, losses, lw=width, alpha=0.6 if width > 2 else 1.0, label=f"{name}, train")
        valid = [r for r in rows if r.get("valid_loss") is not None]
        ax.plot([r["step"] for r in valid], [r["valid_loss"] for r in valid], "o--",
                label=f"{name}, valid")  # fmt: skip
    ax.set_xlabel("update")
    ax.set_ylabel("loss (DAG loss per target)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    a, b = runs.values()
    print("| update | fp32 train | bf16 train | fp32 valid | bf16 valid |")
    print("|---|---|---|---|---|")
    for x, y in zip(a, b, strict=True):
        if x["step"] % args.every == 0 or x.get("valid_loss") is not None:
            fv, bv = x.get("valid_loss"), y.get("valid_loss")
            valid = f"{fv:.4f} | {bv:.4f}" if fv is not None else "– | –"
            print(f"| {x['step']} | {x['loss']:.4f} | {y['loss']:.4f} | {valid} |")


if __name__ == "__main__":
    main()
