"""Featurizer: input handling, ordering, batching, normalisation, error policy."""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from smiexlm import ExLMConfig, ExLMModel, Featurizer
from smiexlm.data.sampler import length_batches, token_budget_batches
from smiexlm.errors import ConfigError, DataError, InvalidSmilesError
from smiexlm.paths import ASSETS_DIR
from smiexlm.tokenizer import SmilesTokenizer

EXLM_TWIN = ASSETS_DIR / "twins" / "exlm"
PANEL = [
    "CC(=O)Oc1ccccc1C(=O)O",
    "CN1C=NC2=C1C(=O)N(C(=O)N2C)C",
    "CC(C)Cc1ccc(cc1)C(C)C(=O)O",
    "CC(=O)Nc1ccc(O)cc1",
    "CCO",
    "c1ccccc1",
    "C[C@H](N)C(=O)O",
    "OC[C@H]1OC(O)[C@H](O)[C@@H](O)[C@@H]1O",
    "Clc1ccc(Br)cc1",
    "CCN(CC)CC",
    "O=C([O-])c1ccccc1.[Na+]",
    "N#Cc1ccncc1",
]


def make_checkpoint(directory, objective="mlm", seed=0, **overrides):
    tokenizer = SmilesTokenizer.build(PANEL)
    torch.manual_seed(seed)
    config = ExLMConfig.tiny(
        objective=objective, vocab_size=tokenizer.vocab_size, n_layers=2, **overrides
    )
    ExLMModel(config).save_pretrained(directory, tokenizer=tokenizer)
    return directory


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def feat(checkpoint):
    torch.set_num_threads(1)
    return Featurizer.from_pretrained(checkpoint, device="cpu")


def reference(feat, smiles, pooling="cls", layer=-1):
    """One padded batch straight through the tokenizer and ``model.encode``."""
    batch = feat.tokenizer.encode_batch(smiles)
    with torch.no_grad():
        out = feat.model.encode(batch.input_ids, batch.attention_mask, pooling, layer)
    return out.pooled.numpy()


def test_shape_dtype_and_input_types(feat):
    x = feat.featurize(PANEL)
    assert x.shape == (len(PANEL), feat.dim) and x.dtype == np.float32
    assert np.isfinite(x).all()
    np.testing.assert_array_equal(feat.featurize(tuple(PANEL)), x)
    np.testing.assert_array_equal(feat.featurize(pd.Series(PANEL, index=range(5, 17))), x)
    np.testing.assert_array_equal(feat.featurize(iter(PANEL)), x)


def test_empty_input(feat):
    assert feat.featurize([]).shape == (0, feat.dim)
    assert feat.featurize(pd.Series([], dtype=object)).shape == (0, feat.dim)


def test_single_string_is_rejected(feat):
    for one in ("CCO", np.array("CCO"), b"CCO"):
        with pytest.raises(DataError, match="wrap it in a list"):
            feat.featurize(one)
    for table in ({"CCO": 1}, pd.DataFrame({"smiles": ["CCO"]}), np.array([["CCO"]])):
        with pytest.raises(DataError, match="pass its SMILES column"):
            feat.featurize(table)
    for other in (5, None):
        with pytest.raises(DataError, match="expects a sequence of SMILES"):
            feat.featurize(other)
    assert feat.featurize(iter(["CCO"])).shape == (1, feat.dim)


@pytest.mark.parametrize("pooling", ["cls", "mean", "max"])
@pytest.mark.parametrize("layer", [0, -1])
def test_matches_direct_model_encode(feat, pooling, layer):
    canonical = feat.prepare(PANEL)  # normalised ids, to feed the reference the same text
    texts = [feat.tokenizer.decode(ids) for ids in canonical[0]]
    got = feat.featurize(PANEL, pooling=pooling, layer=layer)
    np.testing.assert_allclose(got, reference(feat, texts, pooling, layer), atol=2e-5)


def test_several_layers_are_the_blocks_side_by_side(feat):
    canonical = feat.prepare(PANEL)
    texts = [feat.tokenizer.decode(ids) for ids in canonical[0]]
    got = feat.featurize(PANEL, pooling="cls+mean", layer=(-1, 0))
    expected = np.hstack([reference(feat, texts, "cls+mean", x) for x in (-1, 0)])
    assert got.shape == (len(PANEL), 2 * feat.width("cls+mean"))
    np.testing.assert_allclose(got, expected, atol=2e-5)


def test_input_order_is_kept(feat):
    x = feat.featurize(PANEL)
    rev = feat.featurize(PANEL[::-1])
    np.testing.assert_allclose(rev[::-1], x, atol=2e-5)
    alone = np.stack([feat.featurize([s])[0] for s in PANEL])
    np.testing.assert_allclose(alone, x, atol=2e-5)


