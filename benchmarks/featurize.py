"""Featurizer throughput: ``Featurizer.featurize`` against the raw model forward.

    SMIEXLM_DATA=../shared/data python benchmarks/featurize.py [--checkpoint DIR] [--n 1024]

For batch sizes 32 / 256 / 1024 it times, on the same BBBP molecules in one run:

- ``raw forward``: ``model.encode`` on batches tokenized, sorted and padded beforehand;
- ``featurize (as written)``: the public API with ``canonicalize=False`` (tokenize, sort,
  batch, forward, unsort);
- ``featurize (canonical)``: the public API with its default RDKit canonicalization;
- RDKit Morgan fingerprints (radius 2, 2048 bits) to numpy, as a reference point.

Overhead = API time / raw time − 1 (target ≤ 15% for the API itself). Without ``--checkpoint``
the shipped default model is used when installed, else a randomly initialised model of the
chosen preset (speed does not depend on the weights).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from smiexlm import ExLMConfig, ExLMModel, Featurizer
from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
from smiexlm.modelio.pretrained import Pretrained
from smiexlm.paths import data_dir
from smiexlm.tokenizer import SmilesTokenizer

BATCH_SIZES = (32, 256, 1024)


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def load_featurizer(args, smiles: list[str], device: str) -> tuple[Featurizer, str]:
    if args.checkpoint is not None:
        return Featurizer.from_pretrained(args.checkpoint, device=device), str(args.checkpoint)
    if (DEFAULT_MODEL_DIR / "model.safetensors").is_file():
        return Featurizer.from_pretrained(None, device=device), "default model"
    tokenizer = SmilesTokenizer.build(smiles)
    torch.manual_seed(0)
    config = ExLMConfig.preset(args.preset, objective="exlm", vocab_size=tokenizer.vocab_size)
    model = ExLMModel(config)
    return Featurizer(
        Pretrained(model, tokenizer), device=device
    ), f"random-init {args.preset} ExLM"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--preset", default="tiny", help="random-init size without a checkpoint")
    parser.add_argument("--n", type=int, default=1024, help="molecules (from BBBP)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    smiles = pd.read_csv(data_dir() / "moleculenet" / "bbbp.csv").smiles.tolist()[: args.n]
    feat, model_name = load_featurizer(args, smiles, args.device)
    ids, reasons, _ = feat.prepare(smiles)  # canonical SMILES -> ids, as the API does
    keep = [i for i, r in enumerate(reasons) if r is None]
    smiles = [smiles[i] for i in keep]
    canonical = [feat.tokenizer.decode(ids[i]) for i in keep]
    rows = sorted((ids[i] for i in keep), key=len)
    n = len(smiles)
    budget = 10**9  # batch by count only, to compare like with like

    sync = torch.cuda.synchronize if feat.device.type == "cuda" else (lambda: None)
    print(f"hardware: {platform.machine()} CPU, {torch.get_num_threads()} torch threads; "
          f"device {feat.device}; model: {model_name} (d={feat.dim}, "
          f"layers={feat.model.config.n_layers}, objective={feat.model.config.objective}); "
          f"{n} BBBP molecules, best of {args.repeats}")  # fmt: skip
    header = (
        f"{'batch':>5} | {'raw forward':>12} | {'featurize (as written)':>22} | "
        f"{'overhead':>8} | {'featurize (canonical)':>21} | {'overhead':>8}"
    )
    print(header + "\n" + "-" * len(header))
    results = []
    for bs in BATCH_SIZES:
        padded = []
        for start in range(0, n, bs):
            batch = rows[start : start + bs]
            width = max(map(len, batch))
            x = torch.zeros(len(batch), width, dtype=torch.long)
            for r, row in enumerate(batch):
                x[r, : len(row)] = torch.tensor(row)
            x = x.to(feat.device)
            padded.append((x, x != 0))

        def raw(padded=padded):
            with torch.inference_mode():
                for x, mask in padded:
                    feat.model.encode(x, mask, pooling=feat.pooling).pooled.float().cpu().numpy()
            sync()

        def api_written(bs=bs):
            feat.featurize(canonical, batch_size=bs, batch_tokens=budget, canonicalize=False)
            sync()

        def api_canonical(bs=bs):
            feat.featurize(smiles, batch_size=bs, batch_tokens=budget)
            sync()

        raw()  # warm-up
        t_raw = best_of(raw, args.repeats)
        t_written = best_of(api_written, args.repeats)
        t_canon = best_of(api_canonical, args.repeats)
        results.append((bs, n / t_raw, n / t_written, n / t_canon))
        print(f"{bs:>5} | {n / t_raw:>8.0f} m/s | {n / t_written:>18.0f} m/s | "
              f"{t_written / t_raw - 1:>+7.1%} | {n / t_canon:>17.0f} m/s | "
              f"{t_canon / t_raw - 1:>+7.1%}")  # fmt: skip

    from rdkit import Chem, rdBase
    from rdkit.Chem import rdFingerprintGenerator

    gen = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)

    def morgan():
        with rdBase.BlockLogs():
            np.stack([gen.GetFingerprintAsNumPy(Chem.MolFromSmiles(s)) for s in smiles])

    t_fp = best_of(morgan, args.repeats)
    print(f"RDKit Morgan fingerprints (r=2, 2048 bits, parse included): {n / t_fp:.0f} m/s")


if __name__ == "__main__":
    main()
