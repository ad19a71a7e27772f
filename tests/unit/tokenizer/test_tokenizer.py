"""The SMILES tokenizer: exactness against DeepChem, round trips, vocabulary files, batches."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smiexlm.data.readers import iter_smiles
from smiexlm.errors import ConfigError, DataError, InvalidSmilesError
from smiexlm.tokenizer import (
    BOS_ID,
    EOS_ID,
    MASK_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    SmilesTokenizer,
)

MOLECULENET_FILES = [
    "bace.csv",
    "bbbp.csv",
    "clintox.csv",
    "esol.csv",
    "freesolv.csv",
    "hiv.csv.gz",
    "lipo.csv",
    "muv.csv.gz",
    "sider.csv",
    "tox21.csv",
    "toxcast.csv.gz",
]


@pytest.fixture(scope="module")
def moleculenet_smiles(shared_data):
    out = []
    for name in MOLECULENET_FILES:
        path = shared_data / "moleculenet" / name
        if not path.is_file():
            pytest.fail(f"shared data file missing: moleculenet/{name}")
        out += [s for s in iter_smiles(path) if s]
    return out


@pytest.fixture(scope="module")
def tok():
    return SmilesTokenizer()


def test_special_ids_are_fixed(tok):
    assert [tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id, tok.unk_id] == [0, 1, 2, 3, 4]
    assert (PAD_ID, BOS_ID, EOS_ID, MASK_ID, UNK_ID) == (0, 1, 2, 3, 4)
    assert tok.tokens[:5] == SPECIAL_TOKENS


def test_identical_to_deepchem_on_all_moleculenet(moleculenet_smiles, tok):
    from deepchem.feat.smiles_tokenizer import BasicSmilesTokenizer

    reference = BasicSmilesTokenizer()
    mismatches = [s for s in moleculenet_smiles if tok.tokenize(s) != reference.tokenize(s)]
    assert len(moleculenet_smiles) == 163_048  # every SMILES of the 11 CSVs was compared
    assert mismatches == []


def test_round_trip_on_all_moleculenet(moleculenet_smiles, tok):
    batch = tok.encode_many(moleculenet_smiles)
    for s, ids in zip(moleculenet_smiles, batch, strict=True):
        assert tok.decode(ids) == s
    # the fast batch path and the exact single path agree id for id
    for s, ids in zip(moleculenet_smiles[::97], batch[::97], strict=True):
        assert tok.encode(s) == ids


@settings(max_examples=400, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from(list("CNOSPFIBrlcnos[]()=#@+-\\/%0123456789.*$:~?>XaZ H")),
        max_size=30,
    )
)
def test_random_strings_round_trip_or_raise(text):
    tok = SmilesTokenizer()
    try:
        ids = tok.encode(text)
    except InvalidSmilesError as err:
        assert err.smiles == text and err.position is not None and 0 <= err.position < len(text)
        with pytest.raises(InvalidSmilesError):
            tok.encode_batch(["C", text])
        return
    assert ids[0] == BOS_ID and ids[-1] == EOS_ID
    if UNK_ID not in ids:
        assert tok.decode(ids) == text
    assert tok.encode_many([text])[0] == ids


def test_unmatched_character_names_position(tok):
    with pytest.raises(InvalidSmilesError, match=r"'CC\[C' at character 2"):
        tok.tokenize("CC[C")
    with pytest.raises(InvalidSmilesError, match="batch item 1"):
        tok.encode_batch(["CCO", "C C"])


def test_unknown_and_special_spelled_tokens_become_unk():
    tok = SmilesTokenizer.build(["CCO"])
    before = tok.n_unk
    assert tok.encode("C[Pt]O") == [BOS_ID, tok.vocab["C"], UNK_ID, tok.vocab["O"], EOS_ID]
    assert tok.encode("[MASK]C")[1] == UNK_ID  # never the real [MASK] id
    assert tok.n_unk == before + 2
    batch = tok.encode_batch(["[MASK]C", "C[Pt]O"])
    assert batch.n_unk == 2 and int((batch.input_ids == MASK_ID).sum()) == 0


def test_encode_batch_padding_and_mask(tok):
    smiles = ["CCO", "c1ccccc1Br", "N"]
    batch = tok.encode_batch(smiles)
    assert batch.input_ids.shape == (3, 11)
    assert batch.attention_mask.sum(1).tolist() == [5, 11, 3]
    for row, mask, s in zip(batch.input_ids, batch.attention_mask, smiles, strict=True):
        assert row[mask].tolist() == tok.encode(s)
        assert (row[~mask] == PAD_ID).all()
    empty = tok.encode_batch([])
    assert empty.input_ids.shape == (0, 0)


def test_truncation_policies(tok):
    with pytest.raises(InvalidSmilesError, match="max_length=4"):
        tok.encode("CCCCC", max_length=4)
    tok.n_truncated = 0
    assert tok.encode("CCCCC", max_length=4, truncation="truncate") == [
        BOS_ID,
        *[tok.vocab["C"]] * 2,
        EOS_ID,
    ]
    batch = tok.encode_batch(["CCCCC", "C"], max_length=4, truncation="truncate")
    assert batch.n_truncated == 1 and batch.input_ids.shape == (2, 4)
    assert tok.n_truncated == 2
    with pytest.raises(DataError, match="truncation='drop'"):
        tok.encode("CCCCC", max_length=4, truncation="drop")


def test_build_save_load_hash(tmp_path):
    tok = SmilesTokenizer.build(["CCO", "CCN", "c1ccccc1Cl", "CCO"], min_freq=2)
    assert tok.tokens == SPECIAL_TOKENS + ["C", "c", "1", "O"]  # by count, then alphabetically
    capped = SmilesTokenizer.build(["CCO", "CCN", "c1ccccc1Cl"], max_size=7)
    assert capped.vocab_size == 7 and capped.tokens[5:] == ["c", "C"]
    path = tok.save(tmp_path / "vocab.json")
    loaded = SmilesTokenizer.load(path)
    assert loaded.tokens == tok.tokens and loaded.vocab_hash == tok.vocab_hash
    assert SmilesTokenizer.load(tmp_path).vocab_hash == tok.vocab_hash  # a folder works too
    assert capped.vocab_hash != tok.vocab_hash
    doc = json.loads(path.read_text())
    doc["tokens"].append("[Pt]")
    path.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="edited or corrupted"):
        SmilesTokenizer.load(path)
    with pytest.raises(DataError, match="does not exist"):
        SmilesTokenizer.load(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="'--min-freq' = 0"):
        SmilesTokenizer.build(["C"], min_freq=0)


def test_vocab_build_checks_its_settings_and_output_before_reading(tmp_path):
    """A bad --min-freq, --max-size or --out is said before the corpus is read, naming the
    option, not the inputs."""
    from typer.testing import CliRunner

    from smiexlm.cli.main import app

    def never():
        raise AssertionError("the corpus was read")
        yield

    from smiexlm.tokenizer.vocab import build_vocabulary

    with pytest.raises(ConfigError, match="'--max-size' = 3"):
        build_vocabulary(never(), max_size=3)
    corpus = tmp_path / "a.smi"
    corpus.write_text("CCO\n")
    (tmp_path / "vdir").mkdir()
    for extra, words in ((["--min-freq", "0"], "'--min-freq' = 0"),
                         (["--out", str(tmp_path / "vdir")], "vdir")):  # fmt: skip
        args = ["vocab", "build", str(corpus), "--out", str(tmp_path / "v.json"), *extra]
        result = CliRunner().invoke(app, args)
        assert result.exit_code != 0 and words in str(result.exception), result.output
        assert "INPUTS" not in str(result.exception)


def test_default_vocabulary_covers_moleculenet(moleculenet_smiles, tok):
    assert tok.coverage(moleculenet_smiles[::50]) == 1.0
    assert 200 <= tok.vocab_size <= 1000