def test_batching_and_chunking_do_not_change_results(feat):
    x = feat.featurize(PANEL)
    np.testing.assert_allclose(feat.featurize(PANEL, batch_tokens=1), x, atol=2e-5)
    np.testing.assert_allclose(feat.featurize(PANEL, batch_size=3), x, atol=2e-5)
    np.testing.assert_allclose(feat.featurize(PANEL, chunk_size=5), x, atol=2e-5)


def test_deterministic(feat):
    a = feat.featurize(PANEL * 3)
    feat.model.train()  # dropout on: featurize must switch it off again
    b = feat.featurize(PANEL * 3)
    assert not feat.model.training
    np.testing.assert_array_equal(a, b)


def test_canonicalization_default_and_opt_out(feat):
    x = feat.featurize(["CCO", "OCC", "C(O)C"])
    np.testing.assert_allclose(x[1], x[0], atol=2e-5)
    np.testing.assert_allclose(x[2], x[0], atol=2e-5)
    raw = feat.featurize(["CCO", "OCC"], canonicalize=False)
    assert not np.allclose(raw[0], raw[1])
    assert feat.last_report.n_changed_by_normalization == 0


def test_normalization_record_is_applied(tmp_path):
    ckpt = make_checkpoint(tmp_path / "salts")
    plain = Featurizer.from_pretrained(ckpt, device="cpu")
    (ckpt / "normalization.json").write_text(json.dumps({"strip_salts": True}))
    stripped = Featurizer.from_pretrained(ckpt, device="cpu")
    assert stripped.normalization.strip_salts and stripped.normalization.canonicalize
    salt, acid = "O=C([O-])c1ccccc1.[Na+]", "O=C([O-])c1ccccc1"
    x = stripped.featurize([salt, acid])
    np.testing.assert_allclose(x[0], x[1], atol=2e-5)
    y = plain.featurize([salt, acid])
    assert not np.allclose(y[0], y[1])
    (ckpt / "normalization.json").unlink()
    card = "# Card\n\n```json normalization\n" + json.dumps({"canonicalize": False}) + "\n```\n"
    (ckpt / "MODEL_CARD.md").write_text(card)
    as_written = Featurizer.from_pretrained(ckpt, device="cpu")
    assert as_written.normalization.canonicalize is False
    z = as_written.featurize(["CCO", "OCC"])
    assert not np.allclose(z[0], z[1])
    (ckpt / "normalization.json").write_text(json.dumps({"canonicalize": "yes"}))
    with pytest.raises(ConfigError, match="canonicalize"):
        Featurizer.from_pretrained(ckpt, device="cpu")


def test_the_folder_pooling_is_the_default_and_travels_to_embed_and_probe(tmp_path):
    from smiexlm.embedding.embed import EmbedOptions
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.modelio.records import write_embedding

    ckpt = make_checkpoint(tmp_path / "pooled")
    assert Featurizer.from_pretrained(ckpt, device="cpu").pooling == "cls"  # no embedding.json
    assert EmbedOptions(checkpoint=ckpt).settings()["pooling"] == "cls"
    write_embedding(ckpt, "mean")
    feat = Featurizer.from_pretrained(ckpt, device="cpu")
    assert feat.pooling == "mean" and Backbone(ckpt).pooling == "mean"
    np.testing.assert_array_equal(feat.featurize(PANEL), feat.featurize(PANEL, pooling="mean"))
    assert not np.allclose(feat.featurize(PANEL), feat.featurize(PANEL, pooling="cls"))
    assert EmbedOptions(checkpoint=ckpt).settings()["pooling"] == "mean"
    assert EmbedOptions(checkpoint=ckpt, pooling="max").settings()["pooling"] == "max"
    (ckpt / "embedding.json").write_text(json.dumps({"pooling": "sum"}))
    with pytest.raises(ConfigError, match="pooling.*embedding.json.*'sum'"):
        Featurizer.from_pretrained(ckpt, device="cpu")
    (ckpt / "embedding.json").write_text("[1, 2]")
    with pytest.raises(DataError, match="embedding.json.*JSON object"):
        Featurizer.from_pretrained(ckpt, device="cpu")
    with pytest.raises(ConfigError, match="pooling"):
        write_embedding(ckpt, "first")


def test_errors_raise_names_first_bad_input_and_index(feat):
    with pytest.raises(InvalidSmilesError, match=r"C1CC.*input index 2"):
        feat.featurize(["CCO", "c1ccccc1", "C1CC", "xyz"])
    with pytest.raises(InvalidSmilesError, match="input index 1"):
        feat.featurize(["CCO", "C C"], canonicalize=False)
    with pytest.raises(InvalidSmilesError, match=r"input index 0.*untokenizable"):
        feat.featurize(["C&C"], canonicalize=False)


