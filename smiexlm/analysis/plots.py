"""PNG figures of the analyses (matplotlib, Agg backend; imported only when writing)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from smiexlm.atomic import atomic_path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _grid(ax, table: dict[str, dict[str, Any]], title: str, fmt: str, cmap: str) -> None:
    """A k × p heatmap with the value in each cell; missing cells grey (as Figures 3–5)."""
    import numpy as np

    ks = sorted(table, key=int)
    ps = sorted({p for row in table.values() for p in row}, key=float)
    values = np.full((len(ks), len(ps)), np.nan)
    for i, k in enumerate(ks):
        for j, p in enumerate(ps):
            v = table[k].get(p)
            if v is not None and math.isfinite(v):
                values[i, j] = v
    masked = np.ma.masked_invalid(values)
    colormap = _pyplot().get_cmap(cmap)
    colormap = colormap.with_extremes(bad="#d9d9d9")
    ax.imshow(masked, cmap=colormap, aspect="auto")
    for i in range(len(ks)):
        for j in range(len(ps)):
            if not np.isnan(values[i, j]):
                ax.text(j, i, format(values[i, j], fmt), ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(ps)), [f"{float(p):.3g}" for p in ps])
    ax.set_yticks(range(len(ks)), ks)
    ax.set_xlabel("mask ratio p")
    ax.set_ylabel("repetitions k")
    ax.set_title(title, fontsize=9)


def plot_repeated_mlm(result, curves: dict[str, Path], path: Path) -> Path:
    """Figures 3, 4, 5 as heatmaps and Appendix G's training-loss curves, one PNG."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(19, 4))
    auc = result.table("bbbp_test_auc")
    _grid(axes[0], auc, "Fig. 3: BBBP test ROC-AUC (shortened)", ".1f", "RdYlGn")
    measured = result.table("measured_corrupted")
    pct = {k: {p: (v * 100 if v is not None else None) for p, v in row.items()}
           for k, row in measured.items()}  # fmt: skip
    _grid(axes[1], pct, "Fig. 4: corrupted semantics % (measured)", ".2f", "Blues")
    _grid(axes[2], result.table("entropy_bits"), "Fig. 5: entropy (bits), fully masked", ".2f",
          "OrRd")  # fmt: skip
    ax = axes[3]
    for label, metrics in curves.items():
        if not Path(metrics).is_file():
            continue
        records = [json.loads(line) for line in Path(metrics).read_text().splitlines() if line]
        ax.plot([r["step"] for r in records], [r["loss"] for r in records], label=label, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("App. G: training curves", fontsize=9)
    if ax.lines:
        ax.legend(fontsize=6)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def plot_entropy(rows: list[dict[str, Any]], path: Path) -> Path:
    """Entropy (bits) against mask ratio, one line per checkpoint (Figure 12)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, name in enumerate(dict.fromkeys(r["checkpoint"] for r in rows)):
        own = sorted((r for r in rows if r["checkpoint"] == name), key=lambda r: r["mask_ratio"])
        exlm = own[0]["objective"] == "exlm"
        label = f"{name} ({own[0]['objective']}" + (f", k={own[0]['k']})" if exlm else ")")
        ratios = [r["mask_ratio"] for r in own]
        ax.plot(ratios, [r["entropy_bits"] for r in own], "o-", color=f"C{i}", label=label)
        if exlm:  # the states on the DAG path; for MLM it is the same line
            ax.plot(ratios, [r["entropy_bits_path"] for r in own], "s--", color=f"C{i}",
                    label=f"{label}, path-weighted")  # fmt: skip
    ax.set_xlabel("mask ratio")
    ax.set_ylabel("prediction entropy (bits)")
    ax.set_title("Prediction entropy over masked tokens")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def plot_rank(rows: list[dict[str, Any]], path: Path) -> Path:
    """Effective rank per layer, with and without [MASK] (MAE-LM Figure 1), per checkpoint."""
    plt = _pyplot()
    names = list(dict.fromkeys(r["checkpoint"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, name in enumerate(names):
        own = sorted((r for r in rows if r["checkpoint"] == name), key=lambda r: r["layer"])
        layers = [r["layer"] for r in own]
        color = f"C{i}"
        tag = f"{name} ({own[0]['objective']})"
        axes[0].plot(layers, [r["with_mask"] for r in own], "o-", color=color,
                     label=f"{tag} w. [MASK]")  # fmt: skip
        axes[0].plot(layers, [r["without_mask"] for r in own], "s--", color=color,
                     label=f"{tag} w/o [MASK]")  # fmt: skip
        mask_only = [(r["layer"], r["mask_only"]) for r in own if r["mask_only"] is not None]
        if mask_only:
            axes[1].plot(*zip(*mask_only, strict=True), "o-", color=color, label=tag)
    axes[0].set_title("(a) τ-effective rank of token representations", fontsize=9)
    axes[1].set_title("(b) τ-effective rank of [MASK] representations", fontsize=9)
    for ax in axes:
        ax.set_xlabel("layer")
        ax.set_ylabel("effective rank")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def plot_dag(case, path: Path) -> Path:
    """(left) transition heatmap labelled with each state's top tokens (Figure 10);
    (right) the DAG drawn by group and clone, edge opacity = probability, Viterbi path in red
    (Figure 11)."""
    import numpy as np

    plt = _pyplot()
    trans = np.asarray(case.transitions)  # (S, S) row = from
    s = len(case.states)
    labels = [f"{st['label']}: {' '.join(st['top_tokens'])}" for st in case.states]
    fig, axes = plt.subplots(1, 2, figsize=(8 + 0.5 * s, 3 + 0.35 * s))
    ax = axes[0]
    ax.imshow(trans, cmap="viridis", vmin=0.0, vmax=max(float(trans.max()), 1e-9))
    ax.set_xticks(range(s), labels, rotation=90, fontsize=7)
    ax.set_yticks(range(s), labels, fontsize=7)
    ax.set_xlabel("to state")
    ax.set_ylabel("from state")
    ax.set_title("transition probabilities E[v, u]", fontsize=9)
    ax = axes[1]
    k = case.k
    xy = {u: (u // k, -(u % k)) for u in range(s)}
    on_path = set(zip(case.path, case.path[1:], strict=False))
    for v in range(s):
        for u in range(v + 1, s):
            w = float(trans[v, u])
            if w < 0.02 and (v, u) not in on_path:
                continue
            red = (v, u) in on_path
            ax.annotate(
                "", xy=xy[u], xytext=xy[v],
                arrowprops={"arrowstyle": "->", "color": "red" if red else "k",
                            "alpha": 1.0 if red else min(1.0, 0.15 + w), "lw": 0.5 + 2.5 * w,
                            "connectionstyle": "arc3,rad=0.15"},
            )  # fmt: skip
    for u, (x, y) in xy.items():
        st = case.states[u]
        color = "salmon" if u in case.path else "lightsteelblue"
        ax.scatter([x], [y], s=500, color=color, zorder=3)
        ax.text(x, y, "\n".join(st["top_tokens"][:3]), ha="center", va="center", fontsize=6,
                zorder=4)  # fmt: skip
    groups = list(dict.fromkeys(st["group"] for st in case.states))
    ax.set_xticks(range(len(groups)), groups, fontsize=7)
    ax.set_yticks([-c for c in range(k)], [f"clone {c + 1}" for c in range(k)], fontsize=7)
    ax.set_xlim(-0.7, len(groups) - 0.3)
    ax.set_ylim(-k + 0.4, 0.6)
    ax.set_title(f"DAG of {case.smiles} (Viterbi: {' '.join(case.path_tokens)})", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path
