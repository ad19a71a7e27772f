"""Sharded safetensors (smiexlm.modelio.shards) and sharded training checkpoints
(smiexlm.pretraining.sharded): round trips, size limits, clear errors, and a run resumed from a
sharded checkpoint copied to a fresh folder, with and without its optimizer state."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from smiexlm import ExLMConfig, ExLMModel, SmilesTokenizer
from smiexlm.errors import ConfigError, DataError
from smiexlm.modelio.layout import WEIGHTS_INDEX_NAME
from smiexlm.modelio.shards import MIB, load_sharded, save_sharded
from smiexlm.modelio.weights import save_pretrained_sharded
from tests.unit.pretraining.test_training_support import FAST, MICRO_MODEL, build_dataset


def tiny_model() -> tuple[ExLMModel, SmilesTokenizer]:
    torch.manual_seed(0)
    tok = SmilesTokenizer()
    config = ExLMConfig.tiny(vocab_size=tok.vocab_size, vocab_hash=tok.vocab_hash, objective="exlm")
    return ExLMModel(config), tok


def test_round_trip_is_exact_and_every_shard_is_under_the_limit(tmp_path):
    model, tok = tiny_model()
    folder = save_pretrained_sharded(model, tmp_path / "m", tok, max_shard_mib=1.0)
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    assert len(shards) == 5 and not (folder / "model.safetensors").exists()  # 4.2 MB of fp32
    assert all(p.stat().st_size <= MIB for p in shards)
    index = json.loads((folder / WEIGHTS_INDEX_NAME).read_text())
    assert set(index["weight_map"]) == set(model.state_dict())
    assert set(index["metadata"]["sha256"]) == {p.name for p in shards}
    assert index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for t in model.state_dict().values()
    )
    loaded = ExLMModel.from_pretrained(folder)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_fp16_shards_load_back_to_fp32(tmp_path):
    model, tok = tiny_model()
    folder = save_pretrained_sharded(model, tmp_path / "m", tok, torch.float16, max_shard_mib=1)
    tensors = load_sharded(folder)
    assert {t.dtype for t in tensors.values() if t.is_floating_point()} == {torch.float16}
    loaded = ExLMModel.from_pretrained(folder)
    weight = loaded.state_dict()["embed.weight"]
    assert weight.dtype == torch.float32
    torch.testing.assert_close(weight, model.state_dict()["embed.weight"].half().float())


def test_a_tensor_over_the_limit_is_named(tmp_path):
    with pytest.raises(ConfigError, match="'big'"):
        save_sharded({"big": torch.zeros(1 << 18), "small": torch.zeros(4)}, tmp_path, 0.5)


def test_missing_changed_or_foreign_shards_are_errors(tmp_path):
    tensors = {f"t{i}": torch.full((40_000,), float(i)) for i in range(6)}  # 160 kB each
    index = save_sharded(tensors, tmp_path / "a", max_shard_mib=0.4)
    shards = sorted((tmp_path / "a").glob("model-*.safetensors"))
    assert len(shards) == 3 and load_sharded(index).keys() == tensors.keys()

    broken = shutil.copytree(tmp_path / "a", tmp_path / "b")
    (broken / shards[1].name).unlink()
    with pytest.raises(DataError, match=f"{shards[1].name}.*missing"):
        load_sharded(broken)

    changed = shutil.copytree(tmp_path / "a", tmp_path / "c")
    data = bytearray((changed / shards[0].name).read_bytes())
    data[-1] ^= 0xFF
    (changed / shards[0].name).write_bytes(bytes(data))
    with pytest.raises(DataError, match="sha256"):
        load_sharded(changed)
    assert load_sharded(changed, verify=False)["t0"].shape == (40_000,)

    foreign = shutil.copytree(tmp_path / "a", tmp_path / "d")
    doc = json.loads((foreign / WEIGHTS_INDEX_NAME).read_text())
    doc["weight_map"].pop("t0")
    (foreign / WEIGHTS_INDEX_NAME).write_text(json.dumps(doc))
    with pytest.raises(DataError, match="unlisted tensors \\['t0'\\]"):
        load_sharded(foreign)


# ---------------------------------------------------------------- training checkpoints
@pytest.fixture(scope="module")
def dataset(shared_data, tmp_path_factory):
    return build_dataset(
        shared_data / "pretrain" / "moses_test.smi.gz", tmp_path_factory.mktemp("ds") / "ds"
    )


def _config():
    from smiexlm.pretraining.config import load_config

    extra = ["save_every=4", "total_steps=40", "device=cpu", "precision=fp32"]
    return load_config("mol_tiny_exlm", [*MICRO_MODEL, *FAST, *extra])


def _run(dataset, out, steps, resume=False):
    from smiexlm.pretraining.trainer import pretrain

    return pretrain(_config(), dataset, out, max_steps=steps, resume=resume)


def _losses(run_dir) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def test_resume_from_sharded_checkpoint_on_a_fresh_folder_is_exact(dataset, tmp_path):
    from smiexlm.pretraining.sharded import describe, export_sharded, restore_sharded

    reference = _run(dataset, tmp_path / "reference", 8)
    _run(dataset, tmp_path / "first", 4)
    exported = export_sharded(tmp_path / "first/checkpoints/step_000004", tmp_path / "s", 0.15)
    assert exported.optimizer_included and exported.step == 4
    assert len(list((tmp_path / "s").glob("optimizer-*.safetensors"))) >= 2
    assert describe(tmp_path / "s")["optimizer"] == "included"
    fresh = shutil.copytree(tmp_path / "s", tmp_path / "elsewhere" / "s")  # another machine
    report = restore_sharded(fresh, tmp_path / "resumed")
    assert report.step == 4 and report.optimizer == "restored"
    resumed = _run(dataset, tmp_path / "resumed", 8, resume=True)
    for step in (5, 6, 7, 8):
        assert _losses(tmp_path / "resumed")[step] == _losses(tmp_path / "reference")[step]
    want = reference.model.state_dict()
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, want[name]), name


def test_optimizer_left_behind_is_rewarmed_and_said(dataset, tmp_path, caplog):
    from smiexlm.pretraining.sharded import describe, export_sharded, restore_sharded

    _run(dataset, tmp_path / "first", 4)
    step4 = tmp_path / "first/checkpoints/step_000004"
    weights_mib = (step4 / "model.safetensors").stat().st_size / MIB
    exported = export_sharded(step4, tmp_path / "s", 0.15, max_total_mib=weights_mib * 1.5)
    assert not exported.optimizer_included and "left behind" in exported.note
    assert describe(tmp_path / "s")["optimizer"] == "left behind"
    assert not list((tmp_path / "s").glob("optimizer*"))
    with pytest.raises(ConfigError, match="data_dir"):
        restore_sharded(tmp_path / "s", tmp_path / "resumed")

    with caplog.at_level(logging.WARNING, logger="smiexlm.pretraining.sharded"):
        report = restore_sharded(tmp_path / "s", tmp_path / "resumed", dataset, rewarm_batches=3)
    assert report.optimizer == "re-warmed from 3 micro-batches at lr 0"
    assert "left behind" in caplog.text and "re-warmed" in caplog.text
    state = json.loads((report.checkpoint / "trainer_state.json").read_text())
    assert state["state"]["extra"]["optimizer_rewarmed"] == {"batches": 3, "at_step": 4}
    restored = ExLMModel.from_pretrained(report.checkpoint)  # weights untouched by the re-warm
    original = ExLMModel.from_pretrained(step4)
    for name, tensor in original.state_dict().items():
        assert torch.equal(restored.state_dict()[name], tensor), name
    resumed = _run(dataset, tmp_path / "resumed", 8, resume=True)
    assert resumed.step == 8 and all(
        v == v and abs(v) < 1e3 for v in _losses(tmp_path / "resumed").values()
    )
