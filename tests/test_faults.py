"""Fault injection: truncated, corrupted and interrupted inputs and outputs.

Each test is a user's command (the real ``smiexlm`` entry point, in a subprocess) plus the
exit code and message it must give. A bad input ends with exit code 2 and one line on stderr
that names the file and the problem, never a traceback; an interrupted command leaves the
previous result whole and no partial file under a final name.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import smiexlm_command

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "smiexlm" / "assets" / "default_model"


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [smiexlm_command(), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env,
    )  # fmt: skip


def assert_one_line_error(res: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, no traceback, one ``error:`` line that contains every needle."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    """Temporary files an interrupted writer left behind (there must be none)."""
    return sorted(p.name for p in folder.rglob("*") if ".tmp" in p.name)


# ---------------------------------------------------------------------- DAG loss
def test_dag_backward_when_every_target_has_length_one(monkeypatch):
    from smiexlm.dag import dag_log_likelihood

    monkeypatch.setenv("SMIEXLM_DAG_IMPL", "reference")
    em = torch.randn(3, 1, 4, dtype=torch.float64, requires_grad=True)  # (B, M=1, L)
    links = torch.randn(3, 4, 4, dtype=torch.float64, requires_grad=True)
    s, m = torch.tensor([1, 3, 1]), torch.tensor([1, 1, 1])
    ll = dag_log_likelihood(em, links, s, m)
    finite = torch.isfinite(ll)
    assert finite.tolist() == [True, False, True]  # S = 3, M = 1: no path ends at state 2
    ll[finite].sum().backward()
    assert torch.equal(links.grad, torch.zeros_like(links))  # no transition is taken
    assert em.grad[0, 0, 0] == 1.0 and em.grad[2, 0, 0] == 1.0


# ---------------------------------------------------------------------- atomic writes
def test_atomic_paths_keep_the_old_result_on_error(tmp_path):
    from smiexlm.paths import atomic_paths

    a, b = tmp_path / "emb.npy", tmp_path / "emb.ids.csv"
    a.write_text("old a")
    b.write_text("old b")
    with pytest.raises(RuntimeError), atomic_paths(a, b) as (ta, tb):
        ta.write_text("new a")
        raise RuntimeError("interrupted while writing the second file")
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    assert leftovers(tmp_path) == []
    with atomic_paths(a, b) as (ta, tb):
        ta.write_text("new a")
        tb.write_text("new b")
        assert a.read_text() == "old a"  # nothing visible before the block ends
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert leftovers(tmp_path) == []
