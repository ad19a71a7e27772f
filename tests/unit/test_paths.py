"""The package's one file hasher, ``smiexlm.paths.file_sha256``, and the records built on it;
the check that no output lies inside an input folder (``check_outputs_outside``)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from smiexlm.errors import DataError
from smiexlm.paths import file_problem, file_record, file_sha256


def test_file_sha256_is_hashlib_over_the_whole_file_in_blocks(tmp_path):
    payload = np.random.default_rng(0).integers(0, 256, (1 << 22) * 2 + 123, dtype=np.uint8)
    path = tmp_path / "blob.bin"
    path.write_bytes(payload.tobytes())
    blocks: list[bytes] = []
    assert file_sha256(path, each_block=blocks.append) == hashlib.sha256(payload).hexdigest()
    assert [len(b) for b in blocks] == [1 << 22, 1 << 22, 123]  # the pass the caller shares
    assert b"".join(blocks) == payload.tobytes()
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_an_lmdb_folder_is_hashed_by_its_data_file(tmp_path):
    (tmp_path / "db").mkdir()
    (tmp_path / "db" / "data.mdb").write_bytes(b"records")
    (tmp_path / "db" / "lock.mdb").write_bytes(b"changes on every open")
    assert file_sha256(tmp_path / "db") == hashlib.sha256(b"records").hexdigest()


def test_an_unreadable_file_is_a_data_error_naming_it(tmp_path):
    with pytest.raises(DataError, match="'.*missing.bin' cannot be read"):
        file_sha256(tmp_path / "missing.bin")


def test_a_record_tells_a_truncated_file_from_a_damaged_one(tmp_path):
    path = tmp_path / "part.parquet"
    path.write_bytes(b"0123456789")
    record = file_record(path)
    assert record == {"bytes": 10, "sha256": hashlib.sha256(b"0123456789").hexdigest()}
    assert file_problem(path, record) is None
    path.write_bytes(b"01234")
    assert "has 5 bytes where 10 were written" in file_problem(path, record)
    path.write_bytes(b"0123456780")
    assert "(damaged)" in file_problem(path, record)
    assert "no recorded sha256" in file_problem(path, {"bytes": 10})


def test_an_output_inside_an_input_folder_is_refused_whatever_names_it(tmp_path, monkeypatch):
    from smiexlm.paths import check_outputs_outside

    model = tmp_path / "M"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "L").symlink_to(model)
    inside = [model / "model.safetensors", model / "new" / "seed3", tmp_path / "L" / "p.csv",
              tmp_path / "M" / ".." / "M" / "p.csv"]  # fmt: skip
    for out in inside:
        with pytest.raises(DataError, match=r"--out .* lies inside the input --checkpoint "
                           r".*/M' \(a folder\).*expected a path outside it"):  # fmt: skip
            check_outputs_outside({"--out": out}, {"--checkpoint": [tmp_path / "x", model]})
    with pytest.raises(DataError, match="lies inside the input --checkpoint"):  # by a link
        check_outputs_outside({"--out": model / "p.csv"}, {"--checkpoint": tmp_path / "L"})
    monkeypatch.chdir(model)  # the folder named as "."
    with pytest.raises(DataError, match="'model.safetensors' lies inside .* '.'"):
        check_outputs_outside({"--out": Path("model.safetensors")}, {"--checkpoint": Path(".")})


def test_an_output_beside_an_input_or_inside_a_file_input_passes(tmp_path, monkeypatch):
    from smiexlm.paths import check_outputs_outside

    monkeypatch.chdir(tmp_path)  # no folder named "default" here: a shipped model's name
    (tmp_path / "M").mkdir()
    (tmp_path / "t.csv").write_text("smiles\nCCO\n")
    fine = [
        ({"--out": tmp_path / "M2" / "p.csv"}, {"--checkpoint": tmp_path / "M"}),  # a prefix
        ({"--out": tmp_path / "p.csv"}, {"--checkpoint": tmp_path / "M"}),  # its parent
        ({"--out": tmp_path / "t.csv.out"}, {"--input": tmp_path / "t.csv"}),  # a file input
        ({"--out": Path("default") / "p.csv"}, {"--checkpoint": Path("default")}),  # a name
        ({"--out": None}, {"--checkpoint": tmp_path / "M"}),
    ]
    for outputs, inputs in fine:
        check_outputs_outside(outputs, inputs)


def test_an_output_where_nothing_can_be_written_is_refused_whoever_runs(tmp_path):
    """Root passes every mode check: /proc takes no file whatever the modes say, and is
    refused before any compute; a writable folder is left as it was."""
    from smiexlm.paths import check_output

    for kind in ("file", "folder"):
        with pytest.raises(DataError, match="nothing can be written in folder '/proc'"):
            check_output("/proc/predictions.csv", "--out", kind)  # type: ignore[arg-type]
    assert check_output(tmp_path / "new" / "out.csv") == tmp_path / "new" / "out.csv"
    assert list(tmp_path.iterdir()) == []


def test_a_fifo_or_a_device_is_never_replaced_by_a_file(tmp_path):
    """A rename onto ``/dev/null`` as root would put a file in the node's place."""
    import os

    from smiexlm.atomic import atomic_path
    from smiexlm.paths import check_output

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/null"):
        with pytest.raises(DataError, match="is not a regular file"):
            check_output(path, "--out")
        with pytest.raises(DataError, match="is not a regular file"), atomic_path(path) as tmp:
            tmp.write_text("x")
    assert fifo.exists() and not fifo.is_file()
