"""Distributed data parallel training: under ``torchrun``, or started by a pretraining job
itself on the cores of one machine (:func:`launch_local`, :mod:`smiexlm.pretraining.launch`).

``torchrun`` (or :func:`launch_local`) sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``; without them the run is a single process
(:func:`smiexlm.training.ranks.detect` reads them). The process group uses NCCL on
GPUs and gloo on CPUs. Batches are sharded by global micro-batch index (see
:func:`shard_batches`) so that N processes with ``update_freq = u`` consume exactly the
micro-batches one process with ``update_freq = N·u`` would, in the same optimiser steps.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from smiexlm.device import resolve_device
from smiexlm.errors import ConfigError
from smiexlm.training.ranks import LAUNCHED_ENV, DistInfo, detect
from smiexlm.training.workers import usable_cores


def select_device(requested: str, info: DistInfo) -> torch.device:
    """This process's device: :func:`~smiexlm.device.resolve_device`, where ``auto`` and
    ``cuda`` mean the GPU of ``LOCAL_RANK``; a GPU becomes the current CUDA device."""
    device = resolve_device(requested, local_rank=info.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def init(info: DistInfo, device: torch.device) -> bool:
    """Join the process group (NCCL on GPU, gloo on CPU) when running under torchrun and no
    one has yet; whether this call created it."""
    if not info.enabled or dist.is_initialized():
        return False
    if device.type == "cuda":
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return True


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, info: DistInfo, device: torch.device) -> nn.Module:
    """DDP-wrap the model under torchrun; the bare model otherwise."""
    if not info.enabled:
        return model
    ids = [device.index] if device.type == "cuda" else None
    # Every forward reaches every parameter (a batch without targets gives a zero loss that
    # still belongs to the whole graph), so DDP need not search the graph for unused ones.
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def shard_batches(n_batches: int, world_size: int, update_freq: int) -> int:
    """Micro-batches per epoch that fill whole optimiser steps (the remainder is dropped)."""
    per_step = world_size * update_freq
    return (n_batches // per_step) * per_step


def all_reduce_sum(values: list[float], device: torch.device, info: DistInfo) -> list[float]:
    """Sum a few scalars over all processes (identity in a single process)."""
    if not info.enabled:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def gather_ints(device: torch.device, info: DistInfo, value: int) -> list[int]:
    """``value`` of every process, in rank order (``[value]`` in a single process)."""
    if not info.enabled:
        return [value]
    mine = torch.tensor([value], dtype=torch.int64, device=device)
    every = [torch.zeros_like(mine) for _ in range(info.world_size)]
    dist.all_gather(every, mine)
    return [int(t.item()) for t in every]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


# ------------------------------------------------------------- one machine, several cores
#: the launcher's PID, in the processes it starts: they end when it does
LAUNCHER_PID_ENV = "SMIEXLM_LAUNCHER_PID"
#: beyond this, gloo's all-reduce of a small model costs more than another core gives
MAX_LOCAL_PROCESSES = 8


def free_cores() -> int:
    """Cores this process may use, less the machine's 1-minute load average (at least 1)."""
    busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return max(1, usable_cores() - int(busy + 0.5))


def local_processes(requested: int | None, update_freq: int, cores: int) -> int:
    """How many processes a CPU run starts on this machine.

    Each of N processes accumulates ``update_freq / N`` micro-batches, so the optimiser sees
    the config's global batch, in the same micro-batches, whatever N is. ``requested`` must
    therefore divide ``update_freq``; by default (None) N is the largest divisor of
    ``update_freq`` that fits in ``cores`` (and ``MAX_LOCAL_PROCESSES``).
    """
    if requested is not None:
        if requested < 1 or update_freq % requested:
            raise ConfigError(
                "nproc", requested, f"a divisor of update_freq = {update_freq} (at least 1)"
            )
        return requested
    limit = min(cores, MAX_LOCAL_PROCESSES)
    return max(n for n in range(1, limit + 1) if update_freq % n == 0)


