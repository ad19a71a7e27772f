"""Pre-training: config loading, optimiser schedule, checkpoints, a short real run, errors, plots."""

from __future__ import annotations

import json
import math

import pytest
import torch

from smiexlm.atomic import atomic_dir
from smiexlm.errors import ConfigError, DataError, VocabularyMismatchError
from smiexlm.pretraining.config import (
    TrainConfig,
    load_config,
    parse_override,
    shipped_configs,
    valid_keys,
)
from smiexlm.training import run_state as ckpt
from smiexlm.training.optim import PolynomialDecaySchedule, build_optimizer
from tests.conftest import require_file
from tests.unit.pretraining.test_training_support import FAST, MICRO_MODEL, build_dataset


@pytest.fixture(scope="module")
def dataset(shared_data, tmp_path_factory):
    source = require_file(shared_data, "pretrain/moses_test.smi.gz")
    return build_dataset(source, tmp_path_factory.mktemp("data") / "ds", n=300)


# ------------------------------------------------------------------ config
def test_shipped_configs_load_and_name_their_launch_command():
    configs = shipped_configs()
    expected = {
        f"mol_{size}_{obj}"
        for size in ("base", "tiny", "small")
        for obj in ("exlm", "mlm", "maelm")
    } | {"text_base_exlm", "text_tiny_exlm", "text_tiny_mlm"}
    expected |= {"mol_tiny_mtr", "mol_tiny_exlm_desc", "mol_tiny_mlm_desc"}
    assert expected <= set(configs)
    for name, path in configs.items():
        first = path.read_text().splitlines()[0]
        assert first.startswith(f"# Launch: smiexlm pretrain --config {name} "), name
        config = load_config(name)
        config.model_config(vocab_size=369)  # every model section builds a valid ExLMConfig


def test_mol_base_exlm_is_table_7():
    c = load_config("mol_base_exlm")
    m = c.model_config(vocab_size=369)
    assert (m.n_layers, m.n_heads, m.d_model, m.d_ff, m.k, m.objective) == (
        9,
        12,
        768,
        2048,
        2,
        "exlm",
    )
    assert (m.dropout, m.attention_dropout, m.mask_prob, m.mask_policy) == (
        0.1,
        0.1,
        0.15,
        "all_mask",
    )
    assert (c.lr, c.warmup_steps, c.max_steps, c.max_tokens) == (5e-4, 10_000, 120_000, 65536)
    assert (c.weight_decay, c.clip_norm, c.adam_betas, c.adam_eps) == (0.0, 1.0, (0.9, 0.98), 1e-6)
    # the MLM baseline differs in the objective only
    mlm = load_config("mol_base_mlm")
    assert {**mlm.to_dict(), "model": {}} == {**c.to_dict(), "model": {}}
    assert {k: v for k, v in mlm.model.to_table().items() if k not in ("objective", "k")} == {
        k: v for k, v in c.model.to_table().items() if k not in ("objective", "k")
    }


def test_text_base_is_table_10():
    c = load_config("text_base_exlm")
    m = c.model_config(vocab_size=30000)
    assert (m.n_layers, m.n_heads, m.d_model, m.d_ff, m.k) == (12, 12, 768, 3072, 4)
    assert (c.lr, c.warmup_steps, c.max_steps, c.weight_decay, c.clip_norm) == (
        5e-4,
        10_000,
        125_000,
        0.01,
        0.0,
    )


def test_overrides_are_parsed_as_toml_literals(tmp_path):
    assert parse_override("lr=3e-4") == ("lr", 3e-4)
    assert parse_override("model.objective=mlm") == ("model.objective", "mlm")
    assert parse_override("tensorboard=true") == ("tensorboard", True)
    c = load_config("mol_tiny_exlm", ["lr=2e-3", "model.k=3", "adam_betas=[0.9, 0.95]"])
    assert c.lr == 2e-3 and c.model.config.k == 3 and c.adam_betas == (0.9, 0.95)
    # a file path works the same as a shipped name, and the resolved config round-trips
    saved = c.save(tmp_path / "config.resolved.toml")
    assert load_config(saved) == c
    assert TrainConfig.from_dict(json.loads(c.save(tmp_path / "c.json").read_text())) == c


def test_a_model_that_is_not_a_table_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="'model' = 'foo'"):
        load_config("mol_tiny_exlm", ["model=foo", "model.k=3"])
    for name, text in (("a.toml", 'model = "tiny"\n'), ("b.yaml", "model:\nlr: 0.001\n")):
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match="'model' = .*a table of model settings"):
            load_config(tmp_path / name)


