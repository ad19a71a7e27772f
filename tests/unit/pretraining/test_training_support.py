"""Shared pieces of the training tests: a tiny dataset built by the real pipeline."""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path

# A model small enough that a step takes milliseconds on one thread.
MICRO_MODEL = [
    "model.n_layers=2",
    "model.n_heads=2",
    "model.d_model=32",
    "model.d_ff=64",
    "model.n_transition_heads=2",
    "model.dropout=0.0",
    "model.attention_dropout=0.0",
]
FAST = [
    "max_tokens=512",
    "update_freq=1",
    "warmup_steps=2",
    "lr=0.003",
    "log_every=1",
    "valid_every=4",
    "valid_batches=2",
    "save_every=4",
    "keep_last=2",
    "num_threads=1",
    "progress=false",
]


def build_dataset(source_gz: Path, out: Path, n: int = 300) -> Path:
    """A dataset folder from the first ``n`` SMILES of a gzip file, with its own vocabulary."""
    from smiexlm.data.pipeline import PreprocessConfig, preprocess
    from smiexlm.tokenizer import SmilesTokenizer

    with gzip.open(source_gz, "rt") as handle:
        smiles = [next(handle).strip() for _ in range(n)]
    out.mkdir(parents=True, exist_ok=True)
    raw = out.parent / f"{out.name}.smi"
    raw.write_text("\n".join(smiles) + "\n")
    vocab = out.parent / f"{out.name}.vocab.json"
    SmilesTokenizer.build(smiles).save(vocab)
    config = PreprocessConfig(valid_fraction=0.1)
    preprocess([raw], out, config, vocab=vocab, progress=False)
    return out


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "smiexlm.cli.main", *args]


_DDP_SCRIPT = """
import os, sys
from pathlib import Path
from safetensors.torch import save_file
from smiexlm.pretraining import load_config, pretrain
data, out, name, *overrides = sys.argv[1:]
result = pretrain(load_config(name, overrides), Path(data), Path(out))
rank = int(os.environ.get("RANK", "0"))
state = {k: v.contiguous() for k, v in result.model.state_dict().items()}
save_file(state, str(Path(out) / f"rank{rank}.safetensors"))
"""


def ddp_and_one_process(data: Path, tmp_path: Path, config: str, overrides: list[str]):
    """Train ``config`` twice, as 2 torchrun processes of ``update_freq=1`` and as one
    process of ``update_freq=2`` (the same global batch): the two run folders and the final
    weights of rank 0, rank 1 and the single process."""
    import subprocess

    from safetensors.torch import load_file

    from tests.conftest import free_port

    script = tmp_path / "run.py"
    script.write_text(_DDP_SCRIPT)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(free_port())]  # fmt: skip
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    for command, out, freq in ((torchrun, ddp, 1), ([sys.executable], single, 2)):
        run = subprocess.run(
            [*command, str(script), str(data), str(out), config, *overrides,
             f"update_freq={freq}"], env=cli_env(), capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
    weights = [load_file(str(d / "rank0.safetensors")) for d in (ddp, single)]
    return ddp, single, weights[0], load_file(str(ddp / "rank1.safetensors")), weights[1]
