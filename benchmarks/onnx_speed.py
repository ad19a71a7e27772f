"""Featurizer throughput, torch fp32 against onnxruntime, side by side in one run.

    SMIEXLM_DATA=../shared/data python benchmarks/onnx_speed.py [--n 2000] [--repeats 5] \
        [--threads 1 2] [--checkpoint FOLDER]

On the first ``--n`` BBBP molecules, with the shipped default model (or ``--checkpoint``, whose
``encoder.onnx`` is exported into a temporary copy when it has none), for each thread count
and for cls and mean pooling:

- encoder: token rows prepared beforehand (canonical SMILES, tokenised), then
  ``Featurizer.encode_ids`` over the featurizer's batches (one length each). "torch served" is
  the featurizer's torch path (fp32 under ``batch_invariant``: attention per length without
  padding, the last block over every position); onnxruntime runs ``encoder.onnx`` (float32; for cls the last
  block over the first two positions). For reference, torch in plain fp32 (not
  batch-invariant) and, for cls, torch served with ``encode(pooled_only=True)`` (the last
  block over the first position: like for like with the graph);
- featurize: ``Featurizer.featurize`` end to end (RDKit canonicalisation, tokenisation,
  batching, encoder), torch served against onnxruntime.

The variants alternate within each repeat; the tables give the best of ``--repeats`` in
molecules per second (wall clock), and onnxruntime's speed over each torch variant's; with one
thread also the ratio of process CPU times (best of the repeats), which other jobs on a shared
machine disturb much less than wall time.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import pandas as pd
import torch

from smiexlm import Featurizer
from smiexlm.data.sampler import length_batches
from smiexlm.embedding.onnx_export import export_onnx
from smiexlm.model.encoder import batch_invariant
from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
from smiexlm.modelio.records import read_onnx_manifest
from smiexlm.paths import data_dir


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def batches(feat: Featurizer, rows: list[list[int]]) -> list[range]:
    return length_batches(feat.inputs.encoder_lengths(rows), 16384, None)


def encode_all(feat: Featurizer, rows: list[list[int]], pooling: str) -> np.ndarray:
    """Pooled rows over the featurizer's batches (one length each), as ``featurize`` serves them."""
    out = np.empty((len(rows), feat.width(pooling)), dtype=np.float32)
    for batch in batches(feat, rows):
        out[batch] = feat.encode_ids([rows[j] for j in batch], pooling)
    return out


def encode_torch(
    feat: Featurizer, rows: list[list[int]], pooling: str, invariant: bool, pooled_only: bool
) -> np.ndarray:
    """The same batches through ``model.encode`` directly (the reference variants)."""
    out = np.empty((len(rows), feat.width(pooling)), dtype=np.float32)
    for batch in batches(feat, rows):
        ids = np.zeros((len(batch), max(len(rows[j]) for j in batch)), dtype=np.int64)
        for r, j in enumerate(batch):
            ids[r, : len(rows[j])] = rows[j]
        x = torch.from_numpy(ids)
        with torch.inference_mode(), batch_invariant() if invariant else torch.no_grad():
            out[batch] = feat.model.encode(x, x != 0, pooling, feat.blocks, pooled_only).pooled
    return out


def best_of(
    repeats: int, runs: dict[str, Callable[[], object]]
) -> tuple[dict[str, float], dict[str, float]]:
    """Best wall-clock seconds and best process CPU seconds of each run."""
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            run()
            wall[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return {k: min(v) for k, v in wall.items()}, {k: min(v) for k, v in cpu.items()}


def measure(folder: Path, smiles: list[str], threads: int, repeats: int) -> tuple[list, list]:
    """Rows of the encoder table and of the featurize table for one thread count."""
    torch.set_num_threads(threads)  # onnxruntime takes the same count (open_session)
    ref = Featurizer.from_pretrained(folder, device="cpu")
    fast = Featurizer.from_pretrained(folder, backend="onnx")
    ids, _, _ = ref.prepare(smiles)
    rows = sorted((r for r in ids if r is not None), key=len)
    encoder, end_to_end = [], []
    for pooling in ("cls", "mean"):
        diff = np.abs(encode_all(ref, rows, pooling) - encode_all(fast, rows, pooling)).max()
        runs = {
            "served": lambda p=pooling: encode_all(ref, rows, p),
            "plain": lambda p=pooling: encode_torch(ref, rows, p, False, False),
            "onnx": lambda p=pooling: encode_all(fast, rows, p),
        }
        if pooling == "cls":
            runs["first"] = lambda: encode_torch(ref, rows, "cls", True, True)
        t, c = best_of(repeats, runs)
        # One thread: CPU time is the work done, whatever else the machine runs. With more,
        # it also counts the thread pools' spinning, so only wall time is compared.
        by_cpu = f"{c['served'] / c['onnx']:.2f}x" if threads == 1 else "–"
        first = f"{len(rows) / t['first']:,.0f}" if "first" in t else "–"
        like = f"{t['first'] / t['onnx']:.2f}x" if "first" in t else "–"
        encoder.append(
            f"| {threads} | {pooling} | {len(rows) / t['served']:,.0f} | "
            f"{len(rows) / t['plain']:,.0f} | {first} | {len(rows) / t['onnx']:,.0f} | "
            f"**{t['served'] / t['onnx']:.2f}x** | {by_cpu} | {t['plain'] / t['onnx']:.2f}x | "
            f"{like} | {diff:.1e} |"
        )
        f, fc = best_of(repeats, {
            "torch": lambda p=pooling: ref.featurize(smiles, pooling=p, errors="nan"),
            "onnx": lambda p=pooling: fast.featurize(smiles, pooling=p, errors="nan"),
        })  # fmt: skip
        by_cpu = f"{fc['torch'] / fc['onnx']:.2f}x" if threads == 1 else "–"
        end_to_end.append(
            f"| {threads} | {pooling} | {len(smiles) / f['torch']:,.0f} | "
            f"{len(smiles) / f['onnx']:,.0f} | **{f['torch'] / f['onnx']:.2f}x** | {by_cpu} |"
        )
    return encoder, end_to_end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_MODEL_DIR)
    args = parser.parse_args()
    smiles = pd.read_csv(data_dir() / "moleculenet" / "bbbp.csv")["smiles"].tolist()[: args.n]
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.checkpoint
        manifest = read_onnx_manifest(folder)
        if manifest is None or "encoder" not in manifest["graphs"]:
            folder = Path(tmp) / "model"
            shutil.copytree(args.checkpoint, folder)
            export_onnx(folder, "encoder")
        tables = [measure(folder, smiles, t, args.repeats) for t in args.threads]
    print(f"{cpu_name()}, torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, "
          f"{args.n} BBBP molecules, best of {args.repeats}, molecules/s\n")  # fmt: skip
    print("| threads | pooling | torch served | torch plain fp32 | torch served, pooled_only "
          "| onnxruntime | vs served | vs served, CPU time | vs plain fp32 | vs pooled_only "
          "| max abs diff |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(row for encoder, _ in tables for row in encoder))
    print("\n| threads | pooling | featurize, torch | featurize, onnxruntime | speed-up "
          "| speed-up, CPU time |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|")
    print("\n".join(row for _, end_to_end in tables for row in end_to_end))


if __name__ == "__main__":
    main()
