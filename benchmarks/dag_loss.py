"""Benchmark the DAG alignment loss: forward+backward time and peak memory.

    python benchmarks/dag_loss.py                 # CPU: log-space reference vs matrix products
                                                  # (+ GPU reference and kernels if CUDA)
    python benchmarks/dag_loss.py --text-gather-batch 64   # full text-shape fused gather on CPU
    python benchmarks/dag_loss.py --smoke                  # every row at batch 2: runs, no figure

Shapes: SMILES (B=256, L=40, M=10) and text (paper Appendix I: B=64, L=308, M=77, V=30k for
the fused log-softmax-gather). CPU peak memory is the growth of the process's peak RSS during
one forward+backward, measured in a fresh child process per row; GPU peak memory is
``torch.cuda.max_memory_allocated`` above the inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

CPU_IMPLS = ("reference", "matmul")
SHAPES = {"smiles": (256, 40, 10, 369), "text": (64, 308, 77, 30000)}
SHAPES["text_peaked"] = SHAPES["text"]  # logits × 8: log-values spread over thousands of nats


def make_inputs(kind: str, batch: int, device: str, gather: bool):
    import torch

    B, L, M, V = SHAPES[kind]
    B = batch or B
    scale = 8.0 if kind.endswith("peaked") else 1.0
    g = torch.Generator().manual_seed(0)
    links = torch.log_softmax(scale * torch.randn(B, L, L, generator=g), dim=2).to(device)
    s = torch.randint(L - L // 4, L + 1, (B,), generator=g).to(device)
    m = torch.randint(M - M // 4, M + 1, (B,), generator=g).to(device)
    links.requires_grad_(True)
    if gather:
        logits = torch.randn(B, L, V, generator=g).to(device).requires_grad_(True)
        targets = torch.randint(5, V, (B, M), generator=g).to(device)
        return (logits, targets, links, s, m)
    em = torch.log_softmax(scale * torch.randn(B, M, L, generator=g), dim=2)
    em = em.to(device).requires_grad_(True)
    return (em, links, s, m)


def fwd_bwd(args, gather: bool):
    from smiexlm.dag import dag_log_likelihood, dag_logits_log_likelihood

    fn = dag_logits_log_likelihood if gather else dag_log_likelihood
    for t in args:
        if getattr(t, "grad", None) is not None:
            t.grad = None
    ll = fn(*args)
    (-ll.sum()).backward()
    return ll


def measure_cpu(kind: str, threads: int, repeats: int, batch: int, gather: bool, impl: str) -> dict:
    """Child process body: time and peak-RSS growth of one CPU implementation."""
    import torch

    torch.set_num_threads(threads)
    os.environ["SMIEXLM_DAG_IMPL"] = impl
    args = make_inputs(kind, batch, "cpu", gather)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fwd_bwd(args, gather)  # warm-up, also the peak-memory sample
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fwd_bwd(args, gather)
        times.append(time.perf_counter() - t0)
    return {"ms": 1e3 * statistics.median(times), "peak_mib": (peak - base) / 1024}


def run_child(kind, threads, repeats, batch, gather, impl) -> dict:
    spec = json.dumps([kind, threads, repeats, batch, gather, impl])
    cmd = [sys.executable, __file__, "--child", spec]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure_gpu(kind: str, impl: str, repeats: int, gather: bool) -> dict:
    import torch

    os.environ["SMIEXLM_DAG_IMPL"] = impl
    args = make_inputs(kind, 0, "cuda", gather)
    fwd_bwd(args, gather)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fwd_bwd(args, gather)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fwd_bwd(args, gather)
    end.record()
    torch.cuda.synchronize()
    return {"ms": start.elapsed_time(end) / repeats, "peak_mib": peak / 2**20}


def tiny_step_ms(repeats: int, batch: int = 256) -> float:
    """One tiny-preset ExLM (k = 2) training step on a SMILES-shaped batch, 1 thread."""
    import torch

    from smiexlm import ExLMConfig, ExLMModel
    from smiexlm.model.masking import mask_tokens

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = ExLMModel(ExLMConfig.tiny(vocab_size=333, objective="exlm", k=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = torch.randint(28, 44, (batch,))  # ~36 tokens: about 40 expanded states, M ~ 10
    mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]
    ids = torch.where(mask, torch.randint(5, 333, mask.shape), 0)
    ids[:, 0] = 1
    ids[torch.arange(batch), lengths - 1] = 2
    gen = torch.Generator().manual_seed(0)
    masked, labels = mask_tokens(ids, mask, mask_prob=0.15, vocab_size=333, generator=gen)
    times = []
    for i in range(repeats + 1):
        start = time.perf_counter()
        loss = model(masked, mask, labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if i:  # the first step warms up
            times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def state_mib(kind: str) -> float:
    """α + β + links in fp32, the issue's memory yardstick."""
    B, L, M, _ = SHAPES[kind]
    return (2 * B * M * L + B * L * L) * 4 / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--text-gather-batch", type=int, default=8, help="B for the CPU text gather (64 = full)"
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per row (2 only on an idle machine)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every row at batch 2, one repeat (a check, not a figure)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        print(json.dumps(measure_cpu(*json.loads(a.child))))
        return
    import torch

    cpu = f"{os.cpu_count()}-core {platform.machine()} CPU ({platform.processor() or 'unknown'})"
    print(f"hardware: {cpu}; torch {torch.__version__}")
    print(f"{'shape':<28} {'impl':<22} {'fwd+bwd ms':>11} {'peak MiB':>9}  ratio")
    t, b = a.threads, 2 if a.smoke else 0  # batch 0: the shape's own
    repeats = 1 if a.smoke else a.repeats
    gather_batch = b or a.text_gather_batch
    rows = [
        (f"smiles B{b or 256} L40 M10", "smiles", t, b, False),
        (f"text B{b or 64} L308 M77", "text", t, b, False),
        (f"text peaked B{b or 64} L308 M77", "text_peaked", t, b, False),
        (f"text+gather B{gather_batch} V30k", "text", t, gather_batch, True),
    ]
    if a.smoke:  # the two text rows without the gather run the same code as the first
        rows = [rows[0], rows[3]]
    first = None
    for label, kind, threads, batch, gather in rows:
        res = {impl: run_child(kind, threads, repeats, batch, gather, impl) for impl in CPU_IMPLS}
        for impl, r in res.items():
            if kind == "smiles" and impl == "reference":
                first = first or r["ms"]
            speed = res["reference"]["ms"] / r["ms"]
            print(
                f"{label:<28} {f'{impl} cpu {threads}thr':<22} {r['ms']:>11.1f} "
                f"{r['peak_mib']:>9.1f}  {speed:.1f}x vs reference"
            )
    step_batch = 8 if a.smoke else 256
    step = tiny_step_ms(repeats, step_batch)
    print(
        f"tiny-preset ExLM training step, B={step_batch} SMILES, 1 thread: {step:.1f} ms; "
        f"the DAG loss (reference, 1 thread, same shape) is {100 * first / step:.1f}% of it"
    )
    print(
        f"alpha+beta+links fp32: smiles {state_mib('smiles'):.1f} MiB, text {state_mib('text'):.1f} MiB"
    )
    if not torch.cuda.is_available():
        print("GPU: no GPU (CUDA unavailable); reference-GPU and kernel rows skipped")
        return
    try:
        import triton  # noqa: F401

        impls = ["reference", "triton"]
    except ImportError:
        impls = ["reference"]
    print(f"GPU: {torch.cuda.get_device_name()}")
    for kind in ("smiles", "text"):
        for gather in (False, True):
            res = {impl: measure_gpu(kind, impl, a.repeats * 5, gather) for impl in impls}
            for impl, r in res.items():
                speed = res["reference"]["ms"] / r["ms"]
                mem = r["peak_mib"] / state_mib(kind)
                label = f"{kind}{'+gather' if gather else ''}"
                print(
                    f"{label:<28} {impl + ' gpu':<22} {r['ms']:>11.2f} {r['peak_mib']:>9.1f}  "
                    f"{speed:.1f}x vs reference, {mem:.2f}x (alpha+beta+links)"
                )


if __name__ == "__main__":
    main()
