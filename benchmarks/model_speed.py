"""Forward+backward speed of the three objectives, side by side in one run.

    python benchmarks/model_speed.py [--presets tiny small] [--steps 10] [--threads 1]
    python benchmarks/model_speed.py --text      # tiny text model: mlm against exlm k = 4

For each preset: mlm, exlm (k = 2), exlm (k = 4) and maelm train on the same masked batch
(SMILES-like lengths, mask prob 0.15); the table gives the median step time, tokens/s (real,
unexpanded tokens), the ratio to mlm, and the matrix-product FLOPs of one forward + backward
counted by ``torch.utils.flop_counter`` (the arithmetic a variant cannot avoid, whatever the
kernels) with their ratio to mlm. Targets: exlm k = 2 <= 1.3x mlm, k = 4 <= 1.7x.
With a CUDA device, ``--gpu`` also times mol_base in bf16 and reports MFU.

``--text`` times the text shape of the recorded GLUE runs instead (``text_tiny_*``): 32 blocks
of 128 tokens from an 8,000-token vocabulary with 7 [EOS] per block, as in the WikiText-2 +
Tiny Shakespeare block dataset; every [EOS] is expanded by ExLM, so a block of 19 masks runs
the DAG loss on about 108 states and 27 targets.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from smiexlm import ExLMConfig, ExLMModel
from smiexlm.model.masking import mask_tokens

VARIANTS = [("mlm", {}), ("exlm k=2", {"k": 2}), ("exlm k=4", {"k": 4}), ("maelm", {})]
BATCH = {"tiny": 32, "small": 16, "mol_base": 64}
H200_BF16_PEAK = 989e12  # dense bf16 FLOP/s of an H100/H200 SXM


def make_batch(batch: int, max_len: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(max_len // 2, max_len + 1, (batch,), generator=g)
    ids = torch.randint(5, vocab, (batch, max_len), generator=g)
    att = torch.arange(max_len) < lengths[:, None]
    ids[:, 0] = 1
    ids[torch.arange(batch), lengths - 1] = 2
    ids = ids.masked_fill(~att, 0)
    masked, labels = mask_tokens(ids, att, 0.15, generator=g)
    return masked, att, labels


def make_text_batch(blocks: int = 32, length: int = 128, vocab: int = 8000, n_eos: int = 7):
    """Full text blocks: BOS, then tokens with ``n_eos`` sentence ends at random places."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (blocks, length), generator=g)
    ids[:, 0] = 1
    for row in ids:
        row[1 + torch.randperm(length - 1, generator=g)[:n_eos]] = 2
    att = torch.ones_like(ids, dtype=torch.bool)
    masked, labels = mask_tokens(ids, att, 0.15, generator=g)
    return masked, att, labels


def build(preset: str, name: str, extra: dict, device: str, vocab: int | None = None):
    objective = name.split()[0]
    if vocab is not None:
        extra = {**extra, "vocab_size": vocab}
    cfg = ExLMConfig.preset(preset, objective=objective, **extra)
    return ExLMModel(cfg).to(device).train()


