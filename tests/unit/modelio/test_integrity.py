"""Model folders that cannot lie: recorded sha256 digests, configs checked against the weight
file's header before any allocation, checked fine-tuned folders.

Each fault is a damaged copy of the shipped tiny default model and a user's command run
through the real ``smiexlm`` entry point (``tests.integration.test_faults``): exit code 2 and one line
naming the file and the problem.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from smiexlm.errors import DataError
from smiexlm.modelio.integrity import read_header, verify_checksum
from smiexlm.modelio.layout import CHECKSUMS_NAME
from tests.conftest import smiexlm_command
from tests.integration.test_faults import DEFAULT_MODEL, assert_one_line_error, run_cli

TWINS = DEFAULT_MODEL.parent / "twins"
EXLM = TWINS / "exlm"  # the structural checks read the pure ExLM (2D RoPE buffers, 63 tensors)


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _overwrite_data(weights: Path, byte: bytes = b"\xff") -> None:
    """Every tensor byte set to ``byte`` (0xFF halves are NaN); size and header unchanged."""
    raw = bytearray(weights.read_bytes())
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    raw[start:] = byte * (len(raw) - start)
    weights.write_bytes(bytes(raw))


def _embed(tmp_path: Path, folder: Path) -> subprocess.CompletedProcess:
    table = tmp_path / "t.csv"
    table.write_text("smiles\nCCO\nc1ccccc1O\n")
    return run_cli("embed", table, "--out", tmp_path / "e.npy", "-c", folder)


# ---------------------------------------------------------------------- recorded sha256
@pytest.mark.parametrize("folder", [DEFAULT_MODEL, *sorted(TWINS.iterdir())], ids=lambda p: p.name)
def test_shipped_models_record_their_weights(folder):
    assert verify_checksum(folder / "model.safetensors")


def test_weights_overwritten_in_place_fail_the_recorded_sha256(tmp_path):
    folder = _copy(EXLM, tmp_path / "model")
    _overwrite_data(folder / "model.safetensors")
    res = _embed(tmp_path, folder)
    assert_one_line_error(res, "model.safetensors", "sha256", CHECKSUMS_NAME)
    assert not (tmp_path / "e.npy").exists()


def test_older_folder_without_a_record_fails_on_nan_weights(tmp_path):
    folder = _copy(EXLM, tmp_path / "model")
    (folder / CHECKSUMS_NAME).unlink()  # as written before checksums.json existed
    _overwrite_data(folder / "model.safetensors")
    first = next(iter(read_header(folder / "model.safetensors")))
    res = _embed(tmp_path, folder)
    assert_one_line_error(res, "model.safetensors", f"tensor {first!r}", "NaN")
    (folder / "model.safetensors").unlink()
    shutil.copy(EXLM / "model.safetensors", folder)  # intact: loads unverified
    assert _embed(tmp_path, folder).returncode == 0


def test_checksums_file_broken_or_silent_is_one_line(tmp_path):
    folder = _copy(EXLM, tmp_path / "model")
    (folder / CHECKSUMS_NAME).write_text('{"format": "smiexlm-checksums/1", "sha256": {}}')
    assert_one_line_error(_embed(tmp_path, folder), CHECKSUMS_NAME, "records no sha256")
    (folder / CHECKSUMS_NAME).write_text("{")
    assert_one_line_error(_embed(tmp_path, folder), CHECKSUMS_NAME, "not valid JSON")


def test_featurizer_and_analyses_use_the_checked_loader(tmp_path):
    from smiexlm import Featurizer

    folder = _copy(EXLM, tmp_path / "model")
    _overwrite_data(folder / "model.safetensors")
    with pytest.raises(DataError, match="sha256"):
        Featurizer.from_pretrained(folder)
    res = run_cli("analyze", "dag", folder, "--smiles", "CCO", "--mask", "1",
                  "--out", tmp_path / "dag")  # fmt: skip
    assert_one_line_error(res, "model.safetensors", "sha256")


# ---------------------------------------------------------------------- untrusted config
def _run_capped(*args: str, gib: int = 4) -> subprocess.CompletedProcess:
    """``run_cli`` with at most ``gib`` GiB of address space: an allocation sized by the
    config fails fast instead of taking the machine's memory."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))

    return subprocess.run(
        [smiexlm_command(), *map(str, args)], capture_output=True, text=True, timeout=300,
        env=os.environ | {"OMP_NUM_THREADS": "1"}, preexec_fn=cap,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        ({"d_model": 4096, "n_layers": 64}, ["'d_model' = 4096", "embed.weight of shape (333, 128)"]),
        ({"n_layers": 64}, ["'n_layers' = 64", "encoder.layers.0 to 3", "n_layers = 4"]),
        ({"max_positions": 60000}, ["'max_positions' = 60000", "(1024, 128)", "= 512"]),
        ({"max_positions": 1_000_000_000}, ["'max_positions' = 1000000000", "at most 65,536"]),
    ],
)  # fmt: skip
def test_huge_config_is_checked_against_the_weights_before_allocation(tmp_path, overrides, needles):
    folder = _copy(EXLM, tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | overrides))
    table = tmp_path / "t.csv"
    table.write_text("smiles\nCCO\n")
    res = _run_capped("embed", table, "--out", tmp_path / "e.npy", "-c", folder)
    assert_one_line_error(res, "config.json", *needles)


