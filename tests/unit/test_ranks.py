"""A process's place in a job, read from the torchrun environment by ``smiexlm.training.ranks``."""

from __future__ import annotations

import pytest
import torch

from smiexlm.errors import ConfigError
from smiexlm.training.ranks import DistInfo, detect

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture
def environ(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_env(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


def test_a_process_alone_is_rank_0_of_1(environ):
    assert detect() == DistInfo(0, 0, 1, 1)
    assert detect().is_main and not detect().enabled
    environ(RANK="3", WORLD_SIZE="1")  # a world of one: the rank is not looked at
    assert detect() == DistInfo()


def test_torchrun_variables_give_the_place(environ):
    environ(RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4")
    info = detect()
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (5, 1, 8, 4)
    assert info.enabled and not info.is_main
    environ(RANK="0", WORLD_SIZE="2", LOCAL_RANK="", LOCAL_WORLD_SIZE="")
    assert detect() == DistInfo(0, 0, 2, 2)  # one node: the local world is the world


@pytest.mark.parametrize(
    ("values", "field"),
    [({"WORLD_SIZE": "two"}, "WORLD_SIZE"), ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK"),
     ({"WORLD_SIZE": "2", "RANK": "-1"}, "RANK"),
     ({"WORLD_SIZE": "2", "LOCAL_RANK": "x"}, "LOCAL_RANK")],
)  # fmt: skip
def test_bad_variables_name_the_field(environ, values, field):
    environ(**values)
    with pytest.raises(ConfigError, match=f"'{field}'"):
        detect()


def test_batch_workers_share_the_place(environ):
    from smiexlm.training.workers import Workers
    from smiexlm.training.workers import detect as detect_workers

    environ(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    threads = torch.get_num_threads()
    try:
        workers = detect_workers(threads=1)
    finally:
        torch.set_num_threads(threads)
    assert isinstance(workers, Workers) and workers.threads == 1
    assert DistInfo(1, 1, 2, 2) == DistInfo(
        workers.rank, workers.local_rank, workers.world_size, workers.local_world_size
    )
    assert workers.owns(3) and not workers.owns(2) and not workers.is_main


def test_a_thread_count_past_eight_a_core_is_refused_before_it_crashes_the_process(monkeypatch):
    from smiexlm.errors import ConfigError
    from smiexlm.training import workers

    monkeypatch.setattr(workers, "usable_cores", lambda: 2)
    assert workers.check_threads(16) == 16
    for bad in (0, -2, 17, 100_000, True, 2.0):
        with pytest.raises(ConfigError, match="at most 16"):
            workers.check_threads(bad, "--threads")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'threads' = 100000"):
        workers.detect(100_000)
