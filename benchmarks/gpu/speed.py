"""Phase 2 of the GPU campaign: DAG-loss timings and pre-training throughput / MFU.

    python benchmarks/gpu/speed.py --out DIR --dataset MOSES_DATASET [--budget 160] [--dry-run]

Writes ``DIR/speed.json`` after every measurement (a run stopped by its budget keeps what it
measured):

- ``device``: GPU name, torch / triton versions; ``matmul_tflops``: an 8192^3 bf16 product;
- ``dag``: forward+backward ms and peak MiB of the DAG loss per shape (SMILES B 256 L 40 M 10,
  text B 64 L 308 M 77), dtype (fp32, bf16 emissions and links) and implementation (Triton,
  PyTorch reference, banded matmul), with the largest differences to the float64 reference;
- ``throughput``: full optimiser steps (bf16 autocast) of mol_small / mol_base MLM and ExLM
  (k = 2, k = 4) on 32k-token MOSES batches: tokens/s, step ms, peak memory, model FLOPs per
  step (PyTorch's FLOP counter) and MFU against the bf16 dense peak;
- ``pretrain_rates``: steps/s of the two ``mol_small_*_gpu`` configs, which size phase 3.

``--dry-run`` runs the same code on CPU at toy sizes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

DAG_SHAPES = {"smiles": (256, 40, 10), "text": (64, 308, 77)}
THROUGHPUT = [  # (preset, objective, k)
    ("small", "mlm", 2), ("small", "exlm", 2), ("small", "exlm", 4),
    ("mol_base", "mlm", 2), ("mol_base", "exlm", 2), ("mol_base", "exlm", 4),
]  # fmt: skip
MICRO = {"n_layers": 2, "n_heads": 2, "d_model": 32, "d_ff": 64, "n_transition_heads": 2}  # dry run
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}  # dense, per GPU


class Budget:
    def __init__(self, seconds: float):
        self.t0, self.seconds = time.perf_counter(), seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device, warmup: int, reps: int, budget: Budget) -> tuple[float, int]:
    """(median ms, reps done) of ``fn()``; fewer reps when the budget runs low."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(1e3 * (time.perf_counter() - t0))
        if budget.left() < 0.2 * budget.seconds and len(times) >= 3:
            break
    return statistics.median(times), len(times)