def test_unknown_key_is_named_with_the_valid_keys(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config("mol_tiny_exlm", ["learning_rate=1e-3"])
    assert "learning_rate" in str(err.value) and "'lr'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config("mol_tiny_exlm", ["model.layers=3"])
    assert "model.layers" in str(err.value) and "n_layers" in str(err.value)
    path = tmp_path / "bad.toml"
    path.write_text("max_tokns = 10\n")
    with pytest.raises(ConfigError, match="max_tokns"):
        load_config(path)
    with pytest.raises(ConfigError, match="config"):
        load_config("no_such_config")
    with pytest.raises(ConfigError, match="update_freq"):
        load_config("mol_tiny_exlm", ["update_freq=0"])
    assert "lr" in valid_keys() and "model.k" in valid_keys()


# ------------------------------------------------------------------ optimiser
def test_device_accepts_cuda_n_everywhere():
    from smiexlm.device import resolve_device

    assert TrainConfig(device="cuda:1").device == "cuda:1"  # checked without touching CUDA
    for bad in ("gpu", "cuda:", "cuda:x", "CPU"):
        with pytest.raises(ConfigError, match="device"):
            TrainConfig(device=bad)
    assert resolve_device("cpu", local_rank=1) == torch.device("cpu")
    if torch.cuda.is_available():
        assert resolve_device("cuda:0") == torch.device("cuda", 0)
        assert resolve_device("auto", local_rank=0) == torch.device("cuda", 0)
    else:
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda:0")


def test_polynomial_decay_matches_the_closed_form():
    s = PolynomialDecaySchedule(lr=1e-3, warmup_steps=10, total_steps=110, end_lr=1e-5, power=2.0)
    assert s.lr_at(0) == pytest.approx(1e-4)  # first update: 1/10 of the peak
    assert s.lr_at(9) == pytest.approx(1e-3)  # end of warmup: the peak
    for step in (10, 40, 77, 108):
        t = (step + 1 - 10) / 100
        assert s.lr_at(step) == pytest.approx((1e-3 - 1e-5) * (1 - t) ** 2 + 1e-5)
    assert s.lr_at(109) == pytest.approx(1e-5) and s.lr_at(500) == pytest.approx(1e-5)


def test_optimizer_decays_matrices_only():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    config = TrainConfig(weight_decay=0.1)
    opt = build_optimizer(model, config)
    decayed, plain = opt.param_groups
    assert [p.shape for p in decayed["params"]] == [torch.Size([4, 3])]
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-6


# ------------------------------------------------------------------ checkpoint state
def test_optimizer_and_rng_state_round_trip_without_pickle(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = build_optimizer(model, TrainConfig(weight_decay=0.01))
    for _ in range(3):
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
    tensors, groups = ckpt.optimizer_to_tensors(opt)
    from safetensors.torch import load_file, save_file

    save_file(tensors, str(tmp_path / "opt.safetensors"))
    json.dumps(groups)  # JSON-able
    fresh = build_optimizer(model, TrainConfig(weight_decay=0.01))
    ckpt.optimizer_from_tensors(fresh, load_file(str(tmp_path / "opt.safetensors")), groups)
    a, b = opt.state_dict(), fresh.state_dict()
    for i in a["state"]:
        for name in a["state"][i]:
            assert torch.equal(a["state"][i][name], b["state"][i][name])
    rng_tensors, rng_scalars = ckpt.rng_state()
    json.dumps(rng_scalars)
    expected = (torch.rand(3), __import__("numpy").random.rand(2).tolist())
    ckpt.set_rng_state(rng_tensors, rng_scalars)
    assert torch.equal(torch.rand(3), expected[0])
    assert __import__("numpy").random.rand(2).tolist() == expected[1]


def test_atomic_dir_leaves_nothing_behind_on_failure(tmp_path):
    target = tmp_path / "step_000001"
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("crash while writing")
    assert not target.exists() and list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ real runs
def _config(*extra: str) -> TrainConfig:
    return load_config("mol_tiny_exlm", [*MICRO_MODEL, *FAST, *extra])


@pytest.mark.parametrize("objective", ["exlm", "mlm", "maelm"])
def test_short_run_writes_metrics_and_a_loadable_checkpoint(dataset, tmp_path, objective):
    from smiexlm import ExLMModel
    from smiexlm.pretraining.trainer import pretrain

    out = tmp_path / "run"
    result = pretrain(_config(f"model.objective={objective}"), dataset, out, max_steps=8)
    assert result.step == 8 and result.interrupted_by is None
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 9))
    assert all(math.isfinite(r["loss"]) and r["tokens_per_s"] > 0 for r in records)
    assert ("n_invalid" in records[0]) == (objective == "exlm")
    assert [r["step"] for r in records if "valid_loss" in r] == [4, 8]
    assert records[-1]["loss"] < records[0]["loss"]  # it learns something in 8 steps
    assert (out / "config.resolved.toml").is_file()
    folders = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert "step_000008" in folders and "last" in folders and "best" in folders
    for name in ("step_000008", "last"):
        model = ExLMModel.from_pretrained(out / "checkpoints" / name)
        assert model.config.objective == objective
        for key, value in model.state_dict().items():
            assert torch.equal(value, result.model.state_dict()[key]), key


