"""TextTokenizer: same interface as SmilesTokenizer, round trips, files, pairs."""

from __future__ import annotations

import json

import pytest
import torch

from smiexlm.errors import DataError
from smiexlm.tokenizer import SPECIAL_TOKENS, SmilesTokenizer, TextTokenizer, load_tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A journey of a thousand miles begins with a single step.",
    "To be, or not to be, that is the question.",
    "All the world's a stage, and all the men and women merely players.",
    "The fox and the dog became friends over the years.",
] * 20


@pytest.fixture(scope="module")
def bpe() -> TextTokenizer:
    return TextTokenizer.build(CORPUS, vocab_size=300, min_freq=1)


def test_special_ids_and_interface(bpe):
    assert bpe.tokens[:5] == SPECIAL_TOKENS
    assert (bpe.pad_id, bpe.bos_id, bpe.eos_id, bpe.mask_id, bpe.unk_id) == (0, 1, 2, 3, 4)
    assert bpe.vocab_size == len(bpe.vocab) == len(bpe) <= 300
    for name in ("build", "save", "load", "tokenize", "encode", "decode", "encode_batch"):
        assert callable(getattr(bpe, name)) and callable(getattr(SmilesTokenizer, name))


@pytest.mark.parametrize(
    "text", ["The fox jumps.", "  Unseen wörds: naïve café, 42 × 7 = 294!  ", "emoji 🧪 ok", ""]
)
def test_byte_level_round_trip(bpe, text):
    ids = bpe.encode(text)
    assert ids[0] == 1 and ids[-1] == 2
    assert bpe.decode(ids) == text
    assert 4 not in ids  # byte-level BPE never needs [UNK]


def test_special_tokens_spelled_in_text_are_plain_text(bpe):
    ids = bpe.encode("the [MASK] and [PAD]", add_special_tokens=False)
    assert not set(ids) & {0, 1, 2, 3, 4}
    assert bpe.decode([1, 3, *bpe.encode("fox", False), 2], skip_special_tokens=False) == (
        "[BOS][MASK]fox[EOS]"
    )


def test_save_load_and_hash(bpe, tmp_path):
    path = bpe.save(tmp_path / "vocab.json")
    again = TextTokenizer.load(tmp_path)  # a folder resolves to vocab.json
    assert again.vocab_hash == bpe.vocab_hash and again.content_hash == bpe.content_hash
    assert again.encode(CORPUS[0]) == bpe.encode(CORPUS[0])
    doc = json.loads(path.read_text())
    assert doc["tokens"] == bpe.tokens and doc["hash"] == bpe.vocab_hash
    assert isinstance(load_tokenizer(tmp_path), TextTokenizer)
    other = TextTokenizer.build(CORPUS[:3], vocab_size=280, min_freq=1)
    assert other.vocab_hash != bpe.vocab_hash
    # tampering with the definition or the token list is detected
    doc["tokenizer"]["model"]["merges"] = doc["tokenizer"]["model"]["merges"][:-1]
    path.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="content hash"):
        TextTokenizer.load(path)


def test_load_tokenizer_dispatches_to_smiles(tmp_path):
    smiles = SmilesTokenizer.build(["CCO", "c1ccccc1"])
    smiles.save(tmp_path / "vocab.json")
    assert isinstance(load_tokenizer(tmp_path / "vocab.json"), SmilesTokenizer)


def test_pair_encoding_roberta_layout(bpe):
    a, b = bpe.encode("The fox.", False), bpe.encode("The dog.", False)
    assert bpe.encode_pair("The fox.", "The dog.") == [1, *a, 2, 2, *b, 2]
    long_a = " ".join(["fox"] * 40)
    ids = bpe.encode_pair(long_a, "The dog.", max_length=16, truncation="truncate")
    assert len(ids) == 16 and ids[-len(b) - 1 :] == [*b, 2]  # the longer segment was cut
    with pytest.raises(DataError, match="max_length=16"):
        bpe.encode_pair(long_a, "The dog.", max_length=16)
    batch = bpe.encode_pair_batch(
        ["The fox.", long_a], ["The dog.", "x"], max_length=12, truncation="truncate"
    )
    assert batch.input_ids.shape == (2, 12) and batch.n_truncated == 1
    assert batch.attention_mask[0].sum() == len(a) + len(b) + 4


def test_encode_batch_matches_encode(bpe):
    texts = ["The fox.", "A journey of a thousand miles", "x"]
    batch = bpe.encode_batch(texts)
    assert batch.input_ids.dtype == torch.long and batch.attention_mask.dtype == torch.bool
    for row, mask, text in zip(batch.input_ids, batch.attention_mask, texts, strict=True):
        assert row[mask].tolist() == bpe.encode(text)
        assert (row[~mask] == 0).all()
    cut = bpe.encode_batch(texts, max_length=4, truncation="truncate")
    assert cut.input_ids.shape[1] == 4 and cut.n_truncated == 2 and cut.input_ids[0, -1] == 2
    with pytest.raises(DataError):
        bpe.encode_batch(texts, max_length=4)


def test_wordpiece_counts_unknowns():
    wp = TextTokenizer.build(CORPUS, vocab_size=200, min_freq=1, kind="wordpiece")
    assert wp.tokens[:5] == SPECIAL_TOKENS
    assert wp.decode(wp.encode("The quick fox")) == "the quick fox"
    batch = wp.encode_batch(["the fox ☃"])
    assert batch.n_unk == 1 and 4 in batch.input_ids[0].tolist()


def test_gpt2_files_are_remapped(bpe, tmp_path):
    # Write a GPT-2-style vocab.json/merges.txt (own specials, different ids) from `bpe`.
    spec = json.loads(bpe.save(tmp_path / "ours.json").read_text())["tokenizer"]["model"]
    foreign = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for token in bpe.tokens[5:]:
        foreign[token] = len(foreign)
    foreign["<mask>"] = len(foreign)
    (tmp_path / "vocab.json").write_text(json.dumps(foreign))
    merges = ["#version: 0.2"] + [" ".join(m) if isinstance(m, list) else m for m in spec["merges"]]
    (tmp_path / "merges.txt").write_text("\n".join(merges) + "\n")
    gpt2 = TextTokenizer.from_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert gpt2.kind == "gpt2" and gpt2.tokens == bpe.tokens
    assert gpt2.encode(CORPUS[2]) == bpe.encode(CORPUS[2])
    with pytest.raises(DataError, match="does not exist"):
        TextTokenizer.from_gpt2_files(tmp_path / "nope.json", tmp_path / "merges.txt")
