"""The GPU campaign: one prepared, detached script for a short GPU slot (see README.md here).

    python benchmarks/gpu/campaign.py prepare                           # CPU, before the slot
    python3 benchmarks/gpu/campaign.py start --wait 540 --out OUTDIR    # GPU, first command
    python3 benchmarks/gpu/campaign.py poll --wait 560 --out OUTDIR     # GPU, next commands
    python benchmarks/gpu/campaign.py unpack OUTDIR results/gpu         # CPU, afterwards
    python benchmarks/gpu/campaign.py start --dry-run --run-dir /tmp/c --wait 300 --out /tmp/o

``start`` launches the campaign in a new session (it outlives the command that started it)
and returns, or with ``--wait S`` follows its progress for up to S seconds. The campaign runs
setup, then the four phases of ``phases.py`` in order within ``--budget-min`` minutes, and
rewrites ``RUN/progress.json`` (plus a one-line ``progress.txt``) after every step. ``poll``
prints the progress compactly; ``--out DIR`` (on start and poll) packs the results so far
into at most 8 files of at most 16 MiB (``packing.py``). ``--dry-run`` runs every phase on
CPU at toy sizes from inputs it prepares itself, in well under two minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT)]

import packing  # noqa: E402
import phases  # noqa: E402
import prepare as prep  # noqa: E402
import report  # noqa: E402

DEFAULT_RUN = Path(tempfile.gettempdir()) / "smiexlm_campaign"
# shares of the budget; pre-training (phase 3) gets what the others leave
SHARES = {
    "setup": 0.06,
    "phase1": 0.25,
    "phase1_cuda": 0.09,
    "phase2": 0.14,
    "phase4": 0.22,
    "pack": 0.03,
}
DRY_BUDGETS = {"setup": 60, "phase1": 60, "phase1_cuda": 30, "phase2": 40, "phase4": 45, "pack": 5}
NOT_COPIED = {".git", ".venv", ".whl", ".gpu_data", ".peer", "runs", "work_tmp", "datasets",
              "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", ".ipynb_checkpoints"}  # fmt: skip


# ------------------------------------------------------------------ progress file
class Progress:
    """``progress.json`` (every phase's status, summary and figures) and ``progress.txt``."""

    def __init__(self, run_dir: Path, budget_s: float, dry_run: bool):
        self.path = run_dir / "progress.json"
        self.t0 = time.time()
        self.doc = {
            "format": "smiexlm-gpu-campaign/1", "state": "running", "dry_run": dry_run,
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "budget_s": budget_s,
            "pid": os.getpid(), "phases": {},
        }  # fmt: skip

    def report(self, phase: str, status: str, summary: str, **result) -> None:
        entry = self.doc["phases"].setdefault(phase, {"t0": time.time()})
        entry.update(status=status, summary=summary, elapsed_s=round(time.time() - entry["t0"], 1))
        if result:
            entry.setdefault("result", {}).update(result)
        self.write()

    def write(self) -> None:
        self.doc["elapsed_s"] = round(time.time() - self.t0, 1)
        self.doc["line"] = one_line(self.doc)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str))
        tmp.replace(self.path)
        (self.path.parent / "progress.txt").write_text(self.doc["line"] + "\n")


def one_line(doc: dict) -> str:
    clock = f"{doc.get('elapsed_s', 0) / 60:.1f}/{doc.get('budget_s', 0) / 60:.0f} min"
    parts = [
        f"{name} {p['status']}: {p.get('summary', '')[:160]}" for name, p in doc["phases"].items()
    ]
    return f"[{doc['state']} {clock}] " + " | ".join(parts)