def test_vocabulary_mismatch_and_missing_dataset(dataset, tmp_path):
    from smiexlm.pretraining.trainer import pretrain

    with pytest.raises(VocabularyMismatchError, match="vocab_size = 999"):
        pretrain(_config("model.vocab_size=999"), dataset, tmp_path / "r1", max_steps=1)
    with pytest.raises(DataError, match="does not exist"):
        pretrain(_config(), tmp_path / "nowhere", tmp_path / "r2", max_steps=1)
    with pytest.raises(DataError, match="manifest.json"):
        pretrain(_config(), tmp_path, tmp_path / "r3", max_steps=1)


def test_resume_refuses_a_dataset_with_another_vocabulary(dataset, tmp_path):
    import shutil

    from smiexlm.pretraining.trainer import pretrain
    from smiexlm.tokenizer import SmilesTokenizer

    out = tmp_path / "run"
    pretrain(_config(), dataset, out, max_steps=4)
    with pytest.raises(ConfigError, match="--resume"):
        pretrain(_config(), dataset, out, max_steps=5)  # refuses to overwrite a run
    other = tmp_path / "other"
    shutil.copytree(dataset, other)
    tokens = json.loads((dataset / "vocab.json").read_text())["tokens"]
    changed = SmilesTokenizer(tokens[:5] + list(reversed(tokens[5:])))
    changed.save(other / "vocab.json")
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["vocab_hash"] = changed.vocab_hash
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(VocabularyMismatchError, match="vocabulary"):
        pretrain(_config(), other, out, max_steps=6, resume=True)


def test_plot_run_draws_a_png(dataset, tmp_path):
    from smiexlm.pretraining.plot import plot_run
    from smiexlm.pretraining.trainer import pretrain

    out = tmp_path / "run"
    pretrain(_config("model.objective=mlm"), dataset, out, max_steps=4)
    png = plot_run(out)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    with pytest.raises(DataError, match="metrics.jsonl"):
        plot_run(tmp_path)


