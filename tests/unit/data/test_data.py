"""Corpus pipeline: formats, determinism, accounting, rejects, resume after SIGKILL, readers."""

from __future__ import annotations

import csv
import gzip
import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from smiexlm.data import (
    HashSet64,
    PreprocessConfig,
    TokenBudgetSampler,
    TokenDataset,
    collate,
    preprocess,
)
from smiexlm.errors import DataError, VocabularyMismatchError
from smiexlm.tokenizer import SmilesTokenizer
from smiexlm.tokenizer.fast import ChunkEncoder
from tests.conftest import kill_after_two_train_shards, require_file

BAD_LINES = ["", "C1CC", "c1ccccc1 benzene", "CC(C)(C)(C)(C)C", "CCO", "OCC"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shared_data):
    """3,000 MOSES test SMILES, a vocabulary built from them, and a .smi with bad lines."""
    root = tmp_path_factory.mktemp("corpus")
    path = require_file(shared_data, "pretrain/moses_test.smi.gz")
    with gzip.open(path, "rt") as handle:
        smiles = [line.strip() for line in itertools.islice(handle, 3000)]
    vocab = SmilesTokenizer.build(smiles).save(root / "vocab.json")
    smi = root / "mols.smi"
    with open(smi, "wb") as handle:
        handle.write(("\n".join(smiles[:1500] + BAD_LINES + smiles[1500:]) + "\n").encode())
        handle.write(b"C\xff\xfeC\n" + smiles[0].encode() + b"\n")  # non-UTF-8, duplicate
    return {"root": root, "smiles": smiles, "vocab": vocab, "smi": smi}


def _shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix in (".bin", ".idx")}


def _run(corpus, out, inputs=None, workers=1, **cfg):
    config = PreprocessConfig(shard_size=cfg.pop("shard_size", 700), chunk_size=cfg.pop("chunk_size", 250),
                              valid_fraction=0.1, **cfg)  # fmt: skip
    return preprocess(inputs or [corpus["smi"]], out, config, vocab=corpus["vocab"],
                      workers=workers, progress=False)  # fmt: skip


def test_a_pool_worker_dies_of_the_pools_sigterm_whatever_its_parent_handles():
    """The pool's workers are forked with the parent's signal handlers; a worker that took
    the pool's closing SIGTERM as a stop request (a training job's handler) never exited, and
    the run hung at its end. A worker's setup puts SIGTERM back to its default."""
    import signal

    from smiexlm.data.normalize import NormalizeConfig
    from smiexlm.data.preprocess_run import _init_worker

    before = signal.signal(signal.SIGTERM, lambda *a: None)
    try:
        _init_worker(SmilesTokenizer.build(["CCO"]).tokens, NormalizeConfig())
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, before)


