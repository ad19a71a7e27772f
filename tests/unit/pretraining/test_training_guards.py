"""Runs that cannot trample each other: one run per folder, no orphaned DDP workers, and a
``--resume`` that continues the same run (dataset, model) or says clearly why it cannot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.integration.test_faults import assert_one_line_error, run_cli
from tests.unit.pretraining.test_training_support import (
    FAST,
    MICRO_MODEL,
    build_dataset,
    cli,
    cli_env,
)

LONG = ["--max-steps", "100000", "total_steps=100000"]  # a run that is still going when killed


@pytest.fixture(scope="module")
def dataset(shared_data, tmp_path_factory):
    source = shared_data / "pretrain" / "moses_test.smi.gz"
    return build_dataset(source, tmp_path_factory.mktemp("data") / "ds", n=300)


def _args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["pretrain", "--config", "mol_tiny_exlm", *MICRO_MODEL, *FAST,
            "--data", str(data), "--out", str(out), *extra]  # fmt: skip


def _train(data: Path, out: Path, steps: int, *extra: str, resume: bool = False):
    from smiexlm.pretraining.config import load_config
    from smiexlm.pretraining.trainer import pretrain

    config = load_config("mol_tiny_exlm", [*MICRO_MODEL, *FAST, *extra])
    return pretrain(config, data, out, steps, resume=resume)


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _start(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as handle:
        return subprocess.Popen(cli(*args), env=cli_env(), stdout=handle, stderr=subprocess.STDOUT)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.is_file() else []


def _wait_until(ready, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if ready():
            return
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"the run never got there: {log.read_text()}")


def _alive(pid: int) -> bool:
    """A running process (a zombie waiting for its reaper is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


# ---------------------------------------------------------------------- one run per folder
def test_a_live_run_keeps_its_folder_and_a_dead_ones_lock_is_taken_over(dataset, tmp_path):
    run, log = tmp_path / "run", tmp_path / "first.log"
    first = _start(_args(dataset, run, *LONG), log)
    try:
        _wait_until(lambda: '"pid"' in "".join(_lines(run / ".lock")), first, log)
        assert json.loads((run / ".lock").read_text())["pid"] == first.pid
        res = run_cli(*_args(dataset, run, "--max-steps", "2", "--resume"))
        assert_one_line_error(res, str(run), "in use", f"process {first.pid}")
    finally:
        first.kill()
        first.wait()
    res = run_cli(*_args(dataset, run, "--max-steps", "1", "--resume"))
    assert res.returncode == 0, res.stderr
    assert f"taking over the lock of process {first.pid}" in res.stderr
    assert not (run / ".lock").exists()


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="finds workers in /proc")
def test_ddp_workers_end_with_their_killed_launcher(dataset, tmp_path):
    """kill -9 of ``pretrain --nproc 2``: both workers stop (no orphan trains on); and DDP
    gives no find_unused_parameters warning (every parameter gets its gradient)."""
    run, log = tmp_path / "run", tmp_path / "launcher.log"
    launcher = _start(_args(dataset, run, *LONG, "update_freq=2", "--nproc", "2"), log)
    workers: list[int] = []
    try:
        _wait_until(lambda: len(_lines(run / "metrics.jsonl")) >= 2, launcher, log)
        workers = _children(launcher.pid)
        assert len(workers) == 2, workers
        launcher.kill()
        launcher.wait()
        deadline = time.time() + 20
        while time.time() < deadline and any(map(_alive, workers)):
            time.sleep(0.2)
        assert not any(map(_alive, workers)), log.read_text()
    finally:
        launcher.kill()
        for pid in filter(_alive, workers):
            os.kill(pid, signal.SIGKILL)
    assert "find_unused_parameters" not in log.read_text()


def _every_parameter_reached(rank: int, store: str) -> None:
    """The check of the test below, in a process of its own that ends without tearing its gloo
    group down: torch can deadlock there (a worker thread of the group waits for the GIL to
    free a finished allreduce while the main thread, holding the GIL, waits for that worker),
    which is not what the test is about and hung the suite once."""
    import torch.distributed as dist

    from smiexlm.model.config import ExLMConfig
    from smiexlm.model.model import ExLMModel
    from smiexlm.training.distributed import wrap
    from smiexlm.training.ranks import DistInfo

    torch.set_num_threads(1)
    micro = dict(n_layers=1, n_heads=2, d_model=32, d_ff=64, n_transition_heads=2, vocab_size=40)
    dist.init_process_group("gloo", store=dist.FileStore(store, 1), rank=0, world_size=1)
    for objective in ("exlm", "mlm", "maelm"):
        model = ExLMModel(ExLMConfig.tiny(objective=objective, **micro))
        ddp = wrap(model, DistInfo(world_size=2), torch.device("cpu"))
        assert ddp.find_unused_parameters is False
        ids, mask = torch.randint(5, 40, (2, 6)), torch.ones(2, 6, dtype=torch.bool)
        labels = torch.full((2, 6), -100)
        ddp(ids, mask, labels).loss.backward()  # nothing masked
        labels[:, 2] = ids[:, 2]
        ddp(ids, mask, labels).loss.backward()  # fails here if a parameter was left out
        assert all(p.grad is not None for p in model.parameters()), objective
    os._exit(0)  # no teardown (above); a failed check raised before this line