def test_errors_nan_fills_rows_and_reports(feat, caplog):
    bad = ["CCO", "C1CC", None, "", "c1ccccc1", float("nan"), "C&C"]
    with caplog.at_level(logging.WARNING, logger="smiexlm.embedding.featurizer"):
        x = feat.featurize(bad, errors="nan")
    assert x.shape == (7, feat.dim)
    nan_rows = np.isnan(x).all(axis=1)
    assert nan_rows.tolist() == [False, True, True, True, False, True, True]
    assert np.isfinite(x[~nan_rows]).all()
    report = feat.last_report
    assert report.n_failed == 5 and report.n_inputs == 7
    assert [i for i, _, _ in report.failed] == [1, 2, 3, 5, 6]
    assert "5 of 7 SMILES" in caplog.text and "'C1CC'" in caplog.text
    np.testing.assert_allclose(x[[0, 4]], feat.featurize(["CCO", "c1ccccc1"]), atol=2e-5)


def test_iter_featurize_streams_chunks_lazily_and_equals_featurize(feat, caplog):
    bad = ["CCO", "C1CC", *PANEL, "C&C"]
    read = []

    def lines():  # a file read line by line: how far the featurizer has read is recorded
        for i, smiles in enumerate(bad):
            read.append(i)
            yield smiles

    stream = feat.iter_featurize(lines(), errors="nan", chunk_size=4)
    assert read == []  # nothing read before the first chunk is asked for
    first = next(stream)
    assert first.shape == (4, feat.dim) and read == [0, 1, 2, 3]  # that chunk, no further
    with caplog.at_level(logging.WARNING, logger="smiexlm.embedding.featurizer"):
        rest = list(stream)
    sizes = [len(c) for c in rest]
    assert sum(sizes) == len(bad) - 4 and all(n == 4 for n in sizes[:-1])
    got = np.vstack([first, *rest])
    report = feat.last_report
    assert report.n_inputs == len(bad) and [i for i, _, _ in report.failed] == [1, len(bad) - 1]
    assert f"2 of {len(bad)} SMILES" in caplog.text  # logged once the stream is exhausted
    np.testing.assert_array_equal(np.isnan(got), np.isnan(feat.featurize(bad, errors="nan")))
    np.testing.assert_allclose(got, feat.featurize(bad, errors="nan", chunk_size=4), atol=2e-5)
    assert list(feat.iter_featurize([])) == []


def test_iter_featurize_refuses_bad_options_before_reading(feat):
    never = iter(["CCO"])
    for option, value in (("chunk_size", 0), ("pooling", "sum"), ("batch_tokens", 0)):
        with pytest.raises(ConfigError, match=option):
            feat.iter_featurize(never, **{option: value})
    assert next(never) == "CCO"  # nothing was read
    with pytest.raises(DataError, match="wrap it in a list"):
        feat.iter_featurize("CCO")
    with pytest.raises(InvalidSmilesError, match="input index 1"):  # raised at its chunk
        list(feat.iter_featurize(["CCO", "C1CC"]))


def test_too_long_for_the_model(tmp_path):
    ckpt = make_checkpoint(tmp_path / "short", max_positions=8)
    feat = Featurizer.from_pretrained(ckpt, device="cpu")
    x = feat.featurize(["CCO", "CCCCCCCCCCCC"], errors="nan")
    assert np.isnan(x[1]).all() and "exceed" in feat.last_report.failed[0][2]


def test_unknown_tokens_are_counted(feat):
    feat.featurize(["CC[Se]C"], canonicalize=False)
    assert feat.last_report.n_unk_tokens == 1


def test_bad_options(feat):
    with pytest.raises(ConfigError, match="pooling"):
        feat.featurize(["CCO"], pooling="sum")
    with pytest.raises(ConfigError, match="errors"):
        feat.featurize(["CCO"], errors="ignore")
    for layer in (5, (-1, -1), (), ("a",), 1.5):
        with pytest.raises(ConfigError, match="layer"):
            feat.featurize(["CCO"], layer=layer)
    with pytest.raises(ConfigError, match="batch_tokens"):
        feat.featurize(["CCO"], batch_tokens=0)
    for name in ("canonicalize", "progress"):  # a word is not a switch: "no" would be truthy
        with pytest.raises(ConfigError, match=f"'{name}' = 'no': expected True or False"):
            feat.featurize(["CCO"], **{name: "no"})
    assert feat.featurize(["CCO"], batch_tokens=np.int64(64), batch_size=np.int32(2)).shape[0] == 1
    with pytest.raises(ConfigError, match="'checkpoint' = 3"):
        Featurizer.from_pretrained(3)  # type: ignore[arg-type]
    from smiexlm.modelio.pretrained import Pretrained

    with pytest.raises(ConfigError, match="device"):
        Featurizer(Pretrained(feat.model, feat.tokenizer), device="tpu")