def peak_mib(fn, device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    sync(device)
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def matmul_tflops(device: torch.device, dry_run: bool) -> float:
    n = 256 if dry_run else 8192
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ms, _ = timed(lambda: a @ b, device, 3, 10, Budget(60))
    return 2 * n**3 / (ms / 1e3) / 1e12


# ------------------------------------------------------------------ DAG loss
def dag_inputs(B: int, L: int, M: int, device: torch.device):
    g = torch.Generator().manual_seed(0)
    em = torch.log_softmax(torch.randn(B, M, L, generator=g) * 2, dim=2)
    links = torch.log_softmax(torch.randn(B, L, L, generator=g), dim=2)
    s = torch.randint(L - L // 4, L + 1, (B,), generator=g)
    m = torch.minimum(torch.randint(max(1, M - M // 4), M + 1, (B,), generator=g), s)
    s[0], m[0] = L, M
    return em.to(device), links.to(device), s.to(device), m.to(device)


def dag_fwd_bwd(em, links, s, m, impl: str):
    """(log-likelihood, grad emissions, grad links) with SMIEXLM_DAG_IMPL=impl."""
    from smiexlm.dag import dag_log_likelihood

    os.environ["SMIEXLM_DAG_IMPL"] = impl
    e = em.detach().requires_grad_(True)
    lk = links.detach().requires_grad_(True)
    ll = dag_log_likelihood(e, lk, s, m)
    torch.where(torch.isfinite(ll), ll, 0.0).sum().backward()
    return ll.detach(), e.grad, lk.grad


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    ok = torch.isfinite(a) & torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
        return math.inf
    return float((a - b)[ok].abs().max()) if ok.any() else 0.0


def measure_dag(device: torch.device, dry_run: bool, budget: Budget, record) -> None:
    shapes = {"toy": (8, 12, 4)} if dry_run else DAG_SHAPES
    impls = ["triton", "reference", "matmul"] if device.type == "cuda" else ["reference", "matmul"]
    warmup, reps = (1, 3) if dry_run else (2, 20)
    for shape, (B, L, M) in shapes.items():
        em, links, s, m = dag_inputs(B, L, M, device)
        for dtype in (torch.float32, torch.bfloat16):
            e, lk = em.to(dtype), links.to(dtype)
            # truth: the float64 reference on exactly the values the implementations read
            truth = dag_fwd_bwd(e.double(), lk.double(), s, m, "reference")
            for impl in impls:
                row = {"shape": shape, "B": B, "L": L, "M": M, "dtype": str(dtype)[6:]}
                row["impl"] = impl
                if budget.left() < 0.15 * budget.seconds:
                    record(row | {"skipped": "budget"})
                    continue
                try:
                    ll, ge, gl = dag_fwd_bwd(e, lk, s, m, impl)
                    run = lambda: dag_fwd_bwd(e, lk, s, m, impl)  # noqa: B023, E731
                    ms, n = timed(run, device, warmup, reps, budget)
                    row |= {"ms": round(ms, 3), "reps": n}
                    row["peak_mib"] = peak_mib(run, device)
                    row["max_diff"] = {
                        "ll": max_diff(ll, truth[0]),
                        "grad_em": max_diff(ge, truth[1]),
                        "grad_links": max_diff(gl, truth[2]),
                    }
                except Exception as error:  # noqa: BLE001 - a failing case is a result
                    row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
                record(row)
        os.environ.pop("SMIEXLM_DAG_IMPL", None)


# ------------------------------------------------------------------ training steps
def token_batches(dataset: Path, max_tokens: int, n: int):
    from smiexlm.data.collate import collate
    from smiexlm.data.sampler import TokenBudgetSampler
    from smiexlm.data.shards import TokenDataset

    train = TokenDataset(dataset, "train")
    batches = []
    for b in TokenBudgetSampler(train.lengths, max_tokens, shuffle=True, seed=0):
        batches.append(collate([train[i] for i in b]))
        if len(batches) == n:
            break
    return batches


def measure_step(preset, objective, k, dataset, max_tokens, device, dry_run, budget) -> dict:
    from torch.utils.flop_counter import FlopCounterMode

    from smiexlm.model.masking import mask_tokens
    from smiexlm.model.model import ExLMModel
    from smiexlm.pretraining.config import TrainConfig
    from smiexlm.tokenizer import load_tokenizer
    from smiexlm.training.optim import build_optimizer, clip_gradients

    vocab = load_tokenizer(dataset / "vocab.json")
    table = {"preset": preset, "objective": objective, "k": k} | (MICRO if dry_run else {})
    config = TrainConfig(model=table)
    torch.manual_seed(0)
    model = ExLMModel(config.model_config(vocab_size=vocab.vocab_size)).to(device).train()
    optimizer = build_optimizer(model, config)
    gen = torch.Generator().manual_seed(0)
    n_steps = 1 if dry_run else 12
    prepared = []
    for ids, mask in token_batches(dataset, max_tokens, n_steps + (1 if dry_run else 3)):
        masked, labels = mask_tokens(ids, mask, 0.15, generator=gen)
        prepared.append((masked.to(device), mask.to(device), labels.to(device)))
    bf16 = device.type == "cuda"

    def step(batch):
        with torch.autocast(device.type, torch.bfloat16, enabled=bf16):
            loss = model(*batch).loss
        loss.backward()
        clip_gradients(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    with FlopCounterMode(display=False) as counter:
        step(prepared[0])
    flops = counter.get_total_flops()
    times, tokens = [], 0
    for i, batch in enumerate(prepared[1:]):
        sync(device)
        t0 = time.perf_counter()
        step(batch)
        sync(device)
        if i >= (0 if dry_run else 2):  # warm-up steps are not timed
            times.append(time.perf_counter() - t0)
            tokens += int(batch[1].sum())
        if budget.left() < 0.1 * budget.seconds and len(times) >= 2:
            break
    mean = sum(times) / len(times)
    return {
        "preset": preset,
        "objective": objective,
        "k": k if objective == "exlm" else None,
        "params": model.num_parameters(),
        "max_tokens": max_tokens,
        "precision": "bf16" if bf16 else "fp32",
        "steps_timed": len(times),
        "step_ms": round(1e3 * mean, 2),
        "steps_per_s": round(1 / mean, 3),
        "tokens_per_s": round(tokens / sum(times)),
        "flops_per_step": flops,
        "peak_mib": round(torch.cuda.max_memory_allocated() / 2**20) if bf16 else None,
    }


def peak_flops(name: str, measured_tflops: float) -> tuple[float, str]:
    for key, value in PEAK_BF16.items():
        if key in name:
            return value, f"{key} bf16 dense spec"
    return measured_tflops * 1e12, "measured matmul"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--budget", type=float, default=160.0)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    budget = Budget(args.budget)
    args.out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    doc: dict = {"device": {"name": name, "torch": torch.__version__}, "dag": [], "throughput": []}
    try:
        import triton

        doc["device"]["triton"] = triton.__version__
    except ImportError:
        doc["device"]["triton"] = None

    def save() -> None:
        (args.out / "speed.json").write_text(json.dumps(doc, indent=1))

    def record_dag(row: dict) -> None:
        doc["dag"].append(row)
        print(json.dumps(row), flush=True)
        save()

    doc["matmul_tflops"] = round(matmul_tflops(device, args.dry_run), 4)
    peak, source = peak_flops(name, doc["matmul_tflops"])
    doc["peak_flops"], doc["peak_source"] = peak, source
    save()
    measure_dag(device, args.dry_run, budget, record_dag)
    configs = [("tiny", "mlm", 2), ("tiny", "exlm", 2)] if args.dry_run else THROUGHPUT
    max_tokens = 256 if args.dry_run else 32768
    for preset, objective, k in configs:
        row = {"preset": preset, "objective": objective, "k": k}
        if budget.left() < 0.1 * budget.seconds:
            doc["throughput"].append(row | {"skipped": "budget"})
            continue
        try:
            row = measure_step(
                preset, objective, k, args.dataset, max_tokens, device, args.dry_run, budget
            )
            row["mfu"] = round(row["flops_per_step"] * row["steps_per_s"] / peak, 4)
            row["mfu_vs_matmul"] = round(
                row["flops_per_step"] * row["steps_per_s"] / (doc["matmul_tflops"] * 1e12), 4
            )
        except Exception as error:  # noqa: BLE001 - a failing config is a result
            row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
        doc["throughput"].append(row)
        print(json.dumps(row), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        save()
    small = "tiny" if args.dry_run else "small"
    doc["pretrain_rates"] = {
        f"mol_small_{r['objective']}_gpu": r["steps_per_s"]
        for r in doc["throughput"]
        if r.get("preset") == small and r.get("k") in (2, None) and "steps_per_s" in r
    }
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
