"""The campaign's phases, each a set of subprocesses with their own logs and a time budget.

1. correctness: pytest of the CUDA / DAG tests, then of the whole suite (JUnit XML, counts);
2. speed: ``speed.py`` (DAG loss, throughput, MFU), then the DA-Transformer peer harness when
   one is given;
3. pre-training: ``mol_small_exlm_gpu`` and ``mol_small_mlm_gpu`` side by side, their
   schedules compressed to the budget left (steps from phase 2's measured rates);
4. fine-tuning: the MoleculeNet protocol (Table 8 configs, scaffold splits, 3 seeds) from both
   checkpoints, many ``finetune_job.py`` processes at once.

A phase stopped by its budget keeps what it finished and is reported ``partial``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCRIPTS = Path("benchmarks") / "gpu"  # in the snapshot of the working tree (Context.src)
PAPER_TASKS = ("bace", "bbbp", "tox21", "sider", "muv", "clintox", "toxcast")
RUNS = ("mol_small_exlm_gpu", "mol_small_mlm_gpu")


@dataclass
class Context:
    """Where the campaign runs and what it may spend."""

    run_dir: Path
    src: Path  # the snapshot of the working tree the phases run from
    env: dict[str, str]
    dry_run: bool
    deadline: float  # time.time() at which the whole campaign must have packed
    budgets: dict[str, float]
    report: Any  # report(phase, status, summary, **result): writes the progress file
    peer: Path | None = None
    peer_build: subprocess.Popen | None = field(default=None, repr=False)

    def left(self) -> float:
        return self.deadline - time.time()


# ------------------------------------------------------------------ subprocesses
def start(cmd: list[str], log: Path, ctx: Context, env: dict | None = None) -> subprocess.Popen:
    """``cmd`` in its own process group, output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"$ {' '.join(map(str, cmd))}\n".encode())
        out.flush()
        return subprocess.Popen(
            cmd, cwd=ctx.src, env=env or ctx.env, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = 30.0) -> int:
    """Send ``sig`` to the process group, wait ``grace_s``, then kill the group."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.wait()


def run(cmd, log: Path, ctx: Context, budget_s: float, sig=signal.SIGTERM, grace_s=30.0) -> dict:
    """Run to completion or until ``budget_s``; ``{"rc", "elapsed_s", "timed_out"}``."""
    t0 = time.time()
    proc = start(cmd, log, ctx)
    timed_out = False
    while proc.poll() is None:
        if time.time() - t0 > budget_s:
            timed_out = True
            stop(proc, sig, grace_s)
            break
        time.sleep(0.5)
    return {"rc": proc.wait(), "elapsed_s": round(time.time() - t0, 1), "timed_out": timed_out}


# ------------------------------------------------------------------ phase 1
def junit_counts(xml_path: Path, log: Path) -> dict:
    """passed / failed / errors / skipped and the failing test ids, from JUnit XML (or, when
    pytest was stopped before writing it, from the summary line of its log)."""
    if xml_path.is_file():
        root = ET.parse(xml_path).getroot()
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        totals = {
            k: sum(int(s.get(k, 0)) for s in suites)
            for k in ("tests", "failures", "errors", "skipped")
        }
        failed = []
        for case in root.iter("testcase"):
            for tag in ("failure", "error"):
                bad = case.find(tag)
                if bad is not None:
                    name = f"{case.get('classname', '')}::{case.get('name', '')}"
                    failed.append({"id": name, tag: (bad.get("message") or "")[:300]})
        passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
        return {
            "passed": passed, "failed": totals["failures"], "errors": totals["errors"],
            "skipped": totals["skipped"], "failing": failed[:60], "source": "junit",
        }  # fmt: skip
    text = log.read_text(errors="replace") if log.is_file() else ""
    counts = {k: 0 for k in ("passed", "failed", "errors", "skipped")}
    for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", text[-3000:]):
        counts["errors" if word.startswith("error") else word] = int(n)
    return counts | {
        "failing": re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)[:60],
        "source": "log",
    }


def pytest(ctx: Context, name: str, targets: list[str], budget_s: float) -> dict:
    out = ctx.run_dir / "phase1"
    xml, log = out / f"{name}.xml", out / f"{name}.log"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE"]
    cmd += [f"--junitxml={xml}", *targets]
    if importlib.util.find_spec("xdist") is not None:  # the project's addopts ask for -n auto
        wide = not ctx.dry_run and name == "suite"  # the CUDA tests share one device: in turn
        cmd += ["-n", str(min(12, os.cpu_count() or 1)) if wide else "0", "--dist", "loadfile"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd += ["--timeout", "300"]
    outcome = run(cmd, log, ctx, budget_s, sig=signal.SIGINT, grace_s=20)
    return outcome | junit_counts(xml, log)


def correctness(ctx: Context) -> tuple[str, dict]:
    first = [
        "tests/integration/test_cuda.py",
        "tests/unit/dag/test_dag_triton.py",
        "tests/unit/dag/test_dag.py",
    ]
    rest = ["tests", *(f"--ignore={t}" for t in [*first, "tests/integration/test_gpu_campaign.py"])]
    if ctx.dry_run:  # a few fast tests
        first = [
            "tests/integration/test_cuda.py",
            "tests/unit/dag/test_dag.py",
            "-k",
            "counts_and_averages or cuda",
        ]
        rest = ["tests/unit/pretraining/test_sharded_checkpoints.py", "-k", "over_the_limit"]
    cuda = pytest(ctx, "cuda", first, ctx.budgets["phase1_cuda"])
    ctx.report("phase1", "running", "cuda/dag tests: " + counts_line(cuda), cuda=cuda)
    budget = ctx.budgets["phase1"] - cuda["elapsed_s"]
    suite = pytest(ctx, "suite", rest, budget)
    status = "partial" if cuda["timed_out"] or suite["timed_out"] else "ok"
    summary = f"cuda/dag {counts_line(cuda)}; suite {counts_line(suite)}"
    return status, {"summary": summary, "cuda": cuda, "suite": suite}


def counts_line(r: dict) -> str:
    line = f"{r.get('passed', 0)} passed, {r.get('failed', 0)} failed, {r.get('errors', 0)} errors"
    return (
        line + f", {r.get('skipped', 0)} skipped" + (" (budget ran out)" if r["timed_out"] else "")
    )


# ------------------------------------------------------------------ phase 2
def start_peer_build(ctx: Context) -> None:
    """Build the peer harness's CUDA extension in the background during phase 1."""
    if ctx.peer is not None and not ctx.dry_run:
        cmd = [sys.executable, str(ctx.peer / "bench_dag_loss.py"), "--build-only"]
        cmd += ["--build-dir", str(ctx.run_dir / "peer_build")]
        ctx.peer_build = start(cmd, ctx.run_dir / "phase2" / "peer_build.log", ctx)