def test_weights_without_the_tensors_that_size_the_model_are_refused_before_allocation(tmp_path):
    # without embed.weight nothing in the file says d_model: a model built from this config
    # (17 GB of fp32) would exhaust the 4 GiB cap before any tensor were compared
    from safetensors.torch import load_file, save_file

    folder = _copy(EXLM, tmp_path / "model")
    tensors = load_file(folder / "model.safetensors")
    del tensors["embed.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"d_model": 16384}))
    table = tmp_path / "t.csv"
    table.write_text("smiles\nCCO\n")
    res = _run_capped("embed", table, "--out", tmp_path / "e.npy", "-c", folder)
    assert_one_line_error(
        res, "model.safetensors", "config.json", "missing tensors ['embed.weight']"
    )


def test_header_is_read_alone_and_must_describe_the_file(tmp_path):
    weights = EXLM / "model.safetensors"
    header = read_header(weights)
    assert header["embed.weight"] == ("F16", (333, 128)) and len(header) == 63
    bad = tmp_path / "model.safetensors"
    raw = weights.read_bytes()
    bad.write_bytes(raw.replace(b'"shape":[333,128]', b'"shape":[999,128]', 1))
    with pytest.raises(DataError, match="'embed.weight' F16 .* spans 85248 bytes"):
        read_header(bad)
    bad.write_bytes(raw + b"\0")
    with pytest.raises(DataError, match="truncated or corrupted"):
        read_header(bad)


# ---------------------------------------------------------------------- fine-tuned folders
@pytest.fixture(scope="module")
def finetuned(tmp_path_factory) -> Path:
    """A fine-tuned folder as ``finetune --save-dir`` writes it (an untrained head)."""
    from smiexlm.finetuning.config import FinetuneConfig
    from smiexlm.finetuning.folder import save_finetuned
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel
    from smiexlm.tokenizer import SmilesTokenizer

    model = ExLMForSequencePrediction(ExLMModel.from_pretrained(EXLM), 1, "multilabel")
    meta = dict(dataset="mine", task_type="classification", label_cols=["y"],
                config=FinetuneConfig().to_dict(), target_mean=[0.0], target_std=[1.0],
                feature_scaler=None)  # fmt: skip
    folder = tmp_path_factory.mktemp("finetuned") / "seed0"
    tokenizer = SmilesTokenizer.load(EXLM / "vocab.json")
    return save_finetuned(model, tokenizer, folder, meta)


def _damage_finetuned(folder: Path, damage: str) -> None:
    head, meta_path = folder / "head.safetensors", folder / "finetune.json"
    meta = json.loads(meta_path.read_text())
    if damage == "head truncated":
        os.truncate(head, head.stat().st_size - 100)
    elif damage == "head missing":
        head.unlink()
    elif damage == "head overwritten":
        _overwrite_data(head)
    elif damage == "meta not JSON":
        meta_path.write_text('{"task_type": "classi')
    elif damage == "meta lacks n_outputs":
        meta_path.write_text(json.dumps({k: v for k, v in meta.items() if k != "n_outputs"}))
    elif damage == "meta edited":
        meta_path.write_text(json.dumps(meta | {"target_mean": [0.25]}))
    elif damage == "meta says 2 outputs":  # in a folder whose record leaves finetune.json out
        meta |= {"n_outputs": 2, "label_cols": ["y", "z"], "target_mean": [0, 0],
                 "target_std": [1, 1]}  # fmt: skip
        meta_path.write_text(json.dumps(meta))
        sums = json.loads((folder / CHECKSUMS_NAME).read_text())
        del sums["sha256"]["finetune.json"]
        (folder / CHECKSUMS_NAME).write_text(json.dumps(sums))


@pytest.mark.parametrize(
    ("damage", "needles"),
    [
        ("head truncated", ["head.safetensors", "truncated or corrupted"]),
        ("head missing", ["has no head.safetensors"]),
        ("head overwritten", ["head.safetensors", "sha256"]),
        ("meta not JSON", ["finetune.json", "not valid JSON"]),
        ("meta lacks n_outputs", ["finetune.json", "'n_outputs' is 'missing'", "positive integer"]),
        ("meta edited", ["finetune.json", "sha256"]),
        ("meta says 2 outputs", ["head.safetensors", "'out_proj.bias'", "(1,)", "(2,)"]),
    ],
)  # fmt: skip
def test_corrupted_finetuned_folder_is_one_line(tmp_path, finetuned, damage, needles):
    folder = _copy(finetuned, tmp_path / "seed0")
    _damage_finetuned(folder, damage)
    res = _predict(tmp_path, folder)
    assert_one_line_error(res, *needles)
    assert not (tmp_path / "p.csv").exists()


def test_finetuned_folder_records_both_weight_files_and_predicts(tmp_path, finetuned):
    assert verify_checksum(finetuned / "model.safetensors")
    assert verify_checksum(finetuned / "head.safetensors")
    assert verify_checksum(finetuned / "finetune.json")
    assert _predict(tmp_path, finetuned).returncode == 0
    assert (tmp_path / "p.csv").read_text().startswith("smiles,valid,y,truncated\nCCO,True,")


def _predict(tmp_path: Path, folder: Path) -> subprocess.CompletedProcess:
    table = tmp_path / "in.csv"
    table.write_text("smiles\nCCO\n")
    return run_cli(
        "predict", "--checkpoint", folder, "--input", table, "--output", tmp_path / "p.csv"
    )


def test_finetune_from_a_corrupted_checkpoint_is_one_line(tmp_path):
    folder = _copy(EXLM, tmp_path / "model")
    _overwrite_data(folder / "model.safetensors", b"\x00")  # zeros: finite, but not the weights
    smiles = [f"C1{'C' * n}1{tail}" for n in range(2, 16) for tail in ("", "O", "N", "Cl")]
    table = tmp_path / "train.csv"
    table.write_text("smiles,y\n" + "".join(f"{s},{i % 2}\n" for i, s in enumerate(smiles)))
    res = run_cli("finetune", "mine", "--data", table, "--label-cols", "y", "--seeds", "0",
                  "--max-train-steps", "1", "--device", "cpu", "--split", "random",
                  "--checkpoint", folder, "--out", tmp_path / "report")  # fmt: skip
    assert_one_line_error(res, "model.safetensors", "sha256")