def test_every_parameter_gets_a_gradient_under_ddp_even_without_targets(tmp_path):
    """DDP without find_unused_parameters: a batch with nothing masked must still reach every
    parameter, or the next step fails ("Expected to have finished reduction")."""
    import torch.multiprocessing as mp

    mp.spawn(_every_parameter_reached, args=(str(tmp_path / "store"),), nprocs=1, join=True)


# ---------------------------------------------------------------------- resume
def test_resume_refuses_another_dataset(dataset, tmp_path):
    from smiexlm.data.pipeline import PreprocessConfig, preprocess

    run = tmp_path / "run"
    _train(dataset, run, 4)
    smiles = (dataset.parent / f"{dataset.name}.smi").read_text().splitlines()[:250]
    raw, other = tmp_path / "other.smi", tmp_path / "other"
    raw.write_text("\n".join(smiles) + "\n")  # the same vocabulary, fewer molecules
    preprocess([raw], other, PreprocessConfig(valid_fraction=0.1), vocab=dataset / "vocab.json",
               progress=False)  # fmt: skip
    res = run_cli(*_args(other, run, "--max-steps", "6", "--resume"))
    assert_one_line_error(res, "another dataset", str(dataset.resolve()), str(other))


def test_resume_cuts_the_metrics_log_back_to_the_resumed_step(dataset, tmp_path):
    run = tmp_path / "run"
    _train(dataset, run, 8)  # checkpoints at steps 4 and 8
    weights = run / "checkpoints" / "step_000008" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 3)
    res = run_cli(*_args(dataset, run, "--max-steps", "10", "--resume", "--skip-bad-checkpoints"))
    assert res.returncode == 0, res.stderr
    assert "resumed from step_000004" in res.stderr
    assert _steps(run) == list(range(1, 11))  # steps 5-8 once, from the resumed run
    # the clock goes on from the resumed step's: the log's wall time never runs backwards
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    elapsed = [r["elapsed_s"] for r in records if "elapsed_s" in r]
    assert elapsed == sorted(elapsed) and elapsed[-1] > elapsed[3] > 0


def test_resume_where_auto_means_another_precision_records_the_change(
    dataset, tmp_path, monkeypatch
):
    """An ``auto`` run begun on a CPU without native bf16 and resumed on one with it trains
    on in bf16 (precision may change on resume), and says so as a changed setting does."""
    from smiexlm import device
    from smiexlm.pretraining.resume import CHANGES_FILE, RESOLVED_PRECISION

    run = tmp_path / "run"
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: False)
    _train(dataset, run, 4)
    _train(dataset, run, 6, resume=True)  # the same machine: only max_steps changes
    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: True)  # another machine
    _train(dataset, run, 8, resume=True)
    history = json.loads((run / CHANGES_FILE).read_text())["changes"]
    assert [(e["from_step"], e["settings"].get(RESOLVED_PRECISION)) for e in history] == [
        (4, None),
        (6, {"old": "fp32", "new": "bf16"}),
    ]


def test_last_and_best_are_copies_that_outlive_damage_to_the_step_folder(dataset, tmp_path):
    from smiexlm import ExLMModel

    run = tmp_path / "run"
    result = _train(dataset, run, 4)
    step = run / "checkpoints" / "step_000004" / "model.safetensors"
    size = step.stat().st_size
    with open(step, "r+b") as handle:  # damaged in place, as a disk or a stray write would
        handle.seek(size // 2)
        handle.write(b"\xff" * 64)
    for name in ("last", "best"):
        model = ExLMModel.from_pretrained(run / "checkpoints" / name)
        for key, value in model.state_dict().items():
            assert torch.equal(value, result.model.state_dict()[key]), (name, key)


def test_resuming_a_finished_run_says_so_and_trains_nothing(dataset, tmp_path):
    run = tmp_path / "run"
    _train(dataset, run, 4)
    before = (run / "metrics.jsonl").read_text()
    res = run_cli(*_args(dataset, run, "--max-steps", "4", "--resume"))
    assert res.returncode == 0, res.stderr
    assert "already reached max_steps = 4" in res.stdout and "step_000004" in res.stdout
    assert "None" not in res.stdout
    assert (run / "metrics.jsonl").read_text() == before


def test_resume_with_another_model_config_names_the_fields(dataset, tmp_path):
    run = tmp_path / "run"
    _train(dataset, run, 4)
    res = run_cli(*_args(dataset, run, "--max-steps", "6", "--resume", "model.d_model=64"))
    assert_one_line_error(res, "step_000004", "model.d_model = 32", "model.d_model = 64")