def speed(ctx: Context) -> tuple[str, dict]:
    out = ctx.run_dir / "phase2"
    budget = ctx.budgets["phase2"]
    peer_share = 0.4 if ctx.peer is not None else 0.0
    mine = budget * (1 - peer_share)
    cmd = [sys.executable, str(ctx.src / SCRIPTS / "speed.py"), "--out", str(out)]
    cmd += ["--dataset", str(ctx.run_dir / "moses"), "--budget", str(mine - 10)]
    cmd += ["--dry-run"] if ctx.dry_run else []
    outcome = run(cmd, out / "speed.log", ctx, mine)
    result: dict = {"speed": outcome}
    path = out / "speed.json"
    if path.is_file():
        result |= json.loads(path.read_text())
    if ctx.peer is not None:
        result["peer"] = peer_harness(ctx, out, budget * peer_share)
    ok = outcome["rc"] == 0 and "throughput" in result
    rates = result.get("pretrain_rates", {})
    summary = "steps/s " + ", ".join(f"{k} {v}" for k, v in rates.items()) if rates else "no rates"
    result["summary"] = summary
    return ("ok" if ok else "partial" if path.is_file() else "failed"), result


def peer_harness(ctx: Context, out: Path, budget_s: float) -> dict:
    """The DA-Transformer harness, from its carried folder (never part of the project)."""
    if ctx.peer_build is not None:
        try:
            ctx.peer_build.wait(timeout=max(1.0, budget_s / 2))
        except subprocess.TimeoutExpired:
            stop(ctx.peer_build, signal.SIGTERM, 5)
    script = ctx.peer / "bench_dag_loss.py"
    if not script.is_file():
        return {"error": f"{script} does not exist"}
    cmd = [sys.executable, str(script), "--smiexlm-root", str(ctx.src)]
    cmd += ["--out", str(out / "dag_vs_datrans.md"), "--shapes", "smiles,text"]
    cmd += ["--dtypes", "fp32,bf16", "--case-budget-s", "3"]
    cmd += ["--build-dir", str(ctx.run_dir / "peer_build")]
    return run(cmd, out / "peer.log", ctx, max(10.0, budget_s - 5))