def test_manifest_rejects_and_determinism(corpus, tmp_path):
    one = _run(corpus, tmp_path / "w1", workers=1)
    two = _run(corpus, tmp_path / "w2", workers=2)
    m = one.manifest
    assert m == two.manifest
    assert _shard_bytes(tmp_path / "w1") == _shard_bytes(tmp_path / "w2")
    assert m["molecules_in"] == 3000 + len(BAD_LINES) + 2
    assert m["molecules_in"] == m["molecules_out"] + m["duplicates"] + sum(m["rejected"].values())
    # "CCO"/"OCC" and the repeated first molecule are duplicates after canonicalisation.
    assert m["duplicates"] == 2
    assert m["rejected"]["empty"] == 1 and m["rejected"]["non_utf8"] == 1
    assert m["rejected"]["invalid_smiles"] == 2  # unclosed ring, pentavalent carbon
    with open(tmp_path / "w1" / "rejects.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["source", "line", "input", "reason"]
    by_line = {int(r["line"]): (r["input"], r["reason"]) for r in rows}
    assert 1501 not in by_line  # the blank line: counted in the manifest, not listed
    assert by_line[1502] == ("C1CC", "invalid_smiles")
    assert by_line[3000 + len(BAD_LINES) + 1] == ("C\\xff\\xfeC", "non_utf8")
    assert (
        m["splits"]["train"]["molecules"] + m["splits"]["valid"]["molecules"] == m["molecules_out"]
    )
    assert 0.05 < m["splits"]["valid"]["molecules"] / m["molecules_out"] < 0.15
    assert len(m["sources"][0]["sha256"]) == 64 and (tmp_path / "w1" / "vocab.json").is_file()


def test_dataset_random_access(corpus, tmp_path):
    _run(corpus, tmp_path / "d", max_length=45)
    from rdkit import Chem

    tok = SmilesTokenizer.load(corpus["vocab"])
    canon = {Chem.MolToSmiles(Chem.MolFromSmiles(s)) for s in corpus["smiles"]}
    ds = TokenDataset(tmp_path / "d", "valid")
    train = TokenDataset(tmp_path / "d", "train")
    assert (
        len(ds) + len(train)
        == json.loads((tmp_path / "d" / "manifest.json").read_text())["molecules_out"]
    )
    rng = random.Random(0)
    for i in rng.sample(range(len(train)), 50) + [0, len(train) - 1, -1]:
        item = train[i]
        assert item.dtype == np.uint16 and item[0] == tok.bos_id and item[-1] == tok.eos_id
        assert tok.decode(item) in canon
        assert len(item) == train.lengths[i] <= 45
    with pytest.raises(IndexError):
        train[len(train)]
    rejected = json.loads((tmp_path / "d" / "manifest.json").read_text())["rejected"]
    assert rejected["too_many_tokens"] > 0


def test_input_formats_agree(corpus, tmp_path):
    smiles = corpus["smiles"][:600] + [""]
    ref = tmp_path / "a.smi.gz"
    with gzip.open(ref, "wt") as handle:
        # a line is stripped before its fields are split: the empty SMILES is a blank line
        handle.write("\n".join(f"{s}\tid{i}" if s else "" for i, s in enumerate(smiles)) + "\n")
    with open(tmp_path / "a.csv", "w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(["id", "SMILES"])
        w.writerows([i, s] for i, s in enumerate(smiles))
    with open(tmp_path / "a.tsv", "w") as handle:
        handle.write("smiles\tid\n" + "".join(f"{s}\t{i}\n" for i, s in enumerate(smiles)))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"smiles": smiles[:-1] + [None]}), tmp_path / "a.parquet")
    results = {}
    for name in ("a.smi.gz", "a.csv", "a.tsv", "a.parquet"):
        res = _run(corpus, tmp_path / f"out-{name}", [tmp_path / name], canonicalize=False)
        results[name] = _shard_bytes(tmp_path / f"out-{name}")
        assert res.manifest["molecules_in"] == 601 and res.manifest["rejected"]["empty"] == 1
    assert all(v == results["a.smi.gz"] for v in results.values())
    with pytest.raises(DataError, match="no SMILES column 'smi_missing'"):
        _run(corpus, tmp_path / "bad", [tmp_path / "a.csv"], smiles_col="smi_missing")
    with pytest.raises(DataError, match="does not exist"):
        _run(corpus, tmp_path / "bad2", [tmp_path / "nope.smi"])
    with pytest.raises(
        DataError,
        match=r"--smiles-col 'smiles': input .*a.smi.gz' is read as "
        "a SMILES file",
    ):  # a line has no columns to pick
        _run(corpus, tmp_path / "bad3", [tmp_path / "a.smi.gz"], smiles_col="smiles")
    assert not (tmp_path / "bad3").exists()
    with pytest.raises(DataError, match="already holds a dataset"):
        _run(corpus, tmp_path / "out-a.csv", [tmp_path / "a.csv"])
    (tmp_path / "out-a.csv" / "progress.json").unlink()  # --resume cannot go on from it
    with pytest.raises(DataError, match="without its progress.json .* choose an empty folder"):
        preprocess([tmp_path / "a.csv"], tmp_path / "out-a.csv", vocab=corpus["vocab"],
                   resume=True, progress=False)  # fmt: skip


