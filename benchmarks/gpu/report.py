"""``report.md`` of a campaign: every phase's figures from ``progress.json`` as Markdown."""

from __future__ import annotations

import json
from pathlib import Path


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join("" if v is None else str(v) for v in row) + " |" for row in rows]
    return out + [""]


def _g(value, digits: int = 3):
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return value


def render(run_dir: Path) -> str:
    path = Path(run_dir) / "progress.json"
    if not path.is_file():
        return "# GPU campaign\n\nNo progress file yet.\n"
    doc = json.loads(path.read_text())
    phases = doc.get("phases", {})
    lines = [
        "# GPU campaign",
        "",
        f"State **{doc.get('state')}**{' (dry run)' if doc.get('dry_run') else ''}, "
        f"{doc.get('elapsed_s', 0):.0f} s of a {doc.get('budget_s', 0):.0f} s budget. "
        f"{doc.get('line', '')}",
        "",
        *_table(
            ["phase", "status", "elapsed s", "summary"],
            [
                [k, v.get("status"), v.get("elapsed_s"), v.get("summary", "")]
                for k, v in phases.items()
            ],
        ),
    ]
    setup = phases.get("setup", {}).get("result", {})
    if setup:
        lines += ["## Setup", "", "```", json.dumps(setup.get("device", {}), indent=1), "```", ""]
    p1 = phases.get("phase1", {}).get("result", {})
    for name in ("cuda", "suite"):
        r = p1.get(name)
        if r:
            lines += [f"## Phase 1: {name} tests", ""]
            lines += _table(
                ["passed", "failed", "errors", "skipped", "elapsed s", "budget ran out"],
                [[r.get("passed"), r.get("failed"), r.get("errors"), r.get("skipped"),
                  r.get("elapsed_s"), r.get("timed_out")]],
            )  # fmt: skip
            lines += [f"- `{f['id'] if isinstance(f, dict) else f}`: "
                      f"{(f.get('failure') or f.get('error') or '') if isinstance(f, dict) else ''}"
                      for f in r.get("failing", [])]  # fmt: skip
            lines.append("")
    p2 = phases.get("phase2", {}).get("result", {})
    if p2.get("dag"):
        lines += ["## Phase 2: DAG loss, forward + backward", ""]
        lines += [f"Device: {p2.get('device')}; matmul {p2.get('matmul_tflops')} TFLOP/s", ""]
        lines += _table(
            ["shape", "dtype", "impl", "ms", "peak MiB", "max |Δ| ll", "max |Δ| grad em",
             "max |Δ| grad links", "note"],
            [[r["shape"], r["dtype"], r["impl"], r.get("ms"), _g(r.get("peak_mib")),
              _g(r.get("max_diff", {}).get("ll")), _g(r.get("max_diff", {}).get("grad_em")),
              _g(r.get("max_diff", {}).get("grad_links")), r.get("error") or r.get("skipped")]
             for r in p2["dag"]],
        )  # fmt: skip
    if p2.get("throughput"):
        lines += ["## Phase 2: pre-training throughput", ""]
        lines += [
            f"MFU against {p2.get('peak_source')} ({p2.get('peak_flops', 0) / 1e12:.0f} TFLOP/s)",
            "",
        ]
        lines += _table(
            ["preset", "objective", "k", "params", "tokens/s", "step ms", "MFU", "peak MiB", "note"],
            [[r.get("preset"), r.get("objective"), r.get("k"), r.get("params"),
              r.get("tokens_per_s"), r.get("step_ms"), r.get("mfu"), r.get("peak_mib"),
              r.get("error") or r.get("skipped")] for r in p2["throughput"]],
        )  # fmt: skip
    peer = Path(run_dir) / "phase2" / "dag_vs_datrans.md"
    if peer.is_file():
        lines += ["## Phase 2: against DA-Transformer's CUDA kernel", "", peer.read_text(), ""]
    p3 = phases.get("phase3", {}).get("result", {})
    runs = {k: v for k, v in p3.items() if isinstance(v, dict)}
    if runs:
        lines += ["## Phase 3: pre-training side by side", ""]
        lines += _table(
            ["run", "steps (planned)", "last loss", "valid loss (step)", "tokens/s", "tokens",
             "checkpoint"],
            [[n, f"{r.get('steps')} ({r.get('planned_steps')})", _g(r.get("last_loss"), 4),
              ", ".join(f"{_g(v, 4)} ({s})" for s, v in r.get("valid", [])), r.get("tokens_per_s"),
              r.get("tokens_seen"), r.get("checkpoint")] for n, r in runs.items()],
        )  # fmt: skip
    p4 = phases.get("phase4", {}).get("result", {})
    if p4:
        summary = phases["phase4"].get("summary", "")
        lines += ["## Phase 4: MoleculeNet fine-tuning", "", summary, ""]
        lines += [p4.get("table", ""), ""]
        for key in ("failed", "cut", "skipped"):
            if p4.get(key):
                lines += [f"{key.capitalize()}: " + "; ".join(p4[key]), ""]
    pack = doc.get("pack")
    if pack:
        lines += ["## Pack", "", "```", json.dumps(pack, indent=1), "```", ""]
    return "\n".join(lines) + "\n"
