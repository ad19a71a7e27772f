"""``smiexlm widen``: outputs, rejects, report, seeds, resume, and no evaluation molecule.

These tests read the shared data (MOSES, MoleculeNet): without SMIEXLM_DATA they fail. Their
SMIEXLM_DATA holds two MoleculeNet files (BBBP, BACE: the molecules they let in), so that the
exclusion set is theirs alone: the keys of every file cost minutes and test nothing more."""

from __future__ import annotations

import gzip
import itertools
import json
import os
from pathlib import Path

import pytest
from rdkit import Chem
from typer.testing import CliRunner

from smiexlm.cli.main import app
from smiexlm.data.readers import iter_smiles
from smiexlm.data.widen.exclusion import evaluation_key, exclusion_keys
from smiexlm.data.widen.steps import Widener
from smiexlm.moleculenet.loaders import evaluation_sets
from tests.conftest import some_data

BAD = ["C1CC", "not_a_smiles", ""]


FILES = ("moleculenet/bbbp.csv", "moleculenet/bace.csv", "pretrain/moses_train.smi.gz")


@pytest.fixture(scope="module")
def _data_folder(tmp_path_factory) -> Path:
    value = os.environ.get("SMIEXLM_DATA")
    if not value or not Path(value).is_dir():
        pytest.fail(f"SMIEXLM_DATA={value!r}: these tests need the shared data folder")
    return some_data(Path(value), tmp_path_factory.mktemp("data"), FILES)


@pytest.fixture(autouse=True)
def _two_moleculenet_files(_data_folder, monkeypatch):
    monkeypatch.setenv("SMIEXLM_DATA", str(_data_folder))


def _data() -> Path:
    return Path(os.environ["SMIEXLM_DATA"])


def _input(tmp_path: Path, n: int = 24, evaluation: int = 3) -> tuple[Path, list[str]]:
    """MOSES molecules from the middle of the file, bad rows, and BBBP molecules."""
    with gzip.open(_data() / "pretrain" / "moses_train.smi.gz", "rt") as handle:
        moses = [line.strip() for line in itertools.islice(handle, 500_000, 500_000 + n)]
    bbbp = list(iter_smiles(_data() / "moleculenet" / "bbbp.csv"))[:evaluation]
    path = tmp_path / "in.smi"
    path.write_text("\n".join(moses[:10] + BAD + bbbp + moses[10:]) + "\n")
    return path, bbbp


def _widen(src: Path, out: Path, *extra: str):
    result = CliRunner().invoke(app, ["widen", str(src), str(out), "--part-size", "8",
                                      "--per-molecule", "2", "--no-progress", *extra])  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads(out.with_name(out.name.replace(".smi.gz", ".report.json")).read_text())


def test_widen_writes_products_rejects_and_report(tmp_path):
    src, bbbp = _input(tmp_path)
    out = tmp_path / "wide.smi.gz"
    report = _widen(src, out)
    lines = gzip.decompress(out.read_bytes()).decode().splitlines()
    assert len(lines) == report["lines_written"] > report["originals_written"] == 24
    for line in lines:
        smiles, name = line.split(" ")
        assert Chem.MolFromSmiles(smiles) is not None, line
        assert name.split(".")[0].isdigit()
    written = {line.split(" ")[1].split(".")[-1] for line in lines}
    assert {"brics", "salts", "tautomers", "elements"} <= written
    rejects = gzip.decompress(out.with_name("wide.rejects.csv.gz").read_bytes()).decode()
    rows = [r.split(",") for r in rejects.splitlines()[1:]]
    inputs = [(int(r[0]), r[-1]) for r in rows if r[1] == "input"]
    assert inputs[:3] == [(11, "invalid_smiles"), (12, "invalid_smiles"), (13, "empty")]
    assert [reason for _, reason in inputs[3:]] == ["in_evaluation_set"] * len(bbbp)
    assert report["rejected_inputs"] == 3 + len(bbbp)
    assert set(report["steps"]) == {"brics", "protonate", "salts", "tautomers", "stereo",
                                    "elements"}  # fmt: skip
    assert not list(tmp_path.glob(".wide.parts"))  # the work folder is gone
    # preprocess takes the output as it is
    result = CliRunner().invoke(app, ["preprocess", str(out), "--out", str(tmp_path / "ds"),
                                      "--no-progress"])  # fmt: skip
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["molecules_in"] == len(lines)


def test_no_product_of_an_evaluation_molecule_survives(tmp_path, monkeypatch):
    """MoleculeNet molecules let through as inputs: none of their products may be written."""
    src = tmp_path / "eval.smi"
    molecules = list(iter_smiles(_data() / "moleculenet" / "bace.csv", "mol"))[:12]
    src.write_text("\n".join(molecules) + "\n")
    excluded = exclusion_keys(evaluation_sets())
    original = Widener._original

    def let_through(self, smiles):  # the input check off: the product check must hold
        self.excluded, keep = frozenset(), self.excluded
        try:
            return original(self, smiles)
        finally:
            self.excluded = keep

    monkeypatch.setattr(Widener, "_original", let_through)
    report = _widen(src, tmp_path / "eval.smi.gz")
    lines = gzip.decompress((tmp_path / "eval.smi.gz").read_bytes()).decode().splitlines()
    products = [line.split(" ")[0] for line in lines if "." in line.split(" ")[1]]
    keys = {evaluation_key(Chem.MolFromSmiles(s)) for s in products}
    assert not keys & excluded
    assert sum(step["excluded"] for step in report["steps"].values()) > 0