_KILL_SCRIPT = """
import sys
from smiexlm.data import PreprocessConfig, preprocess
config = PreprocessConfig(shard_size=300, chunk_size=100, valid_fraction=0.1)
preprocess([sys.argv[1]], sys.argv[2], config, vocab=sys.argv[3], workers=1, progress=False,
           resume=len(sys.argv) > 4)
"""


def test_sigkill_then_resume_matches_uninterrupted(corpus, tmp_path):
    out = tmp_path / "killed"
    args = [sys.executable, "-c", _KILL_SCRIPT, str(corpus["smi"]), str(out), str(corpus["vocab"])]
    proc = subprocess.Popen(args)
    progress = out / "progress.json"
    kill_after_two_train_shards(proc, out)
    before = json.loads(progress.read_text())["state"]["chunks_done"]
    assert 0 < before < 31
    with pytest.raises(VocabularyMismatchError):
        other = SmilesTokenizer.build(corpus["smiles"][:100]).save(tmp_path / "other.json")
        preprocess([corpus["smi"]], out, PreprocessConfig(shard_size=300, chunk_size=100,
                   valid_fraction=0.1), vocab=other, resume=True, progress=False)  # fmt: skip
    subprocess.run([*args, "resume"], check=True)
    ref = _run(corpus, tmp_path / "ref", shard_size=300, chunk_size=100)
    assert _shard_bytes(out) == _shard_bytes(tmp_path / "ref")
    assert json.loads((out / "manifest.json").read_text()) == {
        **ref.manifest,
        "sources": json.loads((out / "manifest.json").read_text())["sources"],
    }
    assert (out / "rejects.csv").read_text().splitlines()[1:] == [
        line.replace(str(corpus["smi"]), str(corpus["smi"]))
        for line in (tmp_path / "ref" / "rejects.csv").read_text().splitlines()[1:]
    ]
    assert not list(out.glob("*.tmp"))


def test_resume_matches_inputs_by_content_not_by_path(corpus, tmp_path):
    from smiexlm.data.resume import check_resume

    config = PreprocessConfig(shard_size=300, chunk_size=100, valid_fraction=0.1)
    done = _run(corpus, tmp_path / "out", shard_size=300, chunk_size=100)
    moved = tmp_path / "elsewhere" / "same.smi"
    moved.parent.mkdir()
    moved.write_bytes(corpus["smi"].read_bytes())
    again = preprocess([moved], tmp_path / "out", config, vocab=corpus["vocab"], resume=True,
                       progress=False)  # fmt: skip
    assert again.manifest == done.manifest  # the finished run, not a second one
    saved = json.loads((tmp_path / "out" / "progress.json").read_text())
    other = {**saved["sources"][0], "path": str(moved), "sha256": "0" * 64}
    with pytest.raises(DataError, match="differ from those of the interrupted run") as err:
        check_resume(saved, saved["vocab_hash"], saved["config"], [other], tmp_path / "out")
    assert str(moved) in str(err.value) and str(corpus["smi"]) in str(err.value)


def test_strip_stereo_writes_a_flat_corpus_and_records_it(tmp_path):
    from smiexlm.data.resume import check_resume
    from smiexlm.errors import ConfigError

    smiles = ["C[C@H](N)C(=O)O", "C[C@@H](N)C(=O)O", "F/C=C/Cl", "F/C=C\\Cl", "[2H]C[C@H](O)Cl"]
    (tmp_path / "in.smi").write_text("\n".join(smiles) + "\n")
    vocab = SmilesTokenizer.build(smiles).save(tmp_path / "vocab.json")
    config = PreprocessConfig(strip_stereo=True, valid_fraction=0.0)
    result = preprocess(
        [tmp_path / "in.smi"], tmp_path / "flat", config, vocab=vocab, progress=False
    )
    manifest = result.manifest
    assert manifest["config"]["strip_stereo"] is True
    assert manifest["molecules_out"] == 3 and manifest["duplicates"] == 2  # enantiomers, E/Z
    tok = SmilesTokenizer.load(vocab)
    texts = {tok.decode(row) for row in TokenDataset(tmp_path / "flat", "train")}
    assert texts == {"CC(N)C(=O)O", "FC=CCl", "[2H]CC(O)Cl"}
    cfg_doc = {"strip_stereo": False}  # a dataset started before the option resumes as before
    saved = {"vocab_hash": "h", "config": {}, "sources": []}
    check_resume(saved, "h", cfg_doc, [], tmp_path)
    with pytest.raises(ConfigError, match="strip_stereo"):
        check_resume(saved, "h", {"strip_stereo": True}, [], tmp_path)


