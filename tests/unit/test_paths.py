"""The package's one file hasher, ``smiexlm.paths.file_sha256``, and the records built on it."""

from __future__ import annotations

import hashlib

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
