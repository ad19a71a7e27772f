"""Every ``smiexlm analyze`` command through the real CLI on tiny models and data subsets."""

from __future__ import annotations

import csv
import gzip
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from smiexlm.cli.main import app
from tests.conftest import require_file

PNG = b"\x89PNG\r\n\x1a\n"
MICRO = dict(n_layers=2, n_heads=2, d_model=32, d_ff=64, n_transition_heads=2)
MICRO_SET = [f"model.{k}={v}" for k, v in MICRO.items()] + [
    "model.dropout=0.0", "model.attention_dropout=0.0", "max_tokens=512", "warmup_steps=1",
    "log_every=1", "valid_every=1000", "valid_batches=1", "save_every=1000", "num_threads=1",
    "progress=false",
]  # fmt: skip


def _run(*args: str):
    result = CliRunner().invoke(app, ["analyze", *args], catch_exceptions=True)
    return result


def _rows(path):
    with open(path) as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def setup(shared_data, tmp_path_factory):
    from smiexlm import ExLMConfig, ExLMModel
    from smiexlm.data.pipeline import PreprocessConfig, preprocess
    from smiexlm.tokenizer import SmilesTokenizer

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("analysis")
    source = require_file(shared_data, "pretrain/moses_test.smi.gz")
    with gzip.open(source, "rt") as handle:
        smiles = [next(handle).strip() for _ in range(240)]
    raw = root / "mols.smi"
    raw.write_text("\n".join(smiles) + "\n")
    held_out = root / "held_out.smi"
    held_out.write_text("\n".join(smiles[-40:]) + "\n")
    tokenizer = SmilesTokenizer.build(smiles)
    tokenizer.save(root / "vocab.json")
    preprocess([raw], root / "ds", PreprocessConfig(valid_fraction=0.1), vocab=root / "vocab.json",
               progress=False)  # fmt: skip
    checkpoints = {}
    for objective in ("mlm", "exlm"):
        torch.manual_seed(0)
        cfg = ExLMConfig.tiny(vocab_size=tokenizer.vocab_size, objective=objective, k=2,
                              vocab_hash=tokenizer.vocab_hash, **MICRO)  # fmt: skip
        checkpoints[objective] = ExLMModel(cfg).save_pretrained(
            root / objective, tokenizer=tokenizer
        )
    return {"root": root, "data": root / "ds", "smiles": held_out, "ckpt": checkpoints,
            "first": smiles[0], "tokenizer": tokenizer}  # fmt: skip