# ------------------------------------------------------------------ setup (GPU side)
def snapshot(root: Path, dest: Path) -> Path:
    """A copy of the working tree the phases run from (later syncs cannot disturb them)."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in NOT_COPIED or n.endswith(".egg-info")}
        return skip | ({"data"} if Path(folder) == root else set())

    if dest.exists():
        shutil.rmtree(dest)
    return Path(shutil.copytree(root, dest, ignore=ignore))


def device_info(env: dict, dry_run: bool) -> dict:
    modules = ("triton",) if dry_run else ("triton", "rdkit", "deepchem", "xdist")
    code = (
        "import json, torch, platform\n"
        "d = {'python': platform.python_version(), 'torch': torch.__version__, "
        "'cuda': torch.cuda.is_available()}\n"
        "if d['cuda']:\n"
        "    p = torch.cuda.get_device_properties(0)\n"
        "    d.update(name=p.name, sm=p.multi_processor_count, mem_gib=round(p.total_memory / 2**30, 1))\n"
        f"for m in {modules!r}:\n"
        "    try:\n"
        "        d[m] = getattr(__import__(m), '__version__', 'yes')\n"
        "    except Exception as e:\n"
        "        d[m] = f'missing ({type(e).__name__})'\n"
        "print(json.dumps(d))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr[-1000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def setup(run_dir: Path, whl: Path, gpu_data: Path, dry_run: bool) -> tuple[dict, dict]:
    """(environment for the phases, what setup did)."""
    src = snapshot(ROOT, run_dir / "src")
    site = run_dir / "site"
    installed = {"installed": [], "note": "dry run: nothing installed"}
    if not dry_run:
        try:
            installed = prep.install_wheels(whl, site)
        except Exception as error:  # noqa: BLE001 - only some tests need RDKit: carry on
            installed = {"error": f"{type(error).__name__}: {error}"[:1500]}
    unpacked = prep.unpack_inputs(gpu_data, run_dir)
    launcher = run_dir / "bin" / "smiexlm"
    launcher.parent.mkdir(exist_ok=True)
    launcher.write_text(
        f"#!{sys.executable}\nimport sys\nfrom smiexlm.cli.main import main\nsys.exit(main())\n"
    )
    launcher.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SMIEXLM_DAG_IMPL")}
    paths = [str(site), str(src), *filter(None, [os.environ.get("PYTHONPATH")])]
    env.update(
        PYTHONPATH=os.pathsep.join(paths), SMIEXLM_DATA=str(run_dir / "data"),
        SMIEXLM_CACHE=str(run_dir / "cache"), MPLBACKEND="Agg", PYTHONUNBUFFERED="1",
        PATH=f"{launcher.parent}{os.pathsep}{os.environ.get('PATH', '')}",
    )  # fmt: skip
    info = {"wheels": installed, "unpacked": unpacked, "device": device_info(env, dry_run)}
    return env, info


def budgets(budget_s: float, dry_run: bool) -> dict[str, float]:
    if dry_run:
        return {k: float(v) for k, v in DRY_BUDGETS.items()}
    return {k: share * budget_s for k, share in SHARES.items()}


def drive(args: argparse.Namespace) -> int:
    """The campaign itself (the detached process)."""
    run_dir = args.run_dir
    budget_s = args.budget_min * 60
    progress = Progress(run_dir, budget_s, args.dry_run)
    deadline = time.time() + budget_s
    progress.report("setup", "running", "installing wheels, unpacking data")
    try:
        env, info = setup(run_dir, args.whl, args.gpu_data, args.dry_run)
        progress.report("setup", "ok", summarize_setup(info), **info)
    except Exception as error:  # noqa: BLE001 - reported, then the campaign stops
        progress.report(
            "setup",
            "failed",
            f"{type(error).__name__}: {error}"[:300],
            traceback=traceback.format_exc(),
        )
        progress.doc["state"] = "failed"
        progress.write()
        return 1
    ctx = phases.Context(
        run_dir=run_dir, src=run_dir / "src", env=env, dry_run=args.dry_run, deadline=deadline,
        budgets=budgets(budget_s, args.dry_run), report=progress.report, peer=args.peer_harness,
    )  # fmt: skip
    phases.start_peer_build(ctx)
    steps = [
        ("phase1", phases.correctness),
        ("phase2", phases.speed),
        ("phase3", lambda c: phases.pretraining(c, rates(progress))),
        ("phase4", phases.finetuning),
    ]
    for name, body in steps:
        progress.report(name, "running", "started")
        try:
            status, result = body(ctx)
        except Exception as error:  # noqa: BLE001 - a broken phase must not stop the next
            status = "failed"
            result = {
                "summary": f"{type(error).__name__}: {error}"[:300],
                "traceback": traceback.format_exc(),
            }
        summary = str(result.pop("summary", ""))
        progress.report(name, status, summary, **result)
    progress.doc["state"] = "done"
    progress.write()
    return 0


def rates(progress: Progress) -> dict[str, float]:
    return progress.doc["phases"].get("phase2", {}).get("result", {}).get("pretrain_rates", {})


def summarize_setup(info: dict) -> str:
    d = info["device"]
    return (
        f"{d.get('name', 'cpu')}, torch {d.get('torch')}, triton {d.get('triton')}, rdkit "
        f"{d.get('rdkit')}; MOSES {info['unpacked'].get('moses_train')} train / "
        f"{info['unpacked'].get('moses_valid')} valid molecules"
    )


# ------------------------------------------------------------------ commands
def cmd_prepare(args: argparse.Namespace) -> int:
    from smiexlm.paths import data_dir

    doc = prep.prepare(
        ROOT, data_dir(), args.whl, args.gpu_data, dry_run=args.dry_run, wheels=not args.no_wheels,
        workers=args.workers, limit_mib=args.limit_mib,
    )  # fmt: skip
    print(json.dumps({k: v for k, v in doc.items() if k != "finetune"}, indent=1))
    return 0


def cmd_start(args: argparse.Namespace) -> int:
    run_dir = args.run_dir
    if (run_dir / "progress.json").is_file() and not args.dry_run:
        state = json.loads((run_dir / "progress.json").read_text()).get("state")
        if state == "running" and driver_alive(run_dir):
            print(f"a campaign is already running in {run_dir}; use poll")
            return 1
    if run_dir.exists():
        if any(run_dir.iterdir()) and not (run_dir / "driver.pid").is_file():
            print(f"{run_dir} exists and holds no campaign: choose another --run-dir")
            return 1
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    if args.dry_run:  # tiny inputs of its own: no wheels, a few hundred molecules
        args.gpu_data = run_dir / "prepared"
        with open(run_dir / "prepare.log", "w") as log:
            cmd = [sys.executable, __file__, "prepare", "--dry-run", "--no-wheels"]
            cmd += ["--gpu-data", str(args.gpu_data), "--workers", "1"]
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True)
    cmd = [sys.executable, __file__, "drive", "--run-dir", str(run_dir)]
    cmd += ["--budget-min", str(args.budget_min), "--whl", str(args.whl)]
    cmd += ["--gpu-data", str(args.gpu_data)] + (["--dry-run"] if args.dry_run else [])
    cmd += ["--peer-harness", str(args.peer_harness)] if args.peer_harness else []
    with open(run_dir / "driver.log", "ab") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    (run_dir / "driver.pid").write_text(str(proc.pid))
    print(f"campaign started (pid {proc.pid}) in {run_dir}", flush=True)
    return follow(run_dir, args.wait, args.out)


def driver_alive(run_dir: Path) -> bool:
    try:
        os.kill(int((run_dir / "driver.pid").read_text()), 0)
    except (OSError, ValueError):
        return False
    if sys.platform.startswith("linux"):  # a finished child of this process is a zombie
        stat = Path(f"/proc/{(run_dir / 'driver.pid').read_text().strip()}/stat")
        return stat.is_file() and stat.read_text().split(") ")[-1][:1] != "Z"
    return True


def read_state(run_dir: Path) -> dict:
    path = run_dir / "progress.json"
    for _ in range(3):
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            time.sleep(0.2)
    return {"state": "starting", "phases": {}, "line": "[starting] no progress file yet"}


def follow(run_dir: Path, wait_s: float, out: Path | None) -> int:
    """Print the progress line whenever it changes, until the campaign ends or ``wait_s``."""
    t0, shown = time.time(), None
    while True:
        doc = read_state(run_dir)
        if doc.get("state") in ("running", "starting") and not driver_alive(run_dir):
            doc["state"] = "died"
            doc["line"] = "[died] the campaign process is gone: see driver.log. " + doc.get(
                "line", ""
            )
        if doc.get("line") != shown:
            shown = doc.get("line")
            print(time.strftime("%H:%M:%S"), shown, flush=True)
        if doc.get("state") not in ("running", "starting") or time.time() - t0 >= wait_s:
            break
        time.sleep(1)
    if out is not None:
        record = packing.pack(run_dir, out, report.render)
        print("packed:", json.dumps(record), flush=True)
    return 0 if doc.get("state") in ("done", "running", "starting") else 1


def cmd_poll(args: argparse.Namespace) -> int:
    if not (args.run_dir / "driver.pid").is_file():
        print(f"no campaign in {args.run_dir}")
        return 1
    return follow(args.run_dir, args.wait, args.out)


def cmd_pack(args: argparse.Namespace) -> int:
    print(json.dumps(packing.pack(args.run_dir, args.out, report.render, not args.no_weights)))
    return 0


def cmd_unpack(args: argparse.Namespace) -> int:
    print(json.dumps(packing.unpack(args.packed, args.dest), indent=1))
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--run-dir", type=Path, default=DEFAULT_RUN, help="campaign folder")
    inputs = argparse.ArgumentParser(add_help=False)
    inputs.add_argument("--whl", type=Path, default=ROOT / ".whl", help="carried wheels")
    inputs.add_argument("--gpu-data", type=Path, default=ROOT / ".gpu_data", help="carried data")
    q = sub.add_parser("prepare", parents=[inputs], help="build .whl/ and .gpu_data/ (CPU)")
    q.add_argument("--dry-run", action="store_true", help="toy data, for the dry run")
    q.add_argument("--no-wheels", action="store_true", help="skip the wheel downloads")
    q.add_argument("--workers", type=int, default=2, help="preprocessing processes")
    q.add_argument("--limit-mib", type=float, default=prep.LIMIT_MIB, help="travel size limit")
    for name, helptext in (("start", "launch the campaign, detached"), ("drive", None)):
        s = sub.add_parser(name, parents=[common, inputs], help=helptext or argparse.SUPPRESS)
        s.add_argument("--budget-min", type=float, default=19.0, help="minutes for everything")
        s.add_argument("--dry-run", action="store_true", help="every phase on CPU, toy sizes")
        s.add_argument(
            "--peer-harness", type=Path, default=None, help="DA-Transformer harness folder"
        )
        s.add_argument("--wait", type=float, default=0.0, help="follow the progress this long (s)")
        s.add_argument("--out", type=Path, default=None, help="pack the results here at the end")
    s = sub.add_parser("poll", parents=[common], help="print the progress")
    s.add_argument("--wait", type=float, default=0.0, help="follow the progress this long (s)")
    s.add_argument("--out", type=Path, default=None, help="pack the results here at the end")
    s = sub.add_parser("pack", parents=[common], help="pack the results into --out")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--no-weights", action="store_true", help="leave the weights out")
    s = sub.add_parser("unpack", help="rebuild logs and model folders from packed results")
    s.add_argument("packed", type=Path)
    s.add_argument("dest", type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    commands = {"prepare": cmd_prepare, "start": cmd_start, "drive": drive, "poll": cmd_poll,
                "pack": cmd_pack, "unpack": cmd_unpack}  # fmt: skip
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