def run_on_free_cores(
    config, requested: int | None, worker: Callable[[int], list[str]], run_dir: Path
) -> int | None:
    """Run a CPU run of ``config`` as N processes when N > 1 fit (see :func:`local_processes`),
    holding ``run_dir``'s lock, and return their exit code; None when this process should
    train alone (a GPU run, or one process). ``worker(update_freq)`` is a worker's command."""
    from smiexlm.device import resolve_device
    from smiexlm.training.runlock import RunLock

    if resolve_device(config.device).type != "cpu":
        return None
    cores = free_cores()
    n = local_processes(requested, config.update_freq, cores)
    if n == 1:
        return None
    threads = config.num_threads or max(1, cores // n)
    with RunLock(run_dir):
        return launch_local(n, worker(config.update_freq // n), threads)


def relaunch(processes: int, command: list[str]) -> int | None:
    """Run ``command`` (this process's own command line) as ``processes`` data-parallel
    processes of one thread each and return their exit code; None when this process is to do
    the work itself: one process was asked for, or it is one of those started (it then follows
    its launcher), or a torchrun worker."""
    info = detect()
    if info.enabled or processes == 1:
        if info.enabled and os.environ.get(LAUNCHED_ENV) == "1":
            follow_launcher()
        return None
    return launch_local(processes, command, 1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_local(n_processes: int, command: list[str], threads: int) -> int:
    """Run ``command`` as ``n_processes`` DDP processes (gloo) with ``threads`` threads each,
    and return the first non-zero exit code (0 when all succeed).

    Rank 0 prints as a single process would; the other ranks' output is discarded, except
    their errors. SIGINT and SIGTERM reach every process, which checkpoint and stop together;
    so does the launcher's death, even by SIGKILL (see :func:`follow_launcher`).
    """
    port = str(_free_port())
    procs = []
    for rank in range(n_processes):
        env = dict(os.environ)
        env.update(
            RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(n_processes),
            MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS=str(threads),
            **{LAUNCHED_ENV: "1", LAUNCHER_PID_ENV: str(os.getpid())},
        )  # fmt: skip
        out = None if rank == 0 else subprocess.DEVNULL
        procs.append(subprocess.Popen(command, env=env, stdout=out))
    try:
        return _wait_all(procs)
    except (KeyboardInterrupt, SystemExit):  # a terminal's Ctrl-C reached them too, SIGTERM not
        _stop(procs)
        return next((c for c in (p.wait() for p in procs) if c != 0), 0)


def _wait_all(procs: list[subprocess.Popen]) -> int:
    """Wait for every process; when one fails, stop the others (they would wait for it)."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            _stop(procs)
            return failed[0]
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.2)


def _stop(procs: list[subprocess.Popen], grace: float = 60.0) -> None:
    """SIGTERM the running processes (they checkpoint and stop), then kill what is left."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()


def follow_launcher(poll_s: float = 1.0) -> None:
    """In a process :func:`launch_local` started: receive SIGTERM (checkpoint and stop) when
    the launcher dies, however it dies, instead of training on as an orphan.

    Linux delivers the signal itself (``prctl(PR_SET_PDEATHSIG)``); elsewhere, and for a
    launcher that died before that call, a watchdog thread sees the parent PID change."""
    launcher = int(os.environ.get(LAUNCHER_PID_ENV) or 0)
    if not launcher:
        return
    _parent_death_signal(signal.SIGTERM)
    watchdog = threading.Thread(
        target=_watch_parent, args=(launcher, poll_s), name="launcher-watchdog", daemon=True
    )
    watchdog.start()


def _parent_death_signal(sig: signal.Signals) -> None:
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1  # <linux/prctl.h>
    with contextlib.suppress(OSError, AttributeError):  # no libc prctl: the watchdog alone
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(sig), 0, 0, 0)


def _watch_parent(launcher: int, poll_s: float) -> None:
    while os.getppid() == launcher:
        time.sleep(poll_s)
    os.kill(os.getpid(), signal.SIGTERM)