def test_seeded_runs_are_identical(tmp_path):
    src, _ = _input(tmp_path)
    _widen(src, tmp_path / "a.smi.gz", "--seed", "7")
    _widen(src, tmp_path / "b.smi.gz", "--seed", "7")
    _widen(src, tmp_path / "c.smi.gz", "--seed", "8")
    assert (tmp_path / "a.smi.gz").read_bytes() == (tmp_path / "b.smi.gz").read_bytes()
    assert (tmp_path / "a.smi.gz").read_bytes() != (tmp_path / "c.smi.gz").read_bytes()


def test_an_interrupted_run_leaves_no_output_and_resumes(tmp_path, monkeypatch, caplog):
    src, _ = _input(tmp_path)
    whole = _widen(src, tmp_path / "whole.smi.gz")
    calls = {"n": 0}
    original = Widener.widen_block

    def fail_third(self, rows):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original(self, rows)

    monkeypatch.setattr(Widener, "widen_block", fail_third)
    out = tmp_path / "part.smi.gz"
    result = CliRunner().invoke(app, ["widen", str(src), str(out), "--part-size", "8",
                                      "--per-molecule", "2", "--no-progress"])  # fmt: skip
    assert result.exit_code != 0
    assert not out.exists() and not out.with_name("part.report.json").exists()
    assert len(list((tmp_path / ".part.parts").glob("part-*.json"))) == 2
    monkeypatch.setattr(Widener, "widen_block", original)
    kept = {p.name: p.read_bytes() for p in (tmp_path / ".part.parts").iterdir()}
    changed = CliRunner().invoke(app, ["widen", str(src), str(out), "--part-size", "6",
                                       "--max-molecules", "1", "--no-progress"])  # fmt: skip
    assert changed.exit_code == 0, changed.output
    assert "made with other config, max_molecules, part_size: starting over" in caplog.text
    for name, payload in kept.items():  # the first run's finished parts, put back
        (tmp_path / ".part.parts").mkdir(exist_ok=True)
        (tmp_path / ".part.parts" / name).write_bytes(payload)
    report = _widen(src, out)
    assert report["resumed"] is True
    assert out.read_bytes() == (tmp_path / "whole.smi.gz").read_bytes()
    assert report["steps"] == whole["steps"]


def test_bad_arguments_name_the_field(tmp_path):
    src, _ = _input(tmp_path)
    for extra, field in ((["--steps", "brics,nope"], "steps"), (["--per-molecule", "0"],
                         "per_molecule"), (["--fraction", "0"], "fraction")):  # fmt: skip
        result = CliRunner().invoke(app, ["widen", str(src), str(tmp_path / "x.smi.gz"), *extra])
        assert result.exit_code != 0
        assert field in str(result.exception)
    result = CliRunner().invoke(app, ["widen", str(src), str(tmp_path / "x.smi")])
    assert ".smi.gz" in str(result.exception)


def test_bytes_that_are_not_utf8_are_rejected_at_their_file_line(tmp_path):
    """A latin-1 byte in a CSV cell or a SMILES line is a reject naming the file's own line,
    not the end of the run; the other rows are widened."""
    good = "CC(C)Cc1ccc(cc1)C(C)C(=O)NCCN"
    (tmp_path / "in.csv").write_bytes(f"smiles\n{good}\nCCCC\xe9N\n\nxx\n".encode("latin-1"))
    (tmp_path / "in.smi").write_bytes(f"{good} ibu\nCC\xe9N name\n".encode("latin-1"))
    for name, want in (("in.csv", [(3, "non_utf8"), (5, "invalid_smiles")]),  # 4 is blank
                       ("in.smi", [(2, "non_utf8")])):  # fmt: skip
        out = tmp_path / f"{name}.smi.gz"
        report = _widen(tmp_path / name, out, "--steps", "protonate")
        rejects = gzip.decompress(out.with_name(f"{name}.rejects.csv.gz").read_bytes()).decode()
        rows = [r.split(",") for r in rejects.splitlines()[1:]]
        assert [(int(r[0]), r[-1]) for r in rows if r[1] == "input"] == want
        assert report["originals_written"] == 1
        assert gzip.decompress(out.read_bytes()).decode().split()[1] == ("2" if name == "in.csv"
                                                                        else "1")  # fmt: skip


def test_a_bad_path_is_said_before_the_evaluation_keys_are_made(tmp_path, monkeypatch):
    import smiexlm.data.widen.exclusion as exclusion

    def never(*args, **kwargs):
        raise AssertionError("the keys were made before the paths were checked")

    monkeypatch.setattr(exclusion, "exclusion_keys", never)
    (tmp_path / "in.smi").write_text("CCO\n")
    for args, words in (([str(tmp_path / "missing.smi"), str(tmp_path / "o.smi.gz")], "missing"),
                        ([str(tmp_path / "in.smi"), str(tmp_path / "o.txt")], ".smi.gz")):  # fmt: skip
        result = CliRunner().invoke(app, ["widen", *args])
        assert result.exit_code != 0 and words in str(result.exception), result.output
