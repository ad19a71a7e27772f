"""Pre-training throughput: mlm vs exlm (k = 2) vs maelm side by side, and DDP scaling.

Run: ``python benchmarks/pretrain_throughput.py [--preset tiny] [--steps 20] [--ddp]``.

Part 1 times full optimiser steps (forward, backward, clip, Adam) of the three objectives on
the same token-budget batches of real MOSES SMILES, in one process, and prints tokens/s, step
time and the exlm/mlm step-time ratio. On a GPU it uses bf16 autocast (``--preset mol_base``).

Part 2 (``--ddp``, CPU) runs ``smiexlm pretrain`` on the same dataset twice: one process with
one thread and ``update_freq = 2``, then ``torchrun --nproc_per_node 2`` with one thread each
and ``update_freq = 1`` (the same global batch), and prints the throughput ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
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
    from tests.test_training_support import build_dataset as build

    return build(data_dir() / "pretrain" / "moses_test.smi.gz", out, n=n)


def time_objectives(dataset: Path, preset: str, steps: int, max_tokens: int) -> list[dict]:
    from smiexlm.data.collate import collate
    from smiexlm.data.sampler import TokenBudgetSampler
    from smiexlm.data.shards import TokenDataset
    from smiexlm.model.masking import mask_tokens
    from smiexlm.model.model import ExLMModel
    from smiexlm.tokenizer import SmilesTokenizer
    from smiexlm.training.config import TrainConfig
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


def ddp_scaling(dataset: Path, steps: int, max_tokens: int) -> dict:
    overrides = [
        "model.n_layers=4",
        f"max_tokens={max_tokens}",
        "num_threads=1",
        "progress=false",
        f"log_every={steps}",
        f"valid_every={10 * steps}",
        f"save_every={10 * steps}",
        "model.dropout=0.0",
        "model.attention_dropout=0.0",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, launcher, uf in (
            ("1 process x 1 thread", [sys.executable, "-m", "smiexlm.cli.main"], 2),
            (
                "2 processes x 1 thread",
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--nproc_per_node",
                    "2",
                    "--master_addr",
                    "127.0.0.1",
                    "--master_port",
                    str(_free_port()),
                    "-m",
                    "smiexlm.cli.main",
                ],
                1,
            ),
        ):
            out = Path(tmp) / name.replace(" ", "_")
            cmd = [
                *launcher,
                "pretrain",
                "--config",
                "mol_tiny_exlm",
                "--data",
                str(dataset),
                "--out",
                str(out),
                "--max-steps",
                str(steps),
                *overrides,
                f"update_freq={uf}",
            ]
            subprocess.run(cmd, env=env, check=True, capture_output=True)
            last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
            # the first logged window includes start-up; tokens/s of the whole window
            results[name] = last["tokens_seen"] / last["elapsed_s"]
    return results


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--molecules", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ddp", action="store_true", help="also measure 2-process DDP scaling")
    parser.add_argument("--ddp-steps", type=int, default=30)
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
        if args.ddp:
            scaling = ddp_scaling(dataset, args.ddp_steps, args.max_tokens)
            base = scaling["1 process x 1 thread"]
            print(f"\nDDP scaling (gloo, CPU), {args.ddp_steps} steps, same global batch:")
            for name, tps in scaling.items():
                print(f"{name:24s} {tps:>10.0f} tokens/s {tps / base:>6.2f}x")


if __name__ == "__main__":
    main()
