"""The driver's side of ``--ray`` (:class:`smiexlm.parts.on_ray._Writers`) against a stand-in
for Ray's client calls, for what a real cluster makes slow or racy to provoke: an error in a
writer said in one line, a writer that keeps dying, a node leaving mid-run. The real
two-node runs are in ``tests/integration/test_ray.py``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from smiexlm.errors import DataError
from smiexlm.parts import on_ray


class _TaskError(Exception):
    def __init__(self, cause: BaseException):
        super().__init__(f"remote traceback\n...\n{cause!r}")
        self.cause = cause


class _ActorError(Exception):
    pass


@dataclass(frozen=True)
class _Future:
    part: int


class _Ray:
    """Ray's client calls as ``_Writers`` uses them: parts end as ``outcomes`` say (a result
    or an exception to raise), and ``nodes()`` answers from ``membership`` in turn (its
    last answer from then on)."""

    class exceptions:
        RayTaskError, RayActorError = _TaskError, _ActorError

    def __init__(self, outcomes: dict, membership: list[list[dict]]):
        self.outcomes, self.membership = outcomes, membership

    total, free = 2.0, 2.0

    def cluster_resources(self):
        return {"CPU": self.total}

    def available_resources(self):
        return {"CPU": self.free}

    def nodes(self):
        return self.membership.pop(0) if len(self.membership) > 1 else self.membership[0]

    def remote(self, **_options):

        class _Writer:
            def __init__(self):
                self.write = self

            def remote(self, out, job, part, frames):
                return _Future(part)

        class _Class:
            @staticmethod
            def remote(make_process):
                return _Writer()

        return lambda cls: _Class

    def wait(self, futures, num_returns, timeout):
        return futures[:1], futures[1:]

    def get(self, future):
        outcome = self.outcomes[future.part]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


NODES = [{"NodeID": "a", "NodeManagerAddress": "10.0.0.1", "Alive": True},
         {"NodeID": "b", "NodeManagerAddress": "10.0.0.2", "Alive": True}]  # fmt: skip


def _writers(monkeypatch, outcomes, membership=None) -> on_ray._Writers:
    fake = _Ray(outcomes, membership or [NODES])
    monkeypatch.setattr(on_ray, "import_ray", lambda: fake)
    return on_ray._Writers("/parts", job=None, make_process=None)


def _result(part: int) -> dict:
    return {"part": part, "rows": 10, "worker": "n:1", "seconds": 1.0, "peak_rss_mib": 1.0}


def test_parts_come_back_and_their_writers_are_free_again(monkeypatch):
    writers = _writers(monkeypatch, {0: _result(0), 1: _result(1)})
    assert len(writers.idle) == 2  # one writer a free CPU
    writers.submit(0, [])
    writers.submit(1, [])
    assert not writers.idle
    assert [writers.take(None)["part"], writers.take(None)["part"]] == [0, 1]
    assert len(writers.idle) == 2 and not writers.running


def test_an_error_raised_in_a_writer_is_one_line(monkeypatch):
    own = DataError("model folder 'm' is damaged: expected its checksums")
    writers = _writers(monkeypatch, {0: _TaskError(own), 1: _TaskError(KeyError("SMILES"))})
    writers.submit(0, [])
    with pytest.raises(DataError) as caught:
        writers.take(None)
    assert caught.value is own  # the writer's own message, not Ray's remote traceback
    writers.submit(1, [])
    with pytest.raises(DataError, match=r"^part 1: KeyError: 'SMILES'$"):
        writers.take(None)


def test_a_writer_dead_past_its_restarts_names_its_part(monkeypatch):
    writers = _writers(monkeypatch, {4: _ActorError("the actor died")})
    writers.submit(4, [])
    with pytest.raises(DataError, match=rf"part 4: its writer died {on_ray.RESTARTS + 1} times"):
        writers.take(None)


def test_a_node_that_leaves_mid_run_stops_it_in_one_line(monkeypatch):
    left = [NODES[0], NODES[1] | {"Alive": False}]
    writers = _writers(monkeypatch, {0: _result(0)}, [NODES, left])
    writers.submit(0, [])
    with pytest.raises(DataError, match=r"node 10\.0\.0\.2 left the Ray cluster mid-run"):
        writers.take(None)


def test_on_a_shared_cluster_the_cpus_other_jobs_hold_are_left_to_them(monkeypatch):
    """Four CPUs, three held by another job for good: one writer, after a short wait for
    CPUs that a job which just ended gives back (without the wait: one writer a CPU, three
    of them waiting for a CPU without end)."""

    class _Clock:
        now = 0.0

        def time(self):
            self.now += 1.0
            return self.now

        def sleep(self, seconds):
            pass

    monkeypatch.setattr(_Ray, "total", 4.0)
    monkeypatch.setattr(_Ray, "free", 1.0)
    monkeypatch.setattr(on_ray, "time", _Clock())
    assert len(_writers(monkeypatch, {}).idle) == 1
