"""Pre-training throughput: mlm vs exlm (k = 2) vs maelm side by side, and DDP scaling.

Run: ``python benchmarks/pretrain_throughput.py [--preset tiny] [--steps 20] [--launch]``.

Part 1 times full optimiser steps (forward, backward, clip, Adam) of the three objectives on
the same token-budget batches of real MOSES SMILES, in one process, and prints tokens/s, step
time and the exlm/mlm step-time ratio. On a GPU it uses bf16 autocast (``--preset mol_base``).

Part 2 (``--launch``, CPU) runs ``smiexlm pretrain --config mol_tiny_exlm`` on the same
dataset in four launch modes, one after the other: one process or two (``--nproc``, the same
global batch of two micro-batches), each in fp32 and with bf16 autocast, and prints tokens/s
and the ratio to one fp32 process (the previous CPU default).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def hardware() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"{os.cpu_count()}-core {platform.machine()} CPU"


def build_dataset(out: Path, n: int) -> Path:
    from smiexlm.paths import data_dir
    from tests.unit.pretraining.test_training_support import build_dataset as build

    return build(data_dir() / "pretrain" / "moses_test.smi.gz", out, n=n)


def time_objectives(dataset: Path, preset: str, steps: int, max_tokens: int) -> list[dict]:
    from smiexlm.data.collate import collate
    from smiexlm.data.sampler import TokenBudgetSampler
    from smiexlm.data.shards import TokenDataset
    from smiexlm.model.masking import mask_tokens
    from smiexlm.model.model import ExLMModel
    from smiexlm.pretraining.config import TrainConfig
    from smiexlm.tokenizer import SmilesTokenizer
    from smiexlm.training.optim import build_optimizer, clip_gradients

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train = TokenDataset(dataset, "train")
    vocab = SmilesTokenizer.load(dataset / "vocab.json")
    batches = list(TokenBudgetSampler(train.lengths, max_tokens, shuffle=True, seed=0))
    rows = []
    for objective in ("mlm", "exlm", "maelm"):
        config = TrainConfig(model={"preset": preset, "objective": objective, "k": 2})
        torch.manual_seed(0)
        model = ExLMModel(config.model_config(vocab_size=vocab.vocab_size)).to(device).train()
        opt = build_optimizer(model, config)
        gen = torch.Generator().manual_seed(0)
        prepared = []
        for b in batches[: steps + 3]:
            ids, mask = collate([train[i] for i in b])
            masked, labels = mask_tokens(ids, mask, 0.15, generator=gen)
            prepared.append((masked.to(device), mask.to(device), labels.to(device)))
        times, tokens = [], 0
        for i, (ids, mask, labels) in enumerate(prepared):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
                loss = model(ids, mask, labels).loss
            loss.backward()
            clip_gradients(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if i >= 3:  # warm-up steps are not timed
                times.append(time.perf_counter() - t0)
                tokens += int(mask.sum())
        total = sum(times)
        rows.append(
            {
                "objective": objective,
                "params": model.num_parameters(),
                "step_ms": 1000 * total / len(times),
                "tokens_per_s": tokens / total,
            }
        )
    return rows


#: (label, --nproc, precision): the previous CPU default first, the new default last
LAUNCHES = [
    ("1 process, fp32", 1, "fp32"),
    ("1 process, bf16 autocast", 1, "bf16"),
    ("2 processes, fp32", 2, "fp32"),
    ("2 processes, bf16 autocast (default)", 2, "bf16"),
]


def launch_modes(
    dataset: Path,
    steps: int,
    max_tokens: int,
    keep: Path | None = None,
    only: list[str] | None = None,
) -> dict:
    """``smiexlm pretrain --config mol_tiny_exlm`` in each CPU launch mode (``only``: those
    named ``{nproc}_{precision}``), same global batch (2 micro-batches of ``max_tokens`` per
    update), one thread per process. tokens/s is the mean of the logged windows after the
    first (start-up and warm-up excluded). ``keep``: a folder to keep the runs in, one
    subfolder per mode (``1_fp32``, ``1_bf16``, ``2_fp32``, ``2_bf16``)."""
    overrides = [
        "num_threads=1",
        f"max_tokens={max_tokens}",
        "update_freq=2",
        "progress=false",
        "log_every=5",
        f"valid_every={10 * steps}",
        f"save_every={10 * steps}",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, nproc, precision in LAUNCHES:
            if only is not None and f"{nproc}_{precision}" not in only:
                continue
            out = (keep or Path(tmp)) / f"{nproc}_{precision}"
            cmd = [sys.executable, "-m", "smiexlm.cli.main", "pretrain", "--config"]
            cmd += ["mol_tiny_exlm", "--data", str(dataset), "--out", str(out)]
            cmd += ["--max-steps", str(steps), "--nproc", str(nproc), *overrides]
            subprocess.run([*cmd, f"precision={precision}"], env=env, check=True,
                           capture_output=True)  # fmt: skip
            windows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
            rates = [w["tokens_per_s"] for w in windows[1:]]
            results[label] = sum(rates) / len(rates)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--molecules", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--launch", action="store_true", help="also run smiexlm pretrain in each CPU launch mode"
    )
    parser.add_argument("--launch-steps", type=int, default=40)
    parser.add_argument("--keep", type=Path, default=None, help="keep the --launch runs here")
    parser.add_argument(
        "--launch-modes",
        nargs="+",
        choices=[f"{n}_{p}" for _, n, p in LAUNCHES],
        default=None,
        help="only these launch modes (default: all four; the first is the ratios' base)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        dataset = build_dataset(Path(tmp) / "ds", args.molecules)
        print(f"hardware: {hardware()}; torch {torch.__version__}; threads {args.threads}")
        print(f"preset {args.preset}, max_tokens {args.max_tokens}, {args.steps} timed steps")
        rows = time_objectives(dataset, args.preset, args.steps, args.max_tokens)
        mlm_ms = rows[0]["step_ms"]
        print(f"{'objective':10s} {'params':>10s} {'step ms':>9s} {'tokens/s':>10s} {'vs mlm':>7s}")
        for r in rows:
            print(
                f"{r['objective']:10s} {r['params']:>10,d} {r['step_ms']:>9.1f} "
                f"{r['tokens_per_s']:>10.0f} {r['step_ms'] / mlm_ms:>7.2f}"
            )
        if args.launch:
            rates = launch_modes(
                dataset, args.launch_steps, args.max_tokens, args.keep, args.launch_modes
            )
            base = next(iter(rates.values()))
            print(f"\nsmiexlm pretrain, mol_tiny_exlm, {args.launch_steps} updates of 2 x "
                  f"{args.max_tokens} tokens, 1 thread per process:")  # fmt: skip
            for name, tps in rates.items():
                print(f"{name:40s} {tps:>10.0f} tokens/s {tps / base:>6.2f}x")


if __name__ == "__main__":
    main()
