"""Where the served ``featurize`` spends its time, and its rate beside ECFP4's, in one run.

    SMIEXLM_DATA=../shared/data python benchmarks/featurize_served.py [--n 2000] [--repeats 3] \
        [--threads 1 2]

On the first ``--n`` BBBP molecules with the shipped default model (cls+mean+max of its last
three blocks, whitened jointly, 1,152 wide), for each thread count, alternating within each
repeat, best of ``--repeats`` by process CPU time (molecules per CPU second):

- ``served``: ``Featurizer.featurize`` as a user calls it (RDKit canonicalisation,
  tokenisation, batches of one length each, the encoder under ``batch_invariant`` with
  float32 attention per length, poolings, whitening);
- ``served before``: the same call with the previous serving, rebuilt here: batches cut by a
  token budget across lengths (padded) and float64 attention per length;
- ``raw encoder``: ``model.encode`` in plain fp32 (not batch-invariant) over the same
  batches, tokens prepared beforehand, no whitening;
- ``int8``: ``Featurizer(int8=True)``'s ``featurize`` (the linear layers in int8, opt-in;
  ``int8 cosine``: the least cosine similarity of its embedding to the served one);
- ``onnx``: ``Featurizer(backend="onnx")``'s ``featurize`` (``encoder.onnx``, exported into a
  temporary copy of the model);
- ``ecfp4``: RDKit Morgan fingerprints, radius 2, 2,048 bits, parsing included;
- ``products only``: the encoder's fp32 linear layers alone, each on inputs of the shapes one
  pass over the served batches gives it: the arithmetic no fp32 serving avoids, so its rate
  bounds any fp32 path's (``bound / ecfp4``), whatever else were made free.

With one thread, the served call is also cut into its stages (canonicalise and tokenise; the
encoder with its poolings; whitening; the rest), each timed alone; ``--profile`` adds the
functions one served call spends its time in (cProfile, own time) and the ops of one ONNX
call (onnxruntime's profiler).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import pstats
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from onnx_speed import cpu_name  # noqa: E402

from smiexlm import Featurizer  # noqa: E402
from smiexlm.modelio.layout import DEFAULT_MODEL_DIR  # noqa: E402
from smiexlm.paths import data_dir  # noqa: E402


def float64_attention(q, k, v, key_mask):
    """The previous served attention: per length, float64 matmul, softmax, matmul."""
    lengths = key_mask.flatten(1).sum(1)
    y = q.new_zeros(q.shape)
    for n in lengths.unique().tolist():
        rows = (lengths == n).nonzero().squeeze(1)
        nq = min(q.shape[2], n)
        qs, ks, vs = (t[rows, :, :m].double() for t, m in ((q, nq), (k, n), (v, n)))
        scores = (qs @ ks.transpose(-2, -1)).mul_(qs.shape[-1] ** -0.5)
        y[rows, :, :nq] = (torch.softmax(scores, dim=-1) @ vs).float()
    return y


@contextlib.contextmanager
def served_before():
    """The previous serving: token-budget batches across lengths, float64 attention."""
    import smiexlm.embedding.featurizer as featurizer
    import smiexlm.model.encoder as encoder
    from smiexlm.data.sampler import token_budget_batches

    saved = featurizer.length_batches, encoder.attention_by_length
    featurizer.length_batches, encoder.attention_by_length = token_budget_batches, float64_attention
    try:
        yield
    finally:
        featurizer.length_batches, encoder.attention_by_length = saved


def ecfp4(smiles: list[str]) -> np.ndarray:
    from rdkit import Chem, rdBase
    from rdkit.Chem import rdFingerprintGenerator

    gen = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)
    out = np.zeros((len(smiles), 2048), dtype=np.uint8)
    with rdBase.BlockLogs():
        for i, s in enumerate(smiles):
            if (mol := Chem.MolFromSmiles(s)) is not None:
                out[i] = gen.GetFingerprintAsNumPy(mol)
    return out


def raw_encoder(feat: Featurizer, batches: list[list[list[int]]]) -> None:
    from smiexlm.data.collate import collate

    for rows in batches:
        ids, mask = collate(rows, feat.tokenizer.pad_id)
        with torch.inference_mode():
            feat.model.encode(ids, mask, pooling=feat.pooling, layer=feat.blocks).pooled.numpy()


def products_only(feat: Featurizer, batches: list[list[list[int]]]):
    """A call running each of the encoder's linear products on inputs of the shapes one pass
    over ``batches`` gives it (one random input kept per shape)."""
    import smiexlm.model.encoder as encoder

    seen: list[tuple[torch.Size, torch.Tensor, torch.Tensor | None]] = []
    served = encoder.linear

    def record(x, weight, bias):
        seen.append((x.shape, weight, bias))
        return served(x, weight, bias)

    encoder.linear = record
    try:
        raw_encoder(feat, batches)
    finally:
        encoder.linear = served
    inputs = {shape: torch.randn(shape) for shape, _, _ in seen}

    def run() -> None:
        with torch.inference_mode():
            for shape, weight, bias in seen:
                torch.nn.functional.linear(inputs[shape], weight, bias)

    return run


def cpu_seconds(run) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def served_batches(feat: Featurizer, smiles: list[str]) -> list[list[list[int]]]:
    """The token rows of ``smiles`` in the batches the served call cuts (one length each)."""
    from smiexlm.data.sampler import length_batches

    ids, _, _ = feat.prepare(smiles)
    rows = sorted((r for r in ids if r is not None), key=len)
    return [[rows[j] for j in b] for b in length_batches(feat.inputs.encoder_lengths(rows), 16384)]


def stages(feat: Featurizer, smiles: list[str], repeats: int) -> dict[str, float]:
    """Best CPU seconds of each stage of one served call, each timed alone."""
    from smiexlm.whitening import served_whitening

    batches = served_batches(feat, smiles)
    pooled = np.concatenate([feat.encode_ids(b, feat.pooling) for b in batches])
    whitening = served_whitening(feat.whitening, feat.pooling, feat.blocks,
                                 feat.model.config.n_layers, None, feat.whiten)  # fmt: skip
    parts = {
        "canonicalise and tokenise": lambda: feat.prepare(smiles),
        "encoder and poolings": lambda: [feat.encode_ids(b, feat.pooling) for b in batches],
        "whitening": lambda: whitening(pooled),
        "whole call": lambda: feat.featurize(smiles, errors="nan"),
    }
    best = {name: min(cpu_seconds(run) for _ in range(repeats)) for name, run in parts.items()}
    best["the rest"] = best["whole call"] - sum(v for k, v in best.items() if k != "whole call")
    return best


def function_profile(feat: Featurizer, smiles: list[str], top: int = 10) -> dict[str, float]:
    """The ``top`` functions of one served call by their own CPU seconds, and the call's
    total under ``"whole call"`` (cProfile)."""
    feat.featurize(smiles[:50], errors="nan", log_failures=False)  # first-call set-up apart
    profile = cProfile.Profile()
    profile.runcall(feat.featurize, smiles, errors="nan", log_failures=False)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    own: Counter[str] = Counter()
    for (file, line, name), (_, _, seconds, _, _) in stats.items():
        if file != "~":
            own[f"{name} ({Path(file).stem}:{line})"] += seconds
        elif "'" in name:  # <method 'masked_fill' of 'torch._C.TensorBase' objects>
            own[name.split("'")[1]] += seconds
        else:  # <built-in method torch._C._nn.linear>
            own[name.strip("<>").split()[-1].split(".")[-1]] += seconds
    return largest(own, top)


def onnx_op_profile(folder: Path, smiles: list[str]) -> dict[str, float]:
    """The seconds onnxruntime's kernels spend in each op type over one ONNX ``featurize``
    (its own profiler, one thread), and their sum under ``"whole call"``."""
    import onnxruntime as ort

    import smiexlm.embedding.onnx_runtime as runtime

    opened, sessions = runtime.open_session, []
    with tempfile.TemporaryDirectory() as tmp:

        def profiled(payload: bytes, threads: int | None = None):
            options = ort.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            options.enable_profiling, options.profile_file_prefix = True, str(Path(tmp) / "ort")
            options.log_severity_level = 3
            sessions.append(
                ort.InferenceSession(payload, options, providers=["CPUExecutionProvider"])
            )
            return sessions[-1]

        runtime.open_session = profiled
        try:
            fast = Featurizer.from_pretrained(folder, backend="onnx")
        finally:
            runtime.open_session = opened
        fast.featurize(smiles, errors="nan", log_failures=False)
        events = json.loads(Path(sessions[0].end_profiling()).read_text())
    ops: Counter[str] = Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            ops[event["args"]["op_name"]] += event["dur"] / 1e6
    return largest(ops, 12)


def largest(seconds: Counter[str], top: int) -> dict[str, float]:
    """The ``top`` largest entries, the sum of the others and the whole."""
    kept = dict(seconds.most_common(top))
    whole = sum(seconds.values())
    return kept | {"everything else": whole - sum(kept.values()), "whole call": whole}


def share_table(title: str, unit: str, seconds: dict[str, float]) -> str:
    whole = seconds["whole call"]
    rows = [f"| {name} | {value:.2f} | {value / whole:.0%} |" for name, value in seconds.items()]
    return "\n".join([f"\n| {title} | {unit} | share |", "|---|---:|---:|", *rows])


def measure(folder: Path, smiles: list[str], threads: int, repeats: int) -> tuple[str, dict]:
    """The table's row for ``threads``, and with one thread the served call's stages."""
    torch.set_num_threads(threads)  # onnxruntime takes the same count
    feat = Featurizer.from_pretrained(folder, device="cpu")
    fast = Featurizer.from_pretrained(folder, backend="onnx")
    int8 = Featurizer.from_pretrained(folder, int8=True)
    batches = served_batches(feat, smiles)
    with served_before():
        before = feat.featurize(smiles, errors="nan", log_failures=False)
    now = feat.featurize(smiles, errors="nan", log_failures=False)
    rounded = int8.featurize(smiles, errors="nan", log_failures=False)
    ok = ~np.isnan(now).any(axis=1)
    cosine = (now[ok] * rounded[ok]).sum(1) / np.linalg.norm(now[ok], axis=1) / np.linalg.norm(rounded[ok], axis=1)  # fmt: skip
    runs = {
        "served": lambda: feat.featurize(smiles, errors="nan", log_failures=False),
        "served before": lambda: _before(feat, smiles),
        "raw encoder": lambda: raw_encoder(feat, batches),
        "int8": lambda: int8.featurize(smiles, errors="nan", log_failures=False),
        "onnx": lambda: fast.featurize(smiles, errors="nan", log_failures=False),
        "ecfp4": lambda: ecfp4(smiles),
        "products only": products_only(feat, batches),
    }
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            cpu[name].append(cpu_seconds(run))
    rate = {name: len(smiles) / min(v) for name, v in cpu.items()}
    cells = " | ".join(f"{rate[name]:,.0f}" for name in runs if name != "products only")
    line = (f"| {threads} | {cells} | **{rate['served'] / rate['ecfp4']:.3f}x** | "
            f"{rate['served before'] / rate['ecfp4']:.3f}x | "
            f"{rate['served'] / rate['served before']:.2f}x | "
            f"{rate['onnx'] / rate['served']:.2f}x | {np.nanmax(np.abs(now - before)):.1e} | "
            f"**{rate['int8'] / rate['ecfp4']:.3f}x** | {rate['int8'] / rate['served']:.2f}x | "
            f"{cosine.min():.4f} | {rate['products only']:,.0f} | "
            f"{rate['products only'] / rate['ecfp4']:.3f}x |")  # fmt: skip
    return line, (stages(feat, smiles, repeats) if threads == 1 else {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile one served call by function and one ONNX call by op",
    )
    args = parser.parse_args()
    from smiexlm.embedding.onnx_export import export_onnx

    smiles = pd.read_csv(data_dir() / "moleculenet" / "bbbp.csv")["smiles"].tolist()[: args.n]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        shutil.copytree(DEFAULT_MODEL_DIR, folder)
        export_onnx(folder, "encoder")
        measured = [measure(folder, smiles, t, args.repeats) for t in args.threads]
        if args.profile:
            torch.set_num_threads(1)
            profiles = [
                share_table("function, one served call", "CPU s",
                            function_profile(Featurizer.from_pretrained(folder), smiles)),
                share_table("onnxruntime op, one ONNX call", "s", onnx_op_profile(folder, smiles)),
            ]  # fmt: skip
    print(f"{cpu_name()}, torch {torch.__version__}, {args.n} BBBP molecules, best of "
          f"{args.repeats} by process CPU time, molecules per CPU second\n")  # fmt: skip
    print("| threads | served | served before | raw encoder | int8 | onnx | ecfp4 | served / ecfp4 "
          "| before / ecfp4 | served / before | onnx / served | max change | int8 / ecfp4 "
          "| int8 / served | int8 cosine | products only | bound / ecfp4 |")  # fmt: skip
    print("|---:" * 17 + "|")
    print("\n".join(line for line, _ in measured))
    for _, parts in measured:
        if parts:
            print(share_table("stage, one thread", "CPU s", parts))
    if args.profile:
        print("\n".join(profiles))


def _before(feat: Featurizer, smiles: list[str]) -> None:
    with served_before():
        feat.featurize(smiles, errors="nan", log_failures=False)


if __name__ == "__main__":
    main()
