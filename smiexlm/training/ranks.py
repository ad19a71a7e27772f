"""This process's place in a job of several processes: rank, world size, local rank.

``torchrun`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` in each
process it starts, and so does :func:`smiexlm.training.distributed.launch_local`; without them
the process is alone. :func:`detect` is the one reader of these variables: pretraining,
fine-tuning and the batch jobs (``embed``, ``predict``) all ask it. Importing this module
costs nothing (no torch), so a command can ask before it loads anything heavy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from smiexlm.errors import ConfigError

#: set in the processes :func:`smiexlm.training.distributed.launch_local` starts: their
#: launcher holds the job's locks, and they must not start more processes
LAUNCHED_ENV = "SMIEXLM_LAUNCHED"


@dataclass(frozen=True)
class DistInfo:
    """This process's place in a torchrun job (a single process: the defaults)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Whether this process writes what the job writes once (rank 0)."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        """Whether there is more than one process."""
        return self.world_size > 1


def detect() -> DistInfo:
    """Rank and world size from the torchrun environment (a single process otherwise).

    ConfigError for a variable that is not an integer, or a ``RANK`` outside
    ``[0, WORLD_SIZE)``."""
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return DistInfo()
    rank = _env_int("RANK", 0)
    if not 0 <= rank < world:
        raise ConfigError("RANK", rank, f"an integer in [0, {world - 1}] (WORLD_SIZE = {world})")
    return DistInfo(rank, _env_int("LOCAL_RANK", 0), world, _env_int("LOCAL_WORLD_SIZE", world))


def takes_locks() -> bool:
    """Whether this process holds the locks of the folders its job writes: the job's main
    process (rank 0), unless a launcher started it (the launcher holds them then)."""
    return detect().is_main and os.environ.get(LAUNCHED_ENV) != "1"


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ConfigError(name, value, "an integer (set by torchrun)") from None