# ------------------------------------------------------------------ phase 3
def planned_steps(rate: float | None, budget_s: float, dry_run: bool) -> int:
    """Updates each run makes in ``budget_s`` while sharing the GPU with the other."""
    if dry_run:
        return 3
    if not rate:
        return 3000  # the budget's SIGTERM stops the run if this is too many
    usable = max(30.0, budget_s - 40.0)  # start-up, validation passes, the last checkpoint
    return int(min(120_000, max(200, 0.55 * rate * usable)))


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def run_summary(run: Path, outcome: dict) -> dict:
    rows = metrics(run)
    last = rows[-1] if rows else {}
    rates = [r["tokens_per_s"] for r in rows[1:]] or [r["tokens_per_s"] for r in rows]
    kept = [n for n in ("best", "last") if (run / "checkpoints" / n).is_dir()]
    return outcome | {
        "steps": last.get("step", 0),
        "last_loss": last.get("loss"),
        "valid": [(r["step"], r["valid_loss"]) for r in rows if "valid_loss" in r],
        "tokens_seen": last.get("tokens_seen"),
        "tokens_per_s": round(sum(rates) / len(rates)) if rates else None,
        "checkpoint": kept[0] if kept else None,
    }


def pretraining(ctx: Context, rates: dict[str, float]) -> tuple[str, dict]:
    out = ctx.run_dir / "phase3"
    budget = ctx.left() - ctx.budgets["phase4"] - ctx.budgets["pack"]
    procs, plans = {}, {}
    for name in RUNS:
        steps = planned_steps(rates.get(name), budget, ctx.dry_run)
        every = max(1, steps // 4)
        overrides = [
            f"max_steps={steps}", f"total_steps={steps}", f"warmup_steps={max(1, steps // 12)}",
            f"valid_every={every}", f"save_every={every}", f"log_every={max(1, steps // 100)}",
            "progress=false",
        ]  # fmt: skip
        if ctx.dry_run:
            overrides += ["model.preset=tiny", "model.n_layers=2", "model.d_model=32"]
            overrides += ["model.n_heads=2", "model.d_ff=64", "model.n_transition_heads=2"]
            overrides += ["device=cpu", "precision=fp32", "max_tokens=512"]
            overrides += ["num_workers=0", "valid_batches=1", "num_threads=1"]
        cmd = [sys.executable, "-m", "smiexlm.cli.main", "pretrain", "--config", name]
        cmd += ["--data", str(ctx.run_dir / "moses"), "--out", str(out / name), "--nproc", "1"]
        procs[name] = start([*cmd, *overrides], out / f"{name}.log", ctx)
        plans[name] = {"planned_steps": steps, "rate_steps_per_s": rates.get(name)}
    t0, timed_out, shown = time.time(), False, 0.0
    while any(p.poll() is None for p in procs.values()):
        if time.time() - t0 > budget:
            timed_out = True
            for p in procs.values():
                stop(p, signal.SIGTERM, 90)  # the trainer checkpoints, then leaves
            break
        if time.time() - shown > 30:
            shown = time.time()
            line = "; ".join(
                f"{n}: step {(metrics(out / n) or [{}])[-1].get('step', 0)}" for n in RUNS
            )
            ctx.report("phase3", "running", line)
        time.sleep(1.0)
    elapsed = round(time.time() - t0, 1)
    result = {}
    for name, proc in procs.items():
        outcome = {"rc": proc.wait(), "elapsed_s": elapsed, "timed_out": timed_out}
        result[name] = plans[name] | run_summary(out / name, outcome)
        if not ctx.dry_run and (out / name / "metrics.jsonl").is_file():
            plot = [sys.executable, "-m", "smiexlm.cli.main", "plot-run", str(out / name)]
            run(plot, out / f"{name}.plot.log", ctx, 60)
    finished = all(r["rc"] == 0 and r["steps"] == r["planned_steps"] for r in result.values())
    result["summary"] = "; ".join(
        f"{n}: {r['steps']} steps, loss {fmt(r['last_loss'])}, valid {fmt(r['valid'][-1][1] if r['valid'] else None)}"
        for n, r in result.items()
    )
    if finished:
        return "ok", result
    return ("partial" if any(r["checkpoint"] for r in result.values()) else "failed"), result


def fmt(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.4f}"


# ------------------------------------------------------------------ phase 4
def backbones(ctx: Context) -> dict[str, Path]:
    """Run name -> checkpoint folder of phase 3; the shipped models stand in for missing runs."""
    shipped = {
        "mol_small_exlm_gpu": ctx.src / "smiexlm/assets/twins/exlm",
        "mol_small_mlm_gpu": ctx.src / "smiexlm/assets/twins/mlm",
    }
    found = {}
    for name in RUNS:
        for sub in ("best", "last"):
            folder = ctx.run_dir / "phase3" / name / "checkpoints" / sub
            if (folder / "model.safetensors").is_file():
                found[name] = folder
                break
        else:
            found[f"shipped {shipped[name].name} (no {name})"] = shipped[name]
    return found


def finetune_jobs(ctx: Context, models: dict[str, Path]) -> tuple[list[dict], list[dict]]:
    """(jobs cheapest first, jobs skipped as too long for the slot)."""
    sys.path.insert(0, str(ctx.src))
    from smiexlm.finetuning.config import finetune_config

    cache = ctx.run_dir / "finetune"
    tasks = [t for t in PAPER_TASKS if (cache / f"{t}.json").is_file()]
    seeds = (0,) if ctx.dry_run else (0, 1, 2)
    limit = 15_000  # optimiser steps a job may need and still finish inside the slot
    jobs, skipped = [], []
    for name, folder in models.items():
        for task in tasks:
            cfg = finetune_config(task, forest="none")
            n_train = json.loads((cache / f"{task}.json").read_text())["sizes"][0]
            epochs = 1 if ctx.dry_run else cfg.loop.epochs
            steps = epochs * math.ceil(n_train / cfg.loop.batch_size)
            for seed in seeds:
                job = {"model": name, "checkpoint": str(folder), "task": task, "seed": seed}
                job |= {"epochs": epochs, "steps": steps}
                (skipped if steps > limit else jobs).append(job)
    return sorted(jobs, key=lambda j: j["steps"]), skipped


def finetuning(ctx: Context) -> tuple[str, dict]:
    out = ctx.run_dir / "phase4"
    models = backbones(ctx)
    jobs, skipped = finetune_jobs(ctx, models)
    width = 2 if ctx.dry_run else min(16, os.cpu_count() or 1)
    budget = min(ctx.budgets["phase4"], ctx.left() - ctx.budgets["pack"])
    t0, running, done, cut = time.time(), [], [], []
    queue = list(jobs)
    while queue or running:
        while queue and len(running) < width and time.time() - t0 < budget:
            job = queue.pop(0)
            tag = f"{job['model'].split()[0]}_{job['task']}_s{job['seed']}"
            job["out"] = str(out / "jobs" / f"{tag}.json")
            cmd = [
                sys.executable,
                str(ctx.src / SCRIPTS / "finetune_job.py"),
                "--task",
                job["task"],
            ]
            cmd += ["--cache", str(ctx.run_dir / "finetune"), "--seed", str(job["seed"])]
            cmd += ["--checkpoint", job["checkpoint"], "--name", job["model"]]
            cmd += ["--out", job["out"], "--epochs", str(job["epochs"])]
            running.append((job, start(cmd, out / "jobs" / f"{tag}.log", ctx)))
        if time.time() - t0 > budget:
            for job, proc in running:
                stop(proc, signal.SIGTERM, 5)
                cut.append(job)
            cut += queue
            break
        for item in list(running):
            if item[1].poll() is not None:
                running.remove(item)
                done.append(item[0] | {"rc": item[1].returncode})
        time.sleep(0.5)
    results = [json.loads(Path(j["out"]).read_text()) for j in done if Path(j["out"]).is_file()]
    failed = [j for j in done if not Path(j["out"]).is_file()]
    (out / "results.json").write_text(json.dumps(results, indent=1))
    result = {
        "backbones": {k: str(v) for k, v in models.items()},
        "results": results,
        "table": results_table(ctx, results),
        "finished": len(results),
        "failed": [f"{j['model']} {j['task']} seed {j['seed']} (rc {j['rc']})" for j in failed],
        "cut": [f"{j['model']} {j['task']} seed {j['seed']}" for j in cut],
        "skipped": [
            f"{j['model']} {j['task']} seed {j['seed']}: {j['steps']} steps" for j in skipped
        ],
        "elapsed_s": round(time.time() - t0, 1),
    }
    result["summary"] = (
        f"{len(results)} runs finished, {len(failed)} failed, {len(cut)} cut by the budget, "
        f"{len(skipped)} skipped as too long"
    )
    status = "ok" if results and not failed and not cut else "partial" if results else "failed"
    return status, result


def results_table(ctx: Context, rows: list[dict]) -> str:
    """The MoleculeNet report's Markdown table (paper rows beside the measured ones)."""
    if not rows:
        return ""
    sys.path.insert(0, str(ctx.src))
    from smiexlm.moleculenet.report import RunResult, markdown_table

    results = [RunResult(**(r | {"sizes": tuple(r["sizes"])})) for r in rows]
    return markdown_table(results)
