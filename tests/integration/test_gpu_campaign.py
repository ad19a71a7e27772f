"""The GPU campaign end to end on CPU: ``start --dry-run`` runs setup and the four phases at
toy sizes, ``poll`` reports the finished run, ``pack`` fits the limits on what comes back and
``unpack`` rebuilds loadable model folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN = ROOT / "benchmarks" / "gpu" / "campaign.py"
MIB = 1 << 20


def campaign(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CAMPAIGN), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def dry_run(shared_data, tmp_path_factory) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """One dry run, followed to its end and packed."""
    tmp = tmp_path_factory.mktemp("campaign")
    run_dir, out = tmp / "run", tmp / "out"
    args = ["start", "--dry-run", "--run-dir", str(run_dir), "--wait", "170", "--out", str(out)]
    return run_dir, out, campaign(*args)


def test_dry_run_reports_every_phase_ok(dry_run):
    run_dir, _, proc = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((run_dir / "progress.json").read_text())
    assert doc["state"] == "done" and doc["dry_run"]
    assert list(doc["phases"]) == ["setup", "phase1", "phase2", "phase3", "phase4"]
    for name, phase in doc["phases"].items():
        assert phase["status"] == "ok", (name, phase.get("summary"), phase.get("result"))
    results = {k: v["result"] for k, v in doc["phases"].items()}
    assert results["phase1"]["cuda"]["passed"] >= 1 and results["phase1"]["suite"]["failed"] == 0
    assert results["phase1"]["cuda"]["errors"] == 0 and results["phase1"]["suite"]["passed"] >= 1
    assert {r["impl"] for r in results["phase2"]["dag"]} >= {"reference", "matmul"}
    assert set(results["phase2"]["pretrain_rates"]) == {"mol_small_exlm_gpu", "mol_small_mlm_gpu"}
    for run in ("mol_small_exlm_gpu", "mol_small_mlm_gpu"):
        assert results["phase3"][run]["steps"] == results["phase3"][run]["planned_steps"] == 3
    assert (
        results["phase4"]["finished"] == 2
        and "| mol_small_exlm_gpu |" in results["phase4"]["table"]
    )
    assert (run_dir / "progress.txt").read_text().startswith("[done")


def test_packed_results_fit_and_unpack_to_loadable_models(dry_run, tmp_path):
    from smiexlm import ExLMModel

    _, out, _ = dry_run
    files = sorted(p for p in out.rglob("*") if p.is_file())
    assert 4 <= len(files) <= 8 and all(p.stat().st_size <= 16 * MIB for p in files)
    names = {p.name for p in files}
    assert {"progress.json", "report.md", "logs.tar.xz", "weights.safetensors.index.json"} <= names
    report = (out / "report.md").read_text()
    assert "## Phase 4: MoleculeNet fine-tuning" in report and "| phase1 | ok |" in report

    unpack = campaign("unpack", str(out), str(tmp_path / "results"))
    assert unpack.returncode == 0, unpack.stderr
    assert (tmp_path / "results" / "logs" / "phase1" / "cuda.xml").is_file()
    for run in ("mol_small_exlm_gpu", "mol_small_mlm_gpu"):
        model = ExLMModel.from_pretrained(tmp_path / "results" / "models" / run)
        assert model.config.objective == run.split("_")[2]


def test_poll_and_pack_after_the_run(dry_run, tmp_path):
    run_dir, _, _ = dry_run
    poll = campaign("poll", "--run-dir", str(run_dir))
    assert poll.returncode == 0 and "[done" in poll.stdout, poll.stdout + poll.stderr
    pack = campaign("pack", "--run-dir", str(run_dir), "--out", str(tmp_path / "o"), "--no-weights")
    assert pack.returncode == 0, pack.stderr
    record = json.loads(pack.stdout.strip().splitlines()[-1])
    assert record["models"] == [] and set(record["files_mib"]) == {
        "progress.json",
        "report.md",
        "logs.tar.xz",
    }
    missing = campaign("poll", "--run-dir", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and "no campaign" in missing.stdout


def test_pack_refuses_what_cannot_fit(tmp_path):
    sys.path.insert(0, str(CAMPAIGN.parent))
    import packing

    run_dir = tmp_path / "run"
    (run_dir / "phase1").mkdir(parents=True)
    (run_dir / "progress.json").write_text("{}")
    (run_dir / "phase1" / "suite.log").write_text("1 passed\n")
    original = packing.MAX_FILES  # progress.json, report.md and logs.tar.xz make three
    packing.MAX_FILES = 2
    try:
        with pytest.raises(packing.PackError, match="more than 2"):
            packing.pack(run_dir, tmp_path / "out", lambda _: "# report\n")
    finally:
        packing.MAX_FILES = original