def time_steps(model, batch, steps: int, device: str, autocast: bool = False) -> list[float]:
    ids, att, labels = (t.to(device) for t in batch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for i in range(steps + 2):  # two warm-up steps
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            loss = model(ids, att, labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return times


def count_flops(model, batch) -> int:
    """Matrix-product FLOPs (mm, bmm, addmm, attention) of one forward + backward."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        model(*batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def run_cpu(presets: list[str], steps: int, max_len: int, bf16: bool = False) -> dict:
    results = {}
    for preset in presets:
        models = {name: build(preset, name, extra, "cpu") for name, extra in VARIANTS}
        batch = make_batch(BATCH[preset], max_len, models["mlm"].config.vocab_size)
        n_tokens = int(batch[1].sum())
        samples = {name: [] for name in models}
        for _ in range(steps):  # interleave so that load changes hit every variant alike
            for name, model in models.items():
                samples[name] += time_steps(model, batch, 1, "cpu", autocast=bf16)
        for name, model in models.items():
            step = statistics.median(samples[name])
            results[(preset, name)] = (step, n_tokens / step, count_flops(model, batch))
    return results


def run_text(steps: int, bf16: bool = False, blocks: int = 32) -> dict:
    """The tiny text model on the same blocks, interleaved: mlm, and exlm k = 4 with the DAG
    loss by the log-space reference (the previous CPU path) and by the matrix products."""
    variants = [("mlm", "mlm", {}), ("exlm k=4, reference DAG", "exlm", {"k": 4})]
    variants.append(("exlm k=4, matmul DAG", "exlm", {"k": 4}))
    models = {}
    for label, objective, extra in variants:
        torch.manual_seed(0)
        models[label] = build("tiny", objective, extra, "cpu", vocab=8000)
    batch = make_text_batch(blocks)
    samples = {label: [] for label in models}
    for _ in range(steps):
        for label, model in models.items():
            os.environ["SMIEXLM_DAG_IMPL"] = "reference" if "reference" in label else "matmul"
            samples[label] += time_steps(model, batch, 1, "cpu", autocast=bf16)
    n_tokens = int(batch[1].sum())
    return {
        ("text tiny", label): (
            statistics.median(t),
            n_tokens / statistics.median(t),
            count_flops(models[label], batch),
        )
        for label, t in samples.items()
    }


def run_gpu(steps: int, max_len: int) -> list[str]:
    if not torch.cuda.is_available():
        return ["GPU (bf16, mol_base): no GPU available in this run"]
    lines = [f"GPU: {torch.cuda.get_device_name()} (bf16 autocast, mol_base)"]
    base = None
    for name, extra in VARIANTS:
        model = build("mol_base", name, extra, "cuda")
        batch = make_batch(BATCH["mol_base"] * 4, max_len, model.config.vocab_size)
        step = statistics.median(time_steps(model, batch, steps, "cuda", autocast=True))
        tokens = int(batch[1].sum()) / step
        mfu = 6 * model.num_parameters() * tokens / H200_BF16_PEAK
        base = base or step
        lines.append(
            f"| {name} | {step * 1e3:.1f} | {tokens:,.0f} | {step / base:.2f}x | {mfu:.1%} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--max-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gpu", action="store_true", help="also time mol_base on CUDA")
    parser.add_argument("--text", action="store_true", help="the tiny text shape instead")
    parser.add_argument("--bf16", action="store_true", help="CPU steps under bf16 autocast")
    parser.add_argument("--blocks", type=int, default=32, help="text blocks per batch (--text)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(
        f"hardware: {platform.machine()} CPU, {args.threads} thread(s), torch {torch.__version__}, "
        f"{'bf16 autocast' if args.bf16 else 'fp32'}"
    )
    print(f"batch: {BATCH} sequences, lengths {args.max_len // 2}-{args.max_len}, mask 0.15")
    if args.text:
        results = run_text(args.steps, args.bf16, args.blocks)
    else:
        results = run_cpu(args.presets, args.steps, args.max_len, args.bf16)
    print(
        "\n| preset | objective | step (ms) | tokens/s | step / mlm | GFLOP / step | FLOP / mlm |"
    )
    print("|---|---|---|---|---|---|---|")
    for (preset, name), (step, tps, flops) in results.items():
        mlm_step, _, mlm_flops = results[(preset, "mlm")]
        print(
            f"| {preset} | {name} | {step * 1e3:.1f} | {tps:,.0f} | {step / mlm_step:.2f}x "
            f"| {flops / 1e9:.2f} | {flops / mlm_flops:.2f}x |"
        )
    if "tiny" in args.presets and not args.text:
        mlm, exlm = results[("tiny", "mlm")][0], results[("tiny", "exlm k=2")][0]
        print(f"\ntiny step time: mlm {mlm * 1e3:.1f} ms, exlm(k=2) {exlm * 1e3:.1f} ms")
    print()
    gpu_lines = run_gpu(args.steps, 128) if args.gpu else ["GPU: not requested (--gpu)"]
    for line in gpu_lines:
        print(line)


if __name__ == "__main__":
    main()
