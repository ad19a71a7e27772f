"""The processes of one batch job: a single process, or ranks started by ``torchrun``.

``torchrun --nproc_per_node N smiexlm embed ...`` (or ``python -m torch.distributed.run``)
sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` in each process. :func:`job_workers` learns this process's place from
:func:`smiexlm.training.ranks.detect` and joins a gloo process group, which carries nothing but a few
barriers and the per-rank counts at the end (never a tensor on a GPU), so gloo serves CPU and
GPU jobs alike and needs no coordinator of our own. Each rank takes the parts ``i`` with
``i % world_size == rank`` (:meth:`Workers.owns`); a GPU job puts rank ``LOCAL_RANK`` on GPU
``LOCAL_RANK``.

Threads: torchrun sets ``OMP_NUM_THREADS=1`` by default, which idles most cores of a large
node; under torchrun each process therefore uses ``cores / LOCAL_WORLD_SIZE`` threads (cores
= the CPUs this process may run on), unless ``threads`` says otherwise. A single process keeps
torch's own default (``OMP_NUM_THREADS`` when set, else every core).
"""

from __future__ import annotations

import datetime
import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from smiexlm.errors import ConfigError
from smiexlm.training import ranks

# The final barrier waits for the slowest rank's last part: with few large parts on CPUs that
# is tens of minutes, past torch's 30-minute default. A rank that dies makes torchrun stop the
# others, so a long timeout never leaves a job hanging on a dead peer.
BARRIER_TIMEOUT = datetime.timedelta(hours=24)


@dataclass(frozen=True)
class Workers(ranks.DistInfo):
    """This process's place in the job (rank, world size, local rank) and its threads."""

    threads: int = 1

    def owns(self, part: int) -> bool:
        """Whether part ``part`` is this rank's to write."""
        return part % self.world_size == self.rank

    def device(self, requested: str) -> str:
        """``requested`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) with ``auto``/``cuda`` meaning
        GPU ``LOCAL_RANK`` when CUDA is used."""
        from smiexlm.device import resolve_device

        return str(resolve_device(requested, local_rank=self.local_rank))

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()

    def gather(self, value: Any) -> list[Any]:
        """``value`` of every rank, in rank order (on every rank)."""
        if not self.enabled:
            return [value]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out


def usable_cores() -> int:
    """CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


#: threads a process may ask for, per core it may use: more only slows it, and a count in the
#: thousands exhausts the memory of the threads' stacks (a crash, not an error)
THREADS_PER_CORE = 8


def check_threads(threads: int, what: str = "threads") -> int:
    """``threads`` when it is a positive integer at most :data:`THREADS_PER_CORE` per usable
    core; else a ConfigError naming ``what``."""
    limit = THREADS_PER_CORE * usable_cores()
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= limit:
        raise ConfigError(what, threads, f"a positive integer, at most {limit} "
                          f"({THREADS_PER_CORE} per core this process may use)")  # fmt: skip
    return threads


def set_threads(threads: int, what: str = "threads") -> None:
    """Torch's intra-op threads, checked by :func:`check_threads`."""
    import torch

    torch.set_num_threads(check_threads(threads, what))


def detect(threads: int | None = None) -> Workers:
    """This process's rank, world size and thread count, from the torchrun environment."""
    import torch

    info = ranks.detect()
    if threads is None and info.enabled:
        threads = max(1, usable_cores() // max(1, info.local_world_size))
    if threads is not None:
        set_threads(threads)
    return Workers(**asdict(info), threads=torch.get_num_threads())


@contextmanager
def job_workers(threads: int | None = None) -> Iterator[Workers]:
    """:func:`detect`, joined to the job's gloo group under torchrun for the block's length."""
    workers = detect(threads)
    if not workers.enabled:
        yield workers
        return
    import torch.distributed as dist

    owned = not dist.is_initialized()
    if owned:
        dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)
    try:
        yield workers
    finally:
        if owned and dist.is_initialized():
            dist.destroy_process_group()


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (MiB; ``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
