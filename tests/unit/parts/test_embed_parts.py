"""Folders of Parquet parts: ``smiexlm embed``/``predict`` with a folder ``--out``, resumed
after ``kill -9``, and shared among the processes of ``torchrun`` (CPU, gloo)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smiexlm.embedding.embed import embed_file, embed_parts
from smiexlm.errors import DataError
from smiexlm.parts.reading import iter_parts, read_parts
from tests.conftest import smiexlm_command, torchrun_command
from tests.unit.featurizer.test_featurizer import make_checkpoint
from tests.warm_cli import run_smiexlm

BASES = ["CC(=O)Oc1ccccc1C(=O)O", "c1ccccc1CC", "CCN(CC)CC(=O)Nc1ccccc1", "CCOC(=O)c1ccc(N)cc1",
         "O=C(O)CCc1ccccc1"]  # fmt: skip
BAD = {17: "C1CC", 950: "not_a_smiles", 2001: ""}  # row -> a SMILES that fails
N_ROWS = 2400


def run_cli(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return run_smiexlm(*args, env=env, timeout=timeout)


def _env() -> dict[str, str]:
    return os.environ | {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    smiles = [BAD.get(i, BASES[i % 5] + "C" * (i % 11)) for i in range(N_ROWS)]
    frame = pd.DataFrame({"mol_id": [f"{i:04d}" for i in range(N_ROWS)], "smiles": smiles})
    path = tmp_path_factory.mktemp("in") / "library.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def reference(model, table, tmp_path_factory) -> pd.DataFrame:
    """The single-file output of one process."""
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("ref") / "emb.parquet"
    embed_file(table, out, checkpoint=model, device="cpu", progress=False)
    return pd.read_parquet(out)


def _same_table(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.columns) == list(want.columns)
    assert got["mol_id"].tolist() == want["mol_id"].tolist()  # ids kept, input order
    assert got["smiles"].tolist() == want["smiles"].tolist()
    e = [c for c in want.columns if c.startswith("e")]
    np.testing.assert_array_equal(got[e].to_numpy(), want[e].to_numpy())  # bitwise


def _parts(out: Path) -> dict[str, tuple[int, int]]:
    """Part file -> (inode, mtime_ns): a rewritten part changes both."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in out.glob("part-*.parquet")}


