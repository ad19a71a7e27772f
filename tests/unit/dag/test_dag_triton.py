"""The Triton kernels against the PyTorch reference, run by Triton's CPU interpreter.

``TRITON_INTERPRET=1`` must be set before the kernels are defined, and it changes how every
``@triton.jit`` function in the process behaves. So the kernel checks run once, in a child
Python process started from this file (see ``__main__`` below), and the tests here read its
JSON report. The pytest process itself never imports the kernel module.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from smiexlm.dag import resolve_impl
from smiexlm.errors import ConfigError

RTOL = 1e-4
# log-values near −2e4 carry ~2e-3 absolute fp32 rounding in both implementations
TOL = {"mixed": RTOL, "edges": RTOL, "very_negative": 1e-2}


def _cases():
    """(name, emissions, links, state_lengths, target_lengths) in fp32, small for the interpreter."""
    g = torch.Generator().manual_seed(0)
    B, M, L = 4, 6, 20
    em = torch.log_softmax(torch.randn(B, M, L, generator=g) * 2, dim=2)
    links = torch.log_softmax(torch.randn(B, L, L, generator=g), dim=2)
    mixed = (em, links, torch.tensor([20, 17, 9, 6]), torch.tensor([6, 3, 9 - 5, 6]))
    edge_links = links.clone()
    edge_links[2] = -math.inf  # no edge at all: −inf, zero gradient
    edges = (em, edge_links, torch.tensor([1, 6, 8, 2]), torch.tensor([1, 6, 3, 1]))  # M=1, M=L
    very_negative = (
        em * 200 - 3000,
        links * 50 - 400,
        torch.tensor([20, 12, 7, 16]),
        torch.tensor([6, 5, 4, 2]),
    )
    return {"mixed": mixed, "edges": edges, "very_negative": very_negative}


def _run_checks() -> dict:
    """Child process body: compare kernels with the reference, return a JSON-able report."""
    os.environ["SMIEXLM_DAG_IMPL"] = "triton"
    from smiexlm.dag import dag_log_likelihood, dag_logits_log_likelihood
    from smiexlm.dag.gather import logsoftmax_gather
    from smiexlm.dag.reference import reference_log_likelihood
    from smiexlm.dag.triton_kernels import triton_logsoftmax_gather

    def close(a, b, scale=1.0):
        a, b = a.double(), b.double()
        same_inf = torch.equal(torch.isinf(a), torch.isinf(b))
        finite = torch.isfinite(a) & torch.isfinite(b)
        err = ((a - b).abs() / (b.abs() + scale))[finite]
        return {
            "same_inf": same_inf,
            "nan": bool(a.isnan().any()),
            "err": float(err.max()) if err.numel() else 0.0,
        }

    report = {}
    for name, (em, links, s, m) in _cases().items():
        e1, l1 = em.clone().requires_grad_(True), links.clone().requires_grad_(True)
        ll_k = dag_log_likelihood(e1, l1, s, m)  # dispatched to the kernels
        torch.where(torch.isfinite(ll_k), ll_k, 0.0).sum().backward()
        e2, l2 = em.clone().requires_grad_(True), links.clone().requires_grad_(True)
        ll_r = reference_log_likelihood(e2, l2, s, m)
        torch.where(torch.isfinite(ll_r), ll_r, 0.0).sum().backward()
        report[name] = {
            "value": close(ll_k, ll_r, scale=0.0),
            "grad_emissions": close(e1.grad, e2.grad),
            "grad_links": close(l1.grad, l2.grad),
            "grad_type": type(ll_k.grad_fn).__name__,
        }
    g = torch.Generator().manual_seed(1)
    B, L, M, V = 2, 9, 5, 37
    logits = torch.randn(B, L, V, generator=g, requires_grad=True)
    targets = torch.randint(0, V, (B, M), generator=g)
    targets[0, 3] = targets[0, 1]  # repeated target ids accumulate
    weight = torch.randn(B, M, L, generator=g)
    (grad_k,) = torch.autograd.grad(
        (triton_logsoftmax_gather(logits, targets) * weight).sum(), logits
    )
    em_k = triton_logsoftmax_gather(logits, targets)
    em_r = logsoftmax_gather(logits, targets)
    (grad_r,) = torch.autograd.grad((em_r * weight).sum(), logits)
    links = torch.log_softmax(torch.randn(B, L, L, generator=g), dim=2)
    s, m = torch.tensor([9, 7]), torch.tensor([5, 3])
    fused = dag_logits_log_likelihood(logits, targets, links, s, m)
    report["gather"] = {"value": close(em_k, em_r), "grad_logits": close(grad_k, grad_r)}
    report["fused"] = {
        "value": close(fused, reference_log_likelihood(em_r, links, s, m), scale=0.0)
    }
    from smiexlm.dag import _self_check

    report["self_check"] = _self_check(torch.device("cpu"))  # what auto asks of a CUDA device
    return report


@pytest.fixture(scope="module")
def report() -> dict:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "SMIEXLM_DAG_IMPL": "triton"}
    proc = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["mixed", "edges", "very_negative"])
def test_kernel_matches_reference(report, case):
    r = report[case]
    assert r["grad_type"] == "TritonDagLogLikelihoodBackward"  # the dispatch chose the kernel
    for key in ("value", "grad_emissions", "grad_links"):
        assert r[key]["same_inf"] and not r[key]["nan"], (case, key, r[key])
        assert r[key]["err"] < TOL[case], (case, key, r[key])


def test_fused_gather_kernel_matches_torch(report):
    for key, r in {**report["gather"], **report["fused"]}.items():
        assert r["same_inf"] and not r["nan"] and r["err"] < RTOL, (key, r)


def test_the_kernels_pass_their_own_self_check(report):
    assert report["self_check"] is None


@pytest.mark.parametrize("failure", ["raises", "differs"])
def test_auto_falls_back_to_the_reference_when_the_kernels_fail_their_self_check(
    monkeypatch, caplog, failure
):
    import smiexlm.dag as dag

    def broken(device):
        if failure == "raises":
            raise RuntimeError("ptxas exited with status 255")
        return "their log-likelihood differs from the reference by 0.5"

    monkeypatch.setattr(dag, "_triton_available", lambda: True)
    monkeypatch.setattr(dag, "_interpreting", lambda: False)
    monkeypatch.setattr(dag, "_self_check", broken)
    monkeypatch.setattr(dag, "_PROBLEMS", {})
    monkeypatch.setenv("SMIEXLM_DAG_IMPL", "auto")
    cuda = torch.device("cuda")
    with caplog.at_level("WARNING", logger="smiexlm.dag"):
        assert resolve_impl(cuda) == resolve_impl(cuda) == "reference"
    said = [r.getMessage() for r in caplog.records if r.name == "smiexlm.dag"]
    assert len(said) == 1 and ("ptxas" in said[0] or "differs" in said[0]), said
    monkeypatch.setenv("SMIEXLM_DAG_IMPL", "triton")  # asked for by name: run regardless
    assert resolve_impl(cuda) == "triton"


def test_dispatch_env_var(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv("SMIEXLM_DAG_IMPL", "auto")
    assert resolve_impl(cpu) == "matmul"
    monkeypatch.setenv("SMIEXLM_DAG_IMPL", "matmul")
    assert resolve_impl(torch.device("cuda")) == "matmul"
    monkeypatch.setenv("SMIEXLM_DAG_IMPL", "reference")
    assert resolve_impl(torch.device("cuda")) == "reference"
    monkeypatch.setenv("SMIEXLM_DAG_IMPL", "triton")
    with pytest.raises(ConfigError, match="SMIEXLM_DAG_IMPL"):
        resolve_impl(cpu)
    monkeypatch.setenv("SMIEXLM_DAG_IMPL", "fast")
    with pytest.raises(ConfigError, match="SMIEXLM_DAG_IMPL"):
        resolve_impl(cpu)


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps(_run_checks()))