def test_encoder_matches_tokenizer_exactly(corpus):
    tok = SmilesTokenizer.load(corpus["vocab"])
    enc = ChunkEncoder(tok)
    assert enc.fast
    rng = random.Random(1)
    chars = "CcNn()[]=#%12345Brl>H@+-.é"
    texts = corpus["smiles"][:500] + ["C]", "[C", "[]", ">>>", "C%1", "[Xe]", "[MASK]C", "CH"]
    texts += ["".join(rng.choice(chars) for _ in range(rng.randint(0, 12))) for _ in range(3000)]
    got = enc.encode(texts)
    pieces = iter(np.split(got.ids, np.cumsum(got.lengths)[:-1]))
    for text, ok in zip(texts, got.ok.tolist(), strict=False):
        try:
            want = tok.encode(text)
        except Exception:
            want = None
        assert (next(pieces).tolist() if ok else None) == want, text


def test_hashset_against_python_set():
    rng = np.random.default_rng(0)
    ref: set[int] = set()
    hs = HashSet64()
    for _ in range(40):
        batch = rng.integers(0, 5000, size=300).astype(np.uint64)
        new = hs.add_new(batch)
        expect = []
        for v in batch.tolist():
            expect.append(v not in ref)
            ref.add(v)
        assert new.tolist() == expect
    assert len(hs) == len(ref) and len(hs._runs) < 12


def test_token_budget_sampler():
    lengths = np.random.default_rng(0).integers(3, 80, size=5000)
    sampler = TokenBudgetSampler(lengths, max_tokens=1024, seed=3, bucket_size=1000)
    epoch0 = list(sampler)
    assert sorted(i for b in epoch0 for i in b) == list(range(5000))
    assert all(len(b) * lengths[b].max() <= 1024 for b in epoch0)
    assert epoch0 == list(sampler)  # deterministic
    sampler.set_epoch(1)
    assert list(sampler) != epoch0 and len(sampler) == len(list(sampler))
    ranks = [
        list(TokenBudgetSampler(lengths, 1024, seed=3, rank=r, world_size=3)) for r in range(3)
    ]
    assert len({len(r) for r in ranks}) == 1
    assert {i for r in ranks for b in r for i in b} == set(range(5000))
    with pytest.raises(Exception, match="max_tokens"):
        TokenBudgetSampler(lengths, max_tokens=50)


def test_collate_pads():
    ids, mask = collate([np.array([1, 7, 2], np.uint16), np.array([1, 2], np.uint16)])
    assert ids.dtype.is_floating_point is False and str(ids.dtype) == "torch.int64"
    assert ids.tolist() == [[1, 7, 2], [1, 2, 0]]
    assert mask.tolist() == [[True, True, True], [True, True, False]]


def test_the_row_reader_reads_a_csv_as_pandas_does(tmp_path):
    """Blank lines before the header and between rows hold no row; a row with more fields
    than the header (an unquoted comma in a name) is refused naming its line, as pandas
    refuses it, where its SMILES column would have shifted."""
    from smiexlm.data.readers import iter_smiles, read_table

    lead = tmp_path / "lead.csv"
    lead.write_text("\n\nname,smiles\na,CCO\n\nb,CCN\n")
    assert list(iter_smiles(lead)) == ["CCO", "CCN"] == read_table(lead)["smiles"].tolist()
    shifted = tmp_path / "shifted.csv"
    shifted.write_text("name,smiles,y\nethanol,CCO,1\n1,2-dichloroethane,ClCCCl,2\n")
    with pytest.raises(
        DataError,
        match=r"'.*shifted.csv' line 3 has 4 fields where its header "
        "names 3",
    ):
        list(iter_smiles(shifted))
