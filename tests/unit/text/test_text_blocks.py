"""Fixed-length text blocks (sample-break-mode none)."""

from __future__ import annotations

import gzip
import itertools

import numpy as np
import pytest

from smiexlm.errors import ConfigError, DataError
from smiexlm.text.blocks import make_blocks, read_lines, text_blocks
from smiexlm.tokenizer import TextTokenizer


@pytest.mark.parametrize("tps", [3, 4, 7, 128])
@pytest.mark.parametrize("frame", ["bos", "bos_eos"])
def test_blocks_partition_the_stream(tps, frame):
    rng = np.random.default_rng(tps)
    docs = [list(rng.integers(5, 100, size=rng.integers(0, 40))) for _ in range(30)]
    stream = list(itertools.chain.from_iterable([*d, 2] for d in docs))
    blocks = list(make_blocks(docs, tps, frame))
    body = tps - 1 if frame == "bos" else tps - 2
    rebuilt = []
    for i, block in enumerate(blocks):
        assert block.dtype == np.uint16 and block[0] == 1 and len(block) <= tps
        inner = block[1:-1] if frame == "bos_eos" else block[1:]
        if frame == "bos_eos":
            assert block[-1] == 2
        if i < len(blocks) - 1:
            assert len(inner) == body  # only the last block is short
        rebuilt.extend(inner.tolist())
    assert rebuilt == stream  # nothing lost, nothing reordered


def test_bad_block_settings():
    with pytest.raises(ConfigError, match="tokens_per_sample"):
        list(make_blocks([[5]], 2))
    with pytest.raises(ConfigError, match="frame"):
        list(make_blocks([[5]], 8, "eos"))


def test_text_blocks_from_files(tmp_path):
    lines = ["first line here", "", "second line", "   ", "third"]
    path = tmp_path / "doc.txt.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    assert list(read_lines(path)) == ["first line here", "second line", "third"]
    tok = TextTokenizer.build(lines * 10, vocab_size=120, min_freq=1)
    blocks = list(text_blocks([path], tok, tokens_per_sample=6, batch_lines=2))
    ids = [i for b in blocks for i in b[1:].tolist()]
    want = [i for text in read_lines(path) for i in [*tok.encode(text, False), 2]]
    assert ids == want
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(DataError, match="line 2"):
        list(read_lines(bad))


def test_dataset_in_the_corpus_shard_format(tmp_path):
    from smiexlm.data.shards import TokenDataset
    from smiexlm.text.blocks import build_text_dataset
    from smiexlm.tokenizer import load_tokenizer

    train, valid = tmp_path / "train.txt", tmp_path / "valid.txt"
    train.write_text("\n".join(f"sentence number {i} is here ." for i in range(60)) + "\n")
    valid.write_text("a held out line .\nand another one .\n")
    tok = TextTokenizer.build(read_lines(train), vocab_size=150, min_freq=1)
    manifest = build_text_dataset(
        [train], [valid], tmp_path / "ds", tok, 16, shard_size=10, progress=False
    )
    ds = TokenDataset(tmp_path / "ds", "train")
    assert len(ds) == manifest["splits"]["train"]["molecules"] > 10  # several shards
    assert len(manifest["splits"]["train"]["shards"]) == -(-len(ds) // 10)
    assert ds.vocab_hash == tok.vocab_hash
    want = list(text_blocks([train], tok, 16))
    assert all(np.array_equal(ds[i], want[i]) for i in range(len(ds)))
    assert load_tokenizer(tmp_path / "ds").vocab_hash == tok.vocab_hash
    assert len(TokenDataset(tmp_path / "ds", "valid")) == len(list(text_blocks([valid], tok, 16)))
    with pytest.raises(DataError, match="already holds"):
        build_text_dataset([train], [], tmp_path / "ds", tok, 16, progress=False)


def test_cli_text_vocab_then_blocks(tmp_path):
    """``smiexlm text vocab`` trains a tokenizer on a corpus, ``smiexlm text blocks`` cuts the
    corpus into blocks with it: the dataset the text configs pretrain on."""
    from typer.testing import CliRunner

    from smiexlm.cli.main import app

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"the cat {i} sat on the mat number {i % 7}" for i in range(300)))
    vocab = tmp_path / "vocab.json"
    made = CliRunner().invoke(app, ["text", "vocab", str(corpus), "--out", str(vocab),
                                    "--vocab-size", "300"])  # fmt: skip
    assert made.exit_code == 0, made.output
    assert "vocabulary of" in made.output and vocab.is_file()
    out = tmp_path / "blocks"
    cut = CliRunner().invoke(app, ["text", "blocks", "--train", str(corpus), "--valid", str(corpus),
                                   "--vocab", str(vocab), "--out", str(out),
                                   "--tokens-per-sample", "32"])  # fmt: skip
    assert cut.exit_code == 0, cut.output
    assert "blocks" in cut.output and (out / "manifest.json").is_file()