def _wait_for_parts(proc: subprocess.Popen, out: Path, n: int, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and len(_parts(out)) < n:
        time.sleep(0.01)
    assert proc.poll() is None, proc.communicate()


def test_parts_read_back_as_the_single_file_with_rejects_and_counts(model, table, reference,
                                                                   tmp_path):  # fmt: skip
    out = tmp_path / "emb"
    result = embed_parts(table, out, checkpoint=model, device="cpu", progress=False,
                         part_rows=700, chunk_rows=256)  # fmt: skip
    assert sorted(p.name for p in out.glob("part-*.parquet")) == [
        f"part-0000{i}.parquet" for i in range(4)
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["n_rows"] == N_ROWS and manifest["n_parts"] == 4
    assert [(p["start"], p["stop"]) for p in manifest["parts"]] == [
        (0, 700), (700, 1400), (1400, 2100), (2100, 2400)
    ]  # fmt: skip
    assert manifest["n_failed"] == 3 == result.n_failed
    assert [p["failed"] for p in manifest["parts"]] == [1, 1, 1, 0]
    assert len(manifest["input"]["sha256"]) == 64 and len(manifest["model"]["sha256"]) == 64
    rejects = pd.read_csv(out / "rejects.csv", keep_default_na=False)
    assert rejects["row"].tolist() == sorted(BAD)
    assert rejects["reason"].tolist() == ["RDKit cannot parse it", "RDKit cannot parse it",
                                          "empty string"]  # fmt: skip
    got = read_parts(out).to_pandas()
    _same_table(got, reference)
    assert np.isnan(got.loc[sorted(BAD), "e0"]).all()
    _same_table(pd.concat([t.to_pandas() for t in iter_parts(out)], ignore_index=True), reference)
    assert read_parts(out, columns=["mol_id"]).num_rows == N_ROWS
    # the same call again finds every part finished and rewrites nothing
    before = _parts(out)
    again = embed_parts(table, out, checkpoint=model, device="cpu", progress=False,
                        part_rows=700, chunk_rows=256)  # fmt: skip
    assert (again.parts_written, again.parts_resumed) == (0, 4) and _parts(out) == before
    assert "(all already there: nothing to do)" in again.summary()


def test_parquet_columns_null_through_the_first_chunk_keep_their_types(model, tmp_path):
    """A bool and an integer column with no value in the first chunk: the one file and the
    parts keep the input's types, where the first chunk's Arrow null type broke them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tmp_path / "in.parquet"
    columns = {"tested": pa.array([None, None, True, False, None, True]),
               "batch": pa.array([None, None, 3, None, 5, 6], pa.int64())}  # fmt: skip
    pq.write_table(pa.table({"smiles": [*BASES, "CCO", "CCN"], **{k: pa.concat_arrays([v, v[:1]])
                             for k, v in columns.items()}}), source)  # fmt: skip
    embed_file(source, tmp_path / "one.parquet", checkpoint=model, device="cpu",
               progress=False, chunk_rows=2)  # fmt: skip
    embed_parts(source, tmp_path / "parts", checkpoint=model, device="cpu", progress=False,
                part_rows=2, chunk_rows=2)  # fmt: skip
    for table in (pq.read_table(tmp_path / "one.parquet"), read_parts(tmp_path / "parts")):
        assert table.schema.field("tested").type == pa.bool_()
        assert table.column("batch").to_pylist() == [None, None, 3, None, 5, 6, None]


def test_a_manifest_edited_or_cut_short_is_made_again_from_the_part_records(model, tmp_path):
    out, small = tmp_path / "emb", tmp_path / "small.csv"
    small.write_text("mol_id,smiles\na,CCO\nb,c1ccccc1\nc,CCN\n")

    def embed(path=small):
        return embed_parts(path, out, checkpoint=model, device="cpu", progress=False,
                           part_rows=2)  # fmt: skip

    embed()
    whole = (out / "manifest.json").read_text()
    edited = json.loads(whole)
    edited["parts"][1]["sha256"] = "0" * 64  # an edit: read_parts names the part
    (out / "manifest.json").write_text(json.dumps(edited))
    with pytest.raises(DataError, match="part-00001.parquet"):
        read_parts(out)
    again = embed()
    assert again.parts_written == 0 and json.loads((out / "manifest.json").read_text())["parts"] == json.loads(whole)["parts"]  # fmt: skip
    (out / "manifest.json").write_text(whole[:100])  # cut short
    assert embed().parts_written == 0 and read_parts(out).num_rows == 3
    other = tmp_path / "other.csv"  # a cut manifest does not hide a folder of another job
    other.write_text("mol_id,smiles\na,CCCl\n")
    (out / "manifest.json").write_text(whole[:100])
    with pytest.raises(DataError, match="mixes two jobs"):
        embed(other)


def test_sigkill_then_the_same_command_resumes_by_part(model, table, reference, tmp_path):
    out = tmp_path / "emb"
    args = ["embed", table, "--out", out, "-c", model, "--device", "cpu", "--part-rows", "60"]
    proc = subprocess.Popen([smiexlm_command(), *map(str, args)], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _wait_for_parts(proc, out, 3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    finished = _parts(out)
    assert 3 <= len(finished) < N_ROWS // 60
    assert not json.loads((out / "manifest.json").read_text())["complete"]
    with pytest.raises(DataError, match="unfinished"):
        read_parts(out)
    res = run_cli(*args, env=_env())
    assert res.returncode == 0, res.stderr
    assert f"{len(finished)} already there" in res.stdout
    after = _parts(out)
    assert {name: after[name] for name in finished} == finished  # never rewritten
    assert len(after) == N_ROWS // 60  # no part twice
    _same_table(read_parts(out).to_pandas(), reference)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_a_folder_of_another_job_is_refused(model, table, tmp_path):
    out = tmp_path / "emb"
    small = tmp_path / "small.csv"
    small.write_text("mol_id,smiles\na,CCO\nb,c1ccccc1\n")

    def embed(path=small, checkpoint=model, **options):
        options = {"part_rows": 1, **options}
        return embed_parts(path, out, checkpoint=checkpoint, device="cpu", progress=False,
                           **options)  # fmt: skip

    assert embed().n_rows == 2
    with pytest.raises(DataError, match="holds parts of another job: setting 'pooling' is 'cls'"):
        embed(pooling="mean")
    with pytest.raises(DataError, match="another job: --part-rows is 1 there and 2 here"):
        embed(part_rows=2)
    with pytest.raises(DataError, match="another job: the input sha256"):
        embed(table)
    with pytest.raises(DataError, match="another job: the model sha256"):
        embed(checkpoint=make_checkpoint(tmp_path / "other", seed=1))
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="no manifest.json: expected a new or empty folder"):
        embed_parts(small, stray, checkpoint=model, progress=False)
    # through the command: one line, exit code 2
    res = run_cli(
        "embed", small, "--out", out, "-c", model, "--part-rows", "1", "--no-canonicalize"
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "error: --out" in res.stderr and "setting 'canonicalize' is True there" in res.stderr


def test_parts_options_need_a_folder(tmp_path, monkeypatch):
    from smiexlm.parts.job import wants_parts

    assert wants_parts(tmp_path / "emb", None) and wants_parts(tmp_path, None)
    assert not wants_parts(tmp_path / "emb.parquet", None)
    with pytest.raises(DataError, match="--part-rows 5: --out .* is a file name"):
        wants_parts(tmp_path / "emb.parquet", 5)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(DataError, match="a job of 2 processes .* writes a folder of parts"):
        wants_parts(tmp_path / "emb.npy", None)


def test_two_processes_under_torchrun_write_the_same_table(model, table, reference, tmp_path):
    out = tmp_path / "emb"
    run = subprocess.run(
        [*torchrun_command(2), "embed", str(table), "--out", str(out), "-c", str(model),
         "--device", "cpu", "--part-rows", "250"],
        capture_output=True, text=True, timeout=120, env=os.environ,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    workers = manifest["last_run"]["workers"]
    assert manifest["last_run"]["world_size"] == 2
    assert [w["parts"] for w in workers] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    assert all(w["threads"] >= 1 and w["peak_rss_mib"] > 0 for w in workers)
    assert run.stdout.count("10 parts of 250") == 1  # rank 0 reports
    _same_table(read_parts(out).to_pandas(), reference)


def _worker_of_rank(launcher: int, rank: int) -> int:
    """PID of the torchrun worker of ``rank`` among the launcher's children."""
    deadline = time.time() + 60
    while time.time() < deadline:
        path = Path(f"/proc/{launcher}/task/{launcher}/children")
        for pid in path.read_text().split() if path.exists() else []:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ:
                return int(pid)
        time.sleep(0.05)
    raise AssertionError(f"no worker of rank {rank} under {launcher}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_one_worker_then_resume_gives_the_same_table(model, table, reference,
                                                                tmp_path):  # fmt: skip
    out = tmp_path / "emb"
    launcher = subprocess.Popen(
        [*torchrun_command(2), "embed", str(table), "--out", str(out), "-c", str(model),
         "--device", "cpu", "--part-rows", "40"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ,
    )  # fmt: skip
    worker = _worker_of_rank(launcher.pid, 1)
    _wait_for_parts(launcher, out, 4)
    os.kill(worker, signal.SIGKILL)
    assert launcher.wait(timeout=60) != 0  # torchrun stops the other rank and fails
    finished = _parts(out)
    assert len(finished) < N_ROWS // 40
    result = embed_parts(table, out, checkpoint=model, device="cpu", progress=False,
                         part_rows=40)  # fmt: skip
    assert result.parts_resumed == len(finished)
    assert result.parts_written + result.parts_resumed == N_ROWS // 40
    after = _parts(out)
    assert {name: after[name] for name in finished} == finished
    assert len(after) == N_ROWS // 40
    _same_table(read_parts(out).to_pandas(), reference)
