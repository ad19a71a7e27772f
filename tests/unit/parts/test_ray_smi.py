"""The SMILES-file reader of ``--ray`` (:class:`~smiexlm.parts.ray_smi.SmiLines`) splits a file
into the lines the reader without Ray yields, in blocks, without the whole file in memory."""

from __future__ import annotations

import gzip

import pyarrow as pa
import pytest

from smiexlm.data.readers import iter_smiles, split_smiles_line
from smiexlm.errors import DataError
from smiexlm.parts import ray_smi  # Ray is in the dev extra: a test without it fails

# a BOM first, a form feed, a lone carriage return, NEL and a group separator inside lines,
# a blank line, a CRLF line and no newline at the end: str.splitlines would make 12 lines
ODD = ("\ufeffCCO ethanol\nc1ccccc1\tbenzene\fform\n\nCCN\r\nCC(=O)O acetic\u0085acid\n"
       "C1CC((\rC\nCCCl name\x1dgroup\u2028x\nCCBr").encode()  # fmt: skip


def _lines(tmp_path, data: bytes, name: str = "t.smi") -> list[str]:
    path = tmp_path / name
    path.write_bytes(data)
    source = ray_smi.SmiLines([str(path)])
    return [line for block in source._read_stream(pa.BufferReader(data), str(path))
            for line in block.column("text").to_pylist()]  # fmt: skip


def test_the_lines_are_those_of_the_reader_without_ray(tmp_path):
    lines = _lines(tmp_path, ODD)
    assert len(lines) == 8 and lines[0] == "CCO ethanol" and lines[2] == ""
    assert [split_smiles_line(x)[0] for x in lines] == list(iter_smiles(tmp_path / "t.smi"))
    (tmp_path / "t.smi.gz").write_bytes(gzip.compress(ODD))
    assert list(iter_smiles(tmp_path / "t.smi.gz")) == list(iter_smiles(tmp_path / "t.smi"))


def test_blocks_and_reads_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(ray_smi, "BLOCK_LINES", 3)
    monkeypatch.setattr(ray_smi, "READ_BYTES", 5)  # lines cut across reads are joined
    data = "".join(f"{'C' * (i % 7 + 1)} m{i}\n" for i in range(10)).encode()
    path = tmp_path / "b.smi"
    path.write_bytes(data)
    blocks = list(ray_smi.SmiLines([str(path)])._read_stream(pa.BufferReader(data), str(path)))
    assert [b.num_rows for b in blocks] == [3, 3, 3, 1]
    assert [x for b in blocks for x in b.column("text").to_pylist()] == data.decode().split("\n")[
        :-1
    ]


def test_a_line_that_is_not_utf8_names_the_file_and_line(tmp_path):
    with pytest.raises(DataError, match=r"'.*bad.smi' line 2 is not UTF-8"):
        _lines(tmp_path, b"CCO\nCC\xe9N name\n", "bad.smi")
