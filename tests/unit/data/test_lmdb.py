"""``preprocess`` of a Uni-Mol style LMDB archive (pickled dicts, the SMILES under ``smi``):
the molecules as a SMILES file gives them, a record without a SMILES listed in rejects.csv,
and an archive or a record that cannot be read said in one line."""

from __future__ import annotations

import csv
import pickle

import lmdb
import pytest

from smiexlm.data import PreprocessConfig, preprocess
from smiexlm.errors import DataError

SMILES = ["CCO", "c1ccccc1O", "CC(=O)Oc1ccccc1C(=O)O", "CCN(CC)CC", "C1CCNCC1"]


def _archive(path, values) -> None:
    env = lmdb.open(str(path), subdir=False, map_size=1 << 20)
    with env.begin(write=True) as txn:
        for i, value in enumerate(values):
            txn.put(f"{i:08d}".encode(), value)
    env.close()


def _run(source, out):
    config = PreprocessConfig(valid_fraction=0.0, canonicalize=False)
    return preprocess([source], out, config, progress=False)


def test_an_archive_gives_the_molecules_and_lists_a_record_without_one(tmp_path):
    records = [{"smi": s, "atoms": []} for s in SMILES]
    records[2] = {"atoms": []}  # no SMILES: a record of the user's, listed
    records[3] = {"smi": ""}
    _archive(tmp_path / "a.lmdb", [pickle.dumps(r) for r in records])
    result = _run(tmp_path / "a.lmdb", tmp_path / "out")
    assert result.manifest["molecules_in"] == 5 and result.manifest["rejected"]["empty"] == 2
    with open(tmp_path / "out" / "rejects.csv", newline="") as handle:
        listed = list(csv.reader(handle))[1:]
    assert [(row[1], row[3]) for row in listed] == [("3", "empty"), ("4", "empty")]
    smi = tmp_path / "a.smi"
    smi.write_text("\n".join(SMILES) + "\n\n")  # a blank line of a SMILES file: counted only
    _run(smi, tmp_path / "out_smi")
    with open(tmp_path / "out_smi" / "rejects.csv", newline="") as handle:
        assert list(csv.reader(handle))[1:] == []


def test_a_file_or_record_that_cannot_be_read_is_one_line(tmp_path):
    (tmp_path / "fake.lmdb").write_text("not an archive\n")
    with pytest.raises(DataError, match=r"'.*fake.lmdb' is not a readable LMDB archive"):
        _run(tmp_path / "fake.lmdb", tmp_path / "o1")
    _archive(tmp_path / "bad.lmdb", [pickle.dumps({"smi": "CCO"}), b"plain bytes"])
    with pytest.raises(DataError, match=r"'.*bad.lmdb' record 2 is not a pickled record"):
        _run(tmp_path / "bad.lmdb", tmp_path / "o2")