def test_plot_run_overlays_several_runs_and_metrics_files(dataset, tmp_path):
    from smiexlm.pretraining.plot import plot_run, read_metrics
    from smiexlm.pretraining.trainer import pretrain

    first, second = tmp_path / "first", tmp_path / "second"
    pretrain(_config("model.objective=mlm"), dataset, first, max_steps=3)
    pretrain(_config("model.objective=mlm", "seed=1"), dataset, second, max_steps=4)
    kept = tmp_path / "kept_metrics.jsonl"  # a run's metrics kept without its folder
    kept.write_text((second / "metrics.jsonl").read_text())
    assert read_metrics(kept) == read_metrics(second) and len(read_metrics(second)) == 4
    png = plot_run([first, kept], tmp_path / "both.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(DataError, match="--out"):  # no default path for several runs
        plot_run([first, second])
    with pytest.raises(DataError, match="missing.jsonl"):
        plot_run([first, tmp_path / "missing.jsonl"], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(DataError, match=r"'.*notes.txt': expected a picture's path ending in"):
        plot_run(first, tmp_path / "notes.txt")  # matplotlib's own error, before: a traceback
    assert plot_run(first, tmp_path / "curves.svg").read_text().lstrip().startswith("<?xml")


def test_export_writes_a_model_folder_with_its_card(dataset, tmp_path):
    from collections import Counter

    from smiexlm import ExLMModel, Featurizer
    from smiexlm.data.shards import TokenDataset
    from smiexlm.pretraining.export import export_run
    from smiexlm.pretraining.trainer import pretrain
    from smiexlm.tokenizer import SmilesTokenizer

    out = tmp_path / "run"
    result = pretrain(_config(), dataset, out, max_steps=4)
    card = export_run(out, tmp_path / "model", dataset=dataset, command="smiexlm pretrain ...")
    folder = card.parent
    text = card.read_text()
    assert "| updates | 4 |" in text and "smiexlm pretrain ..." in text
    assert f"| tokens seen | {result.tokens_seen:,} |" in text
    assert json.loads((folder / "normalization.json").read_text()) == {
        "canonicalize": True,
        "strip_salts": False,
        "strip_stereo": False,
    }
    assert "stereo kept" in text
    assert json.loads((folder / "embedding.json").read_text()) == {"pooling": "cls"}
    tokens = json.loads((folder / "corpus_tokens.json").read_text())  # row by row, by hand
    train, names = TokenDataset(dataset, "train"), SmilesTokenizer.load(folder).tokens
    by_hand = Counter(names[i] for row in range(len(train)) for i in train[row].tolist())
    assert tokens["counts"] == dict(by_hand) and tokens["tokens"] == int(train.lengths.sum())
    trained = sum(1 for name in by_hand if name not in ("[BOS]", "[EOS]"))
    assert f"- tokens trained: {trained} of the vocabulary's {len(names) - 5} " in text
    mean = export_run(out, tmp_path / "mean", pooling="mean").parent
    assert Featurizer.from_pretrained(mean).pooling == "mean" and "mean pooling" in (mean / "MODEL_CARD.md").read_text()  # fmt: skip
    model = ExLMModel.from_pretrained(folder)  # fp16 on disk, loads as the trained weights
    for key, value in model.state_dict().items():
        assert torch.allclose(value.float(), result.model.state_dict()[key], atol=2e-3), key
    assert Featurizer.from_pretrained(folder).featurize(["CCO"]).shape == (1, 32)
    with pytest.raises(DataError, match="does not exist"):
        export_run(out, tmp_path / "x", checkpoint="step_999")


def test_out_of_memory_batch_suggests_a_smaller_max_tokens(dataset, tmp_path, monkeypatch):
    from smiexlm.model.model import ExLMModel
    from smiexlm.pretraining.trainer import pretrain

    def exhausted(self, *args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 GB")

    monkeypatch.setattr(ExLMModel, "forward", exhausted)
    with pytest.raises(ConfigError) as err:
        pretrain(_config(), dataset, tmp_path / "run", max_steps=2)
    assert err.value.field == "max_tokens" and "max_tokens=256" in str(err.value)


def test_export_without_data_keeps_the_normalisation_of_the_dataset_the_run_trained_on(
    dataset, tmp_path
):
    """A run on a dataset whose SMILES were stripped of stereo: the folder exported without
    --data says so (the featurizer strips it too), and says in one line when that dataset is
    gone, rather than writing the defaults."""
    import shutil

    from smiexlm.pretraining.export import export_run
    from smiexlm.pretraining.trainer import pretrain

    flat = shutil.copytree(dataset, tmp_path / "flat")
    manifest = json.loads((flat / "manifest.json").read_text())
    manifest["config"]["strip_stereo"] = True  # as `preprocess --strip-stereo` records it
    (flat / "manifest.json").write_text(json.dumps(manifest))
    pretrain(_config(), flat, tmp_path / "run", max_steps=1)
    folder = export_run(tmp_path / "run", tmp_path / "model").parent
    assert json.loads((folder / "normalization.json").read_text())["strip_stereo"] is True
    shutil.rmtree(flat)
    with pytest.raises(DataError, match="which is not there: pass --data"):
        export_run(tmp_path / "run", tmp_path / "model2")


def test_metrics_with_a_last_line_cut_short_read_as_a_resume_reads_them(tmp_path):
    """A killed run can leave its last line half written: it is left out; a broken line
    before the last is still an error naming it."""
    from smiexlm.pretraining.plot import read_metrics

    run = tmp_path / "run"
    run.mkdir()
    good = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("\n".join([*good, '{"step": 4, "loss": 0.2']) + "\n")
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    (run / "metrics.jsonl").write_text("\n".join([good[0], '{"step": 2, "lo', good[2]]) + "\n")
    with pytest.raises(DataError, match="line 2: not JSON"):
        read_metrics(run)
