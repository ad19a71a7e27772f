"""CUDA-only checks: the Triton kernels against the float64 reference at the paper's shapes,
degenerate graphs, a short bf16 pre-training run, fine-tuning, and the featurizer on the GPU.

Every test here is marked ``cuda`` and skipped where ``torch.cuda.is_available()`` is false,
so CPU-only CI collects and skips them. The kernel tests also skip under
``TRITON_INTERPRET=1``: the kernels would then run in Triton's CPU interpreter, which
``tests/unit/dag/test_dag_triton.py`` already covers.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# name -> (B, L states, M targets): the SMILES shape and the paper's text shape (Appendix I)
SHAPES = {"smiles": (256, 40, 10), "text": (64, 308, 77)}
CUDA = torch.device("cuda")


@pytest.fixture()
def kernels(monkeypatch):
    """Dispatch to the compiled Triton kernels."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 would run the kernels in the CPU interpreter")
    monkeypatch.setenv("SMIEXLM_DAG_IMPL", "triton")
    from smiexlm.dag import resolve_impl

    assert resolve_impl(CUDA) == "triton"


def random_graph(B: int, L: int, M: int, seed: int = 0):
    """fp32 CUDA (emissions (B, M, L), links (B, L, L), state lengths, target lengths); sample
    0 uses the full L and M, the others S in [3L/4, L] and M_b in [max(1, 3M/4), M]."""
    g = torch.Generator().manual_seed(seed)
    em = torch.log_softmax(torch.randn(B, M, L, generator=g) * 2, dim=2)
    links = torch.log_softmax(torch.randn(B, L, L, generator=g), dim=2)
    s = torch.randint(L - L // 4, L + 1, (B,), generator=g)
    m = torch.randint(max(1, M - M // 4), M + 1, (B,), generator=g)
    s[0], m[0] = L, M
    m = torch.minimum(m, s)
    return em.to(CUDA), links.to(CUDA), s.to(CUDA), m.to(CUDA)


def ll_and_grads(fn, em, links, s, m, dtype):
    """(log-likelihood, d/d emissions, d/d links) of ``fn`` at inputs cast to ``dtype``."""
    e = em.detach().to(dtype).requires_grad_(True)
    lk = links.detach().to(dtype).requires_grad_(True)
    ll = fn(e, lk, s, m)
    torch.where(torch.isfinite(ll), ll, 0.0).sum().backward()
    return ll.detach(), e.grad, lk.grad


def assert_close_where_finite(got, want, atol, rtol, what):
    got, want = got.double(), want.double()
    assert torch.equal(torch.isfinite(got), torch.isfinite(want)), f"{what}: ±inf pattern differs"
    assert not got.isnan().any(), f"{what}: NaN"
    ok = torch.isfinite(want)
    err = ((got - want).abs() - rtol * want.abs())[ok]
    assert err.numel() == 0 or float(err.max()) <= atol, (
        f"{what}: max |diff| {float((got - want).abs()[ok].max()):.3e} over atol {atol} + rtol {rtol}"
    )


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernels_match_float64_reference(kernels, shape, dtype):
    from smiexlm.dag import dag_log_likelihood
    from smiexlm.dag.reference import reference_log_likelihood

    em, links, s, m = random_graph(*SHAPES[shape])
    ll, g_em, g_links = ll_and_grads(dag_log_likelihood, em, links, s, m, dtype)
    assert ll.dtype == torch.float32 and g_em.dtype == dtype and g_links.dtype == dtype
    # truth: the reference in float64 on exactly the values the kernels read
    em64, links64 = em.to(dtype).double(), links.to(dtype).double()
    ll64, g_em64, g_links64 = ll_and_grads(
        reference_log_likelihood, em64, links64, s, m, torch.float64
    )
    grad_tol = 2e-4 if dtype == torch.float32 else 1e-2  # bf16 gradients are rounded to 8 bits
    assert_close_where_finite(ll, ll64, atol=1e-3, rtol=1e-5, what="log-likelihood")
    assert_close_where_finite(g_em, g_em64, atol=grad_tol, rtol=0.0, what="d/d emissions")
    assert_close_where_finite(g_links, g_links64, atol=grad_tol, rtol=0.0, what="d/d links")
    # each target is emitted once on every path: the emission posteriors of a row sum to 1
    rows = g_em.float().sum(dim=2)  # (B, M)
    valid = torch.arange(rows.shape[1], device=CUDA)[None, :] < m[:, None]
    torch.testing.assert_close(rows[valid], torch.ones_like(rows[valid]), atol=5e-2, rtol=0)


DEGENERATE = ("m_equals_l", "m_1_and_2", "single_feasible_path", "logits_pm_1e4")


def degenerate_case(name: str):
    """(emissions, links, S, M) of one degenerate graph on CUDA, fp32."""
    g = torch.Generator().manual_seed(3)
    L = 12
    em = torch.log_softmax(torch.randn(4, L, L, generator=g), dim=2)
    links = torch.log_softmax(torch.randn(4, L, L, generator=g), dim=2)
    single = torch.full((4, L, L), -math.inf)
    single[:, torch.arange(L - 1), torch.arange(1, L)] = 0.0  # only v -> v + 1 edges
    extreme = (torch.randint(0, 2, (4, L, L), generator=g) * 2 - 1).float() * 1e4
    cases = {
        "m_equals_l": (em, links, [L, L, 7, 5], [L, L, 7, 5]),
        "m_1_and_2": (em, links, [1, 2, 1, 9], [1, 2, 1, 2]),
        "single_feasible_path": (em, single, [L, 9, 5, 3], [L, 9, 5, 3]),
        "logits_pm_1e4": (
            torch.log_softmax(extreme[:, :8], 2),
            extreme,
            [L, 10, 8, 6],
            [8, 6, 4, 2],
        ),
    }
    e, lk, s, m = cases[name]
    return e.to(CUDA), lk.to(CUDA), torch.tensor(s, device=CUDA), torch.tensor(m, device=CUDA)


@pytest.mark.parametrize("case", DEGENERATE)
def test_degenerate_graphs_have_no_nan(kernels, case):
    from smiexlm.dag import dag_log_likelihood
    from smiexlm.dag.reference import reference_log_likelihood

    em, links, s, m = degenerate_case(case)
    ll, g_em, g_links = ll_and_grads(dag_log_likelihood, em, links, s, m, torch.float32)
    assert torch.isfinite(ll).all(), ll
    assert torch.isfinite(g_em).all() and torch.isfinite(g_links).all()
    ll64, g_em64, g_links64 = ll_and_grads(reference_log_likelihood, em, links, s, m, torch.float64)
    # log-values near ±1e5 carry ~1e-2 of fp32 rounding, and their posteriors about as much
    atol = 2e-2 if case == "logits_pm_1e4" else 1e-4
    grad_atol = 2e-2 if case == "logits_pm_1e4" else 1e-3
    assert_close_where_finite(ll, ll64, atol=atol, rtol=1e-6, what=f"{case} log-likelihood")
    assert_close_where_finite(g_em, g_em64, atol=grad_atol, rtol=0, what=f"{case} d/d emissions")
    assert_close_where_finite(g_links, g_links64, atol=grad_atol, rtol=0, what=f"{case} d/d links")


def test_fused_gather_kernel_at_extreme_logits(kernels):
    from smiexlm.dag import dag_logits_log_likelihood
    from smiexlm.dag.gather import logsoftmax_gather
    from smiexlm.dag.triton_kernels import triton_logsoftmax_gather

    g = torch.Generator().manual_seed(5)
    B, L, M, V = 8, 40, 10, 369
    logits = ((torch.randint(0, 2, (B, L, V), generator=g) * 2 - 1) * 1e4).float().to(CUDA)
    logits.requires_grad_(True)
    targets = torch.randint(0, V, (B, M), generator=g).to(CUDA)
    em_k = triton_logsoftmax_gather(logits, targets)
    em_r = logsoftmax_gather(logits.detach().double(), targets)
    assert_close_where_finite(em_k, em_r, atol=1e-2, rtol=1e-6, what="gathered emissions")
    links = torch.log_softmax(torch.randn(B, L, L, generator=g), 2).to(CUDA)
    s, m = torch.full((B,), L, device=CUDA), torch.full((B,), M, device=CUDA)
    ll = dag_logits_log_likelihood(logits, targets, links, s, m)
    ll.sum().backward()
    assert torch.isfinite(ll).all() and torch.isfinite(logits.grad).all()


def test_kernels_take_lengths_from_another_device(kernels):
    from smiexlm.dag.triton_kernels import triton_log_likelihood

    em, links, s, m = random_graph(4, 20, 6)
    on_gpu = triton_log_likelihood(em, links, s, m)
    torch.testing.assert_close(triton_log_likelihood(em, links, s.cpu(), m.cpu()), on_gpu)


# ------------------------------------------------------------------ training and serving
@pytest.fixture(scope="module")
def moses_dataset(shared_data: Path, tmp_path_factory) -> Path:
    from tests.conftest import require_file
    from tests.unit.pretraining.test_training_support import build_dataset

    source = require_file(shared_data, "pretrain/moses_test.smi.gz")
    return build_dataset(source, tmp_path_factory.mktemp("cuda") / "ds", n=600)


def test_tiny_exlm_50_bf16_steps_on_cuda_lower_the_loss(moses_dataset, tmp_path):
    from smiexlm.model.model import ExLMModel
    from smiexlm.modelio.weights import save_pretrained_sharded
    from smiexlm.pretraining.config import load_config
    from smiexlm.pretraining.trainer import pretrain
    from smiexlm.tokenizer import load_tokenizer

    overrides = [
        "device=cuda", "precision=bf16", "max_tokens=2048", "update_freq=1", "warmup_steps=5",
        "lr=0.002", "log_every=10", "valid_every=50", "valid_batches=4", "save_every=50",
        "progress=false", "num_workers=0",
    ]  # fmt: skip
    config = load_config("mol_tiny_exlm", overrides)
    result = pretrain(config, moses_dataset, tmp_path / "run", max_steps=50)
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0], losses
    assert result.step == 50 and result.last_valid_loss is not None
    assert next(result.model.parameters()).device.type == "cuda"

    loaded = ExLMModel.from_pretrained(result.last_checkpoint, map_location="cuda")
    expected = result.model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    tokenizer = load_tokenizer(moses_dataset / "vocab.json")
    save_pretrained_sharded(result.model, tmp_path / "sharded", tokenizer, max_shard_mib=1.0)
    sharded = ExLMModel.from_pretrained(tmp_path / "sharded", map_location="cuda")
    ids = torch.tensor([[1, 20, 21, 22, 2]], device=CUDA)
    mask = torch.ones_like(ids, dtype=torch.bool)
    torch.testing.assert_close(
        loaded.encode(ids, mask).pooled, sharded.encode(ids, mask).pooled, rtol=0, atol=0
    )


def test_one_finetuning_epoch_on_cuda(shared_data):
    from smiexlm.finetuning.adapter import finetune_once
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.config import finetune_config
    from smiexlm.moleculenet.loaders import load_task
    from smiexlm.moleculenet.splits import make_split

    task = load_task("bbbp", allow_download=False).subset(range(240))
    split = make_split(task.smiles, "random", seed=0)
    cfg = finetune_config("bbbp", epochs=1, batch_size=32, device="cuda")
    result = finetune_once(task, split, cfg, seed=0, backbone=Backbone(), progress=False)
    assert 0.0 <= result.test <= 100.0 and math.isfinite(result.valid)
    assert result.config["device"] == "cuda"


def test_featurizer_on_cuda_matches_cpu():
    from smiexlm.embedding.featurizer import Featurizer

    panel = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "C[C@H](N)C(=O)O", "O=C=O", "CCN(CC)CC"]
    cpu = Featurizer.from_pretrained(device="cpu")
    gpu = Featurizer.from_pretrained(device="cuda")
    for pooling in ("cls", "mean"):
        a = cpu.featurize(panel, pooling=pooling)
        b = gpu.featurize(panel, pooling=pooling)
        assert a.shape == b.shape and (b == b).all()
        assert abs(a - b).max() < 1e-3 * max(1.0, float(abs(a).max())), pooling