def test_entropy_command(setup, tmp_path):
    ck = setup["ckpt"]
    out = tmp_path / "entropy"
    result = _run("entropy", str(ck["mlm"]), str(ck["exlm"]), "--smiles-file", str(setup["smiles"]),
                  "--mask-ratios", "0.15", "0.5", "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = _rows(out / "entropy.csv")
    assert [(r["objective"], float(r["mask_ratio"])) for r in rows] == [
        ("mlm", 0.15), ("mlm", 0.5), ("exlm", 0.15), ("exlm", 0.5)
    ]  # fmt: skip
    for r in rows:  # random init: near-uniform predictions, never above log2 V
        assert 0.0 < float(r["entropy_bits"]) <= float(r["max_bits"]) + 1e-9
        assert 0.0 < float(r["entropy_bits_path"]) <= float(r["max_bits"]) + 1e-9
        assert int(r["n_tokens"]) > 0
        if r["objective"] == "mlm":  # every [MASK] emits: the path weights are all 1
            assert float(r["entropy_bits_path"]) == pytest.approx(float(r["entropy_bits"]))
    n = {float(r["mask_ratio"]): int(r["n_tokens"]) for r in rows if r["objective"] == "mlm"}
    assert n[0.5] > 2 * n[0.15]
    doc = json.loads((out / "entropy.json").read_text())
    assert set(doc["table"]) == {"mlm", "exlm"}
    assert (out / "entropy.png").read_bytes()[:8] == PNG


def test_unreadable_smiles_are_left_out_and_listed_and_models_without_tokens_refused(
    setup, tmp_path
):
    from smiexlm import ExLMConfig, ExLMModel
    from tests.cli.test_glue_cli import make_tiny_text_model

    ck, tokenizer = setup["ckpt"], setup["tokenizer"]
    held_out = setup["smiles"].read_text().split()
    mixed = tmp_path / "mixed.smi"
    mixed.write_text("\n".join(held_out[:3] + ["XYZ"] + held_out[3:6]) + "\n")
    out = tmp_path / "entropy"
    result = _run("entropy", str(ck["mlm"]), "--smiles-file", str(mixed), "--mask-ratios", "0.5",
                  "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "1 of 7 SMILES left out" in result.output
    (reject,) = _rows(out / "rejects.csv")
    assert (reject["row"], reject["smiles"]) == ("3", "XYZ") and "pattern" in reject["reason"]
    assert json.loads((out / "entropy.json").read_text())["settings"]["n_molecules"] == 6
    bad = tmp_path / "bad.smi"
    bad.write_text("XYZ\n")
    result = _run("rank", str(ck["mlm"]), "--smiles-file", str(bad), "--out", str(tmp_path / "r"))
    assert "the tokenizer reads none of its SMILES" in str(result.exception)
    assert not (tmp_path / "r").exists()

    cfg = ExLMConfig.tiny(vocab_size=tokenizer.vocab_size, objective="mtr", n_descriptors=3,
                          vocab_hash=tokenizer.vocab_hash, **MICRO)  # fmt: skip
    mtr = ExLMModel(cfg).save_pretrained(tmp_path / "mtr", tokenizer=tokenizer)
    text = make_tiny_text_model(tmp_path / "text")
    refused = (("entropy", mtr, "regresses descriptors"), ("entropy", text, "reads text"),
               ("rank", text, "reads text"))  # fmt: skip
    for n, (command, folder, words) in enumerate(refused):
        result = _run(command, str(ck["mlm"]), str(folder), "--smiles-file", str(mixed),
                      "--out", str(tmp_path / f"refused{n}"))  # fmt: skip
        assert words in str(result.exception) and str(folder) in str(result.exception)
        assert not (tmp_path / f"refused{n}").exists()  # refused before anything is written


def test_bad_sizes_an_empty_smiles_and_a_folder_named_twice_are_refused(setup, tmp_path):
    from smiexlm.errors import ConfigError

    ck, held_out = setup["ckpt"], str(setup["smiles"])
    for args, words in (
        (["entropy", str(ck["mlm"]), "--batch-size", "0", "--smiles-file", held_out],
         "--batch-size"),
        (["rank", str(ck["mlm"]), "--max-molecules", "0", "--smiles-file", held_out],
         "--max-molecules"),
        (["dag", str(ck["exlm"]), "--smiles", "CCO", "--mask", "1", "--top", "0"], "--top"),
    ):  # fmt: skip
        result = _run(*args, "--out", str(tmp_path / "o"))
        assert result.exit_code == 2 and words in result.output
    for args, words in (
        (["dag", str(ck["exlm"]), "--smiles", "", "--mask", "1"], "at least one token"),
        (["dag", str(ck["exlm"]), "--smiles", "CCO", "--mask", "1", "1"], "each named once"),
        (["entropy", str(ck["mlm"]), str(ck["mlm"]) + "/", "--smiles-file", held_out],
         "each folder named once"),
    ):  # fmt: skip
        result = _run(*args, "--out", str(tmp_path / "o"))
        assert isinstance(result.exception, ConfigError) and words in str(result.exception)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("k", [1, 3])
def test_exlm_path_weights_are_state_probabilities(k):
    from smiexlm import ExLMConfig, ExLMModel
    from smiexlm.analysis.entropy import masked_entropies
    from smiexlm.model.masking import mask_tokens

    torch.manual_seed(0)
    model = ExLMModel(ExLMConfig.tiny(vocab_size=40, objective="exlm", k=k, **MICRO)).eval()
    lengths = torch.tensor([12, 9, 15])
    mask = torch.arange(15)[None, :] < lengths[:, None]
    ids = torch.where(mask, torch.randint(5, 40, mask.shape), 0)
    ids[:, 0], ids[torch.arange(3), lengths - 1] = 1, 2
    masked, labels = mask_tokens(ids, mask, 0.3, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        h, on_path = masked_entropies(model, masked, mask, labels)
    n = int((masked == 3).sum())
    assert h.shape == on_path.shape == (n, k)
    if k == 1:  # one state per token: the path visits every state
        torch.testing.assert_close(on_path, torch.ones_like(on_path), rtol=0, atol=1e-5)
    else:  # probabilities; the path takes about one state per masked token
        assert bool(((on_path >= 0) & (on_path <= 1 + 1e-9)).all())
        assert 0.5 * n < float(on_path.sum()) < 1.5 * n


def test_rank_command(setup, tmp_path):
    ck = setup["ckpt"]
    out = tmp_path / "rank"
    result = _run("rank", str(ck["mlm"]), str(ck["exlm"]), "--smiles-file", str(setup["smiles"]),
                  "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = _rows(out / "rank.csv")
    assert [(r["objective"], int(r["layer"])) for r in rows] == [
        ("mlm", 1), ("mlm", 2), ("exlm", 1), ("exlm", 2)
    ]  # fmt: skip
    for r in rows:
        for col in ("with_mask", "without_mask", "mask_only"):
            assert 1 <= int(r[col]) <= 32
        assert int(r["n_mask_rows"]) > 0
    assert (out / "rank.png").read_bytes()[:8] == PNG


def test_rank_matches_a_direct_computation(setup):
    from smiexlm.analysis import inputs
    from smiexlm.analysis.measures import effective_rank
    from smiexlm.analysis.rank import rank_by_layer
    from smiexlm.data.pipeline import read_smiles

    smiles = read_smiles(setup["smiles"], 20)
    result = rank_by_layer([setup["ckpt"]["mlm"]], smiles, progress=False)
    model, tok = inputs.load_model_and_tokenizer(setup["ckpt"]["mlm"])
    ids, mask = inputs.encode(tok, smiles, 256)
    with torch.no_grad():
        h = model.encode(ids, mask, layer=1).hidden_states[mask]
    assert result.rows[1]["without_mask"] == effective_rank(h, 0.9)


def test_dag_command(setup, tmp_path):
    ck = setup["ckpt"]
    out = tmp_path / "dag"
    tokens = setup["tokenizer"].tokenize(setup["first"])
    result = _run("dag", str(ck["exlm"]), "--smiles", setup["first"], "--mask", "2", "5",
                  "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads((out / "dag.json").read_text())
    s = len(doc["states"])
    assert s == 2 * 4  # k = 2 states for BOS, two masks, EOS
    assert doc["viterbi_path"][0] == 0 and doc["viterbi_path"][-1] == s - 1
    assert doc["viterbi_tokens"] == ["[BOS]", tokens[2], tokens[5], "[EOS]"]
    trans = torch.tensor(doc["transitions"])
    assert torch.allclose(trans[:-1].sum(1), torch.ones(s - 1), atol=1e-5)  # rows are distributions
    assert torch.all(trans.tril() == 0)  # edges only go forward
    assert math.isfinite(doc["log_likelihood"]) and doc["log_likelihood"] < 0
    assert len(_rows(out / "dag_states.csv")) == s
    assert (out / "dag.png").read_bytes()[:8] == PNG
    bad = _run("dag", str(ck["mlm"]), "--smiles", setup["first"], "--mask", "1", "--out", str(out))
    assert bad.exit_code != 0 and "exlm" in str(bad.exception)


@pytest.mark.slow
def test_repeated_mlm_command(setup, tmp_path):
    out = tmp_path / "rmlm"
    args = ["repeated-mlm", "--data", str(setup["data"]), "--out", str(out),
            "--k", "1", "2", "--p", "0.15,0.5", "--min-ratio", "0.05", "--steps", "3", "--eval-molecules", "24",
            "--bbbp-rows", "160", "--bbbp-epochs", "1", "--bbbp-max-steps", "2", "--device", "cpu",
            "--set", *MICRO_SET]  # fmt: skip
    result = _run(*args)
    assert result.exit_code == 0, result.output
    rows = _rows(out / "repeated_mlm.csv")
    # (k=2, p=0.15) has p^k = 0.0225 < --min-ratio: a blank cell, as in the paper's grid.
    assert [(int(r["k"]), float(r["p"])) for r in rows] == [(1, 0.15), (1, 0.5), (2, 0.5)]
    for r in rows:
        k, p = int(r["k"]), float(r["p"])
        assert float(r["expected_corrupted"]) == pytest.approx(p**k)
        if k == 1:  # every masked token is fully masked
            assert 0 < float(r["measured_corrupted"]) <= 1
        n = int(r["n_tokens"])
        sigma = math.sqrt(p**k * (1 - p**k) / n)
        assert abs(float(r["measured_corrupted"]) - p**k) <= 5 * sigma + 2 / 24
        assert float(r["entropy_bits"]) > 0
        assert 0 <= float(r["bbbp_test_auc"]) <= 100
    doc = json.loads((out / "repeated_mlm.json").read_text())
    assert set(doc["figure5_entropy_bits"]) == {"1", "2"}
    assert "0.15" not in doc["figure5_entropy_bits"]["2"]
    assert set(doc["findings"]["entropy_bits"]) == {
        "spread_at_equal_corruption", "spread_at_equal_mask_ratio"
    }  # fmt: skip
    assert (out / "repeated_mlm.png").read_bytes()[:8] == PNG
    assert not (out / "cells" / "k2_p0.5" / "data").exists()  # repeated data removed
    assert (out / "cells" / "k2_p0.5" / "run" / "checkpoints" / "last" / "config.json").is_file()

    # a finished cell is refused without --resume, read back with it (nothing trained), and
    # refused, naming the setting, when the grid asks for other settings
    again = _run(*args)
    assert "holds the finished cell k=1 p=0.15" in str(again.exception)
    first = (out / "repeated_mlm.csv").read_text()
    weights = out / "cells" / "k1_p0.15" / "run" / "checkpoints" / "last" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    resumed = _run(*args, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert (out / "repeated_mlm.csv").read_text() == first
    assert weights.stat().st_mtime_ns == stamp
    changed = _run(*[a if a != "3" else "4" for a in args], "--resume")
    assert "was made with steps = 3, but this grid asks for steps = 4" in str(changed.exception)