def test_default_model_missing_is_a_clear_error(monkeypatch, tmp_path):
    import smiexlm.modelio.layout as module

    monkeypatch.setattr(module, "DEFAULT_MODEL_DIR", tmp_path / "default_model")
    with pytest.raises(DataError, match="default model is not installed"):
        Featurizer.from_pretrained()


def test_default_model_loads_when_installed(monkeypatch, checkpoint):
    import smiexlm.modelio.layout as module

    monkeypatch.setattr(module, "DEFAULT_MODEL_DIR", checkpoint)
    assert Featurizer.from_pretrained(device="cpu").featurize(["CCO"]).shape == (1, 128)


@pytest.mark.parametrize("objective", ["exlm", "maelm"])
def test_other_objectives_and_fp16_weights(tmp_path, objective):
    ckpt = make_checkpoint(tmp_path / objective, objective=objective)
    model = ExLMModel.from_pretrained(ckpt)
    model.save_pretrained(tmp_path / "fp16", tokenizer=SmilesTokenizer.load(ckpt), dtype=torch.half)
    feat = Featurizer.from_pretrained(tmp_path / "fp16", device="cpu")
    x = feat.featurize(PANEL)
    assert x.shape == (len(PANEL), 128) and np.isfinite(x).all()
    np.testing.assert_allclose(feat.featurize(PANEL[::-1])[::-1], x, atol=2e-5)


# sorted molecule lengths, a token budget and a batch cap, as the samplers take them
BATCHING_CASES = given(
    lengths=st.lists(st.integers(1, 60), max_size=80).map(sorted),
    budget=st.integers(1, 500),
    cap=st.one_of(st.none(), st.integers(1, 10)),
)


@settings(max_examples=200, deadline=None)
@BATCHING_CASES
def test_token_budget_batches(lengths, budget, cap):
    batches = token_budget_batches(lengths, budget, cap)
    assert [i for b in batches for i in b] == list(range(len(lengths)))
    for b in batches:
        assert b
        if len(b) > 1:
            assert len(b) * max(lengths[i] for i in b) <= budget
        if cap is not None:
            assert len(b) <= cap
    # greedy: the next molecule would not have fit into the previous batch
    for prev, nxt in zip(batches, batches[1:], strict=False):
        grown = [*prev, nxt[0]]
        width = max(lengths[i] for i in grown)
        assert width * len(grown) > budget or (cap is not None and len(prev) >= cap)


@settings(max_examples=200, deadline=None)
@BATCHING_CASES
def test_length_batches_hold_one_length_each_within_the_budget(lengths, budget, cap):
    batches = length_batches(lengths, budget, cap)
    assert [i for b in batches for i in b] == list(range(len(lengths)))
    for b in batches:
        assert b and len({lengths[i] for i in b}) == 1  # no padding
        assert len(b) == 1 or len(b) * lengths[b[0]] <= budget
        assert cap is None or len(b) <= cap
    # as few as the budget allows: two batches of one length cannot be merged
    for prev, nxt in zip(batches, batches[1:], strict=False):
        if lengths[prev[0]] == lengths[nxt[0]]:
            grown = len(prev) + 1
            assert grown * lengths[prev[0]] > budget or (cap is not None and len(prev) >= cap)


# The shipped pure ExLM's embeddings (twins/exlm, the default until the descriptor model
# replaced it) of four molecules (first four dimensions, and the sum of absolute values of
# all), recorded before the input path was rebuilt: a refactor of the loader, normalisation,
# tokenization, padding or batching must give them back.
PINNED_EMBEDDINGS = {
    "cls": ([[-0.674712, 0.272243, 0.226405, 0.097645], [-0.47673, 0.232884, 0.129041, 0.99592],
             [-0.665839, 0.104775, 0.149046, 0.141134], [-0.185453, -0.167707, 0.57056, 0.499078]],
            395.6671),
    "mean": ([[-0.273119, 0.74356, -0.587125, 1.236984], [-0.429646, 0.130923, -0.079085, 1.485097],
              [-0.100702, 0.88242, -0.30878, 0.636752], [-0.346834, -0.268283, -0.26928, 0.211814]],
             309.3219),
}  # fmt: skip


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_shipped_model_embeddings_are_pinned(pooling):
    smiles = ["CC(=O)Oc1ccccc1C(=O)O", "OCC", "Cn1cnc2c1c(=O)n(C)c(=O)n2C", "c1ccccc1CCN"]
    x = Featurizer.from_pretrained(EXLM_TWIN, device="cpu").featurize(smiles, pooling=pooling)
    head, total = PINNED_EMBEDDINGS[pooling]
    np.testing.assert_allclose(x[:, :4], np.array(head), atol=1e-5, rtol=0)
    assert float(np.abs(x).sum()) == pytest.approx(total, abs=1e-2)
