"""Hostile outputs: damaged artefacts, wrong models and results that are no results.

Each case is one a user met: the real command runs in a subprocess. A search index or a
folder of parts whose files were truncated or changed in place is refused with one ``error:``
line naming the file (exit code 2), never read into wrong neighbours with exit code 0; a
resume writes a damaged part again and says so. A job none of whose rows succeeded fails
and keeps nothing. Options and inputs that used to be taken silently for something else
(``--part-rows 0``, a model file for its folder, a binary header, an empty SMILES) are refused
in one line.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
from tests.integration.test_faults import assert_one_line_error, run_cli

SMILES = [f"C1{'C' * n}1{tail}" for n in range(2, 10) for tail in ("", "O", "N")]  # 24
QUERY = "C1CCCC1O"  # row 7 of the library: its own nearest neighbour, score 1


def _flip(path: Path, offset: int = 2000) -> None:
    """Change one byte of ``path`` in place (size kept)."""
    payload = bytearray(path.read_bytes())
    payload[offset % len(payload)] ^= 0xFF
    path.write_bytes(bytes(payload))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    """A CSV of 24 molecules with a column of numbers beside the SMILES."""
    path = tmp_path_factory.mktemp("lib") / "lib.csv"
    ids = [f"m{i}" for i in range(len(SMILES))]
    pd.DataFrame({"name": ids, "smiles": SMILES, "num": range(len(SMILES))}).to_csv(
        path, index=False
    )
    return path


@pytest.fixture(scope="module")
def parts(library) -> Path:
    """``embed --out folder`` of the library, 4 parts of 6 rows."""
    out = library.parent / "emb"
    res = run_cli("embed", library, "--out", out, "--part-rows", 6, "--device", "cpu")
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def index(parts) -> Path:
    pytest.importorskip("faiss")
    out = parts.parent / "idx"
    res = run_cli("index", parts, "--out", out)
    assert res.returncode == 0, res.stderr
    return out


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory) -> Path:
    """A fine-tuned folder (one update on 24 molecules)."""
    root = tmp_path_factory.mktemp("finetuned")
    rng = random.Random(0)
    data = root / "train.csv"
    pd.DataFrame({"smiles": SMILES, "y": [rng.randint(0, 1) for _ in SMILES]}).to_csv(
        data, index=False
    )
    res = run_cli("finetune", "mine", "--data", data, "--label-cols", "y", "--seeds", "0",
                  "--max-train-steps", "1", "--batch-size", "8", "--device", "cpu",
                  "--split", "random", "--out", root / "report", "--save-dir", root / "models")  # fmt: skip
    assert res.returncode == 0, res.stderr
    return root / "models" / "seed0"


# ---------------------------------------------------------------------- 3. search indexes
def test_an_intact_index_finds_the_query_itself(index):
    res = run_cli("search", index, "--query", QUERY, "-k", 1, "--by", "ecfp4")
    assert res.returncode == 0, res.stderr
    assert "1.000  row 7 " in res.stdout


@pytest.mark.parametrize(
    "file, damage",
    [("ecfp4.npy", "flip"), ("embedding.faiss", "flip"), ("embedding.faiss", "truncate"),
     ("library.parquet", "remove")],
)  # fmt: skip
def test_search_refuses_a_damaged_index_file_naming_it(index, tmp_path, file, damage):
    copy = tmp_path / "idx"
    shutil.copytree(index, copy)
    target = copy / file
    if damage == "flip":
        _flip(target, target.stat().st_size - 200)  # inside the data, past the headers
    elif damage == "truncate":
        _truncate(target)
    else:
        target.unlink()
    res = run_cli("search", copy, "--query", QUERY, "-k", 1, "--by", "ecfp4")
    needle = {"flip": "has sha256", "truncate": "bytes where", "remove": "is missing"}[damage]
    assert_one_line_error(res, f"{file}'", needle, "rebuild the index")


def test_search_with_another_model_names_both(index):
    res = run_cli("search", index, "--query", QUERY, "-k", 1, "-c", "exlm", "--device", "cpu")
    line = assert_one_line_error(res, "--checkpoint 'exlm'", "is not the model that made")
    assert "twins/exlm" in line and "default_model" in line and "pass it with" not in line


# ---------------------------------------------------------------------- 6. parts
def test_index_and_read_parts_refuse_a_damaged_part(parts, tmp_path):
    from smiexlm.errors import DataError
    from smiexlm.parts.reading import read_parts

    copy = tmp_path / "emb"
    shutil.copytree(parts, copy)
    _flip(copy / "part-00001.parquet", 2000)
    res = run_cli("index", copy, "--out", tmp_path / "idx")
    assert_one_line_error(res, "part-00001.parquet'", "has sha256", "run the command")
    assert not (tmp_path / "idx").exists()
    _truncate(copy / "part-00002.parquet")
    (copy / "part-00001.parquet").write_bytes((parts / "part-00001.parquet").read_bytes())
    with pytest.raises(DataError, match="part-00002.parquet' has .* bytes where"):
        read_parts(copy)


def test_a_folder_without_part_checksums_is_refused_not_trusted(parts, tmp_path):
    from smiexlm.errors import DataError
    from smiexlm.parts.reading import read_parts

    copy = tmp_path / "emb"
    shutil.copytree(parts, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for entry in manifest["parts"]:
        del entry["sha256"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="part-00000.parquet' has no recorded sha256"):
        read_parts(copy)


def test_embed_resume_writes_damaged_parts_again_and_says_so(library, parts, tmp_path):
    from smiexlm.parts.reading import read_parts

    copy = tmp_path / "emb"
    shutil.copytree(parts, copy)
    _flip(copy / "part-00001.parquet")
    _truncate(copy / "part-00002.parquet")
    res = run_cli("embed", library, "--out", copy, "--part-rows", 6, "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert "nothing to do" not in res.stdout and "2 damaged written again" in res.stdout
    assert "part-00001.parquet has sha256" in res.stderr and "written again" in res.stderr
    assert "part-00002.parquet has" in res.stderr and "bytes where" in res.stderr
    assert read_parts(copy).equals(read_parts(parts))
    again = run_cli("embed", library, "--out", copy, "--part-rows", 6, "--device", "cpu")
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stderr


def test_predict_parts_get_the_same_protection(finetuned, library, tmp_path):
    out = tmp_path / "preds"
    args = ["predict", "--checkpoint", finetuned, "--input", library, "--out", out,
            "--part-rows", 10, "--id-cols", "name"]  # fmt: skip
    assert run_cli(*args).returncode == 0
    record = json.loads((out / "part-00001.json").read_text())
    assert record["rows"] == 10 and len(record["sha256"]) == 64
    _flip(out / "part-00001.parquet", 500)
    res = run_cli(*args)
    assert res.returncode == 0, res.stderr
    assert "1 damaged written again" in res.stdout


# ---------------------------------------------------------------------- 8. every row failed
def test_embed_where_every_row_fails_writes_nothing(library, tmp_path):
    for out in (tmp_path / "e.npy", tmp_path / "parts"):
        extra = ["--part-rows", 10] if out.name == "parts" else []
        res = run_cli("embed", library, "--smiles-col", "num", "--out", out, "--device", "cpu",
                      *extra)  # fmt: skip
        assert_one_line_error(res, "--smiles-col 'num'", "none of the 24 rows", "row 0 '0': ",
                              "row 2 '2': ")  # fmt: skip
        assert not out.exists(), out
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_predict_where_every_row_fails_writes_nothing(finetuned, library, tmp_path):
    for out in (tmp_path / "p.csv", tmp_path / "parts"):
        extra = ["--part-rows", 10] if out.name == "parts" else []
        res = run_cli("predict", "--checkpoint", finetuned, "--input", library, "--smiles-col",
                      "num", "--out", out, *extra)  # fmt: skip
        assert_one_line_error(res, "--smiles-col 'num'", "none of the 24 rows", "row 1 '1': ")
        assert not out.exists(), out


# ---------------------------------------------------------------------- 14. --part-rows 0
@pytest.mark.parametrize("command", ["embed", "predict"])
def test_part_rows_0_is_refused(library, tmp_path, command):
    out = tmp_path / "out"
    args = (["embed", library] if command == "embed"
            else ["predict", "--checkpoint", tmp_path / "no-model", "--input", library])  # fmt: skip
    res = run_cli(*args, "--out", out, "--part-rows", 0)
    assert_one_line_error(res, "--part-rows 0", "expected a positive integer")
    assert not out.exists()


# ---------------------------------------------------------------------- 15. messages
@pytest.mark.parametrize("command", ["embed", "demo", "search", "predict"])
def test_a_model_file_for_its_folder_says_a_folder_is_expected(library, index, tmp_path, command):
    weights = DEFAULT_MODEL_DIR / "model.safetensors"
    args = {
        "embed": ["embed", library, "--out", tmp_path / "e.npy", "-c", weights],
        "demo": ["demo", "-c", weights],
        "search": ["search", index, "--query", QUERY, "-c", weights],
        "predict": ["predict", "--checkpoint", weights, "--input", library,
                    "--out", tmp_path / "p.csv"],
    }[command]  # fmt: skip
    res = run_cli(*args, "--device", "cpu") if command != "predict" else run_cli(*args)
    assert_one_line_error(res, "model.safetensors' is a file: expected a model folder",
                          f"in the folder '{DEFAULT_MODEL_DIR}'")  # fmt: skip


@pytest.mark.parametrize("command", ["preprocess", "tokenize", "embed"])
def test_a_binary_header_is_not_utf8_for_every_reader(tmp_path, command):
    table = tmp_path / "bin.csv"
    table.write_bytes(b"\xff\xfe\x00bad,\x80\x81\nC\xff,1\n")
    args = {"preprocess": ["preprocess", table, "--out", tmp_path / "ds", "--no-progress"],
            "tokenize": ["tokenize", "--file", table],
            "embed": ["embed", table, "--out", tmp_path / "e.npy"]}[command]  # fmt: skip
    assert_one_line_error(run_cli(*args), "bin.csv' is not UTF-8 text (byte b'\\xff' at offset 0)")


@pytest.mark.parametrize("ids", [[], ["--ids"]])
def test_an_empty_smiles_argument_is_an_error_with_or_without_ids(ids):
    res = run_cli("tokenize", "CCO", "", *ids)
    assert_one_line_error(res, "SMILES argument 2 is ''", "expected a non-empty SMILES")
    assert res.stdout == ""


def test_blank_lines_of_a_file_still_give_blank_lines(tmp_path):
    smi = tmp_path / "in.smi"
    smi.write_text("CCO\n\nc1ccccc1\n")
    res = run_cli("tokenize", "--file", smi, "--ids")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 3 and lines[1] == "" and lines[0].startswith("1 ")
    assert np.all([line.endswith(" 2") for line in (lines[0], lines[2])])


def test_a_smiles_of_a_file_that_does_not_tokenize_is_named_before_any_line_is_printed(tmp_path):
    smi = tmp_path / "in.smi"
    smi.write_text("CCO\nC%1\n")
    res = run_cli("tokenize", "--file", smi)
    assert_one_line_error(res, f"--file {str(smi)!r} SMILES 2", "'C%1' at character 1")
    assert res.stdout == ""


def test_a_file_with_no_smiles_is_named_not_taken_for_a_missing_option(tmp_path):
    (tmp_path / "empty.smi").write_text("")
    (tmp_path / "header.csv").write_text("smiles\n")
    for name in ("empty.smi", "header.csv"):
        res = run_cli("tokenize", "--file", tmp_path / name)
        assert_one_line_error(res, f"--file '{tmp_path / name}' holds no SMILES")


def test_search_refuses_no_hnsw_candidates(index):
    res = run_cli("search", index, "--query", QUERY, "-k", 1, "--ef-search", 0)
    assert_one_line_error(res, "--ef-search", "positive integer")


# ---------------------------------------------------------------------- 16. an output inside an input
def test_an_output_inside_an_input_folder_is_refused_before_any_compute(
    finetuned, parts, library, tmp_path
):
    model, emb, link = tmp_path / "M", tmp_path / "emb", tmp_path / "link"
    shutil.copytree(finetuned, model)
    shutil.copytree(parts, emb)
    link.symlink_to(model)
    kept = {p: p.read_bytes() for folder in (model, emb) for p in folder.iterdir()}
    predict = ["predict", "--checkpoint", model, "--input", library, "--out"]
    cases = [
        ([*predict, model / "model.safetensors"], "--checkpoint"),  # over the weights
        ([*predict, model / "finetune.json"], "--checkpoint"),  # over the model's record
        ([*predict, link / "preds"], "--checkpoint"),  # a new folder of parts, by a link
        (["select", emb, "-n", 5, "--out", emb / "manifest.json"], "INPUT"),
        (["index", emb, "--out", emb / "idx"], "EMBEDDINGS"),
        (["finetune", "mine", "--data", library, "--label-cols", "num", "--checkpoint", model,
          "--out", model / "runs"], "--checkpoint"),  # a report inside the backbone
    ]  # fmt: skip
    for args, source in cases:
        assert_one_line_error(run_cli(*args), "--out", f"lies inside the input {source}",
                              "(a folder)", "expected a path outside it")  # fmt: skip
    res = run_cli("predict", "--checkpoint", ".", "--input", library, "--out",
                  "model.safetensors", cwd=model)  # the folder named as "."  # fmt: skip
    assert_one_line_error(res, "--out 'model.safetensors' lies inside the input --checkpoint '.'")
    assert {p: p.read_bytes() for folder in (model, emb) for p in folder.iterdir()} == kept
    assert not any((folder / name).exists() for folder, name
                   in ((model, "preds"), (emb, "idx"), (model, "runs")))  # fmt: skip


def test_what_writes_beside_or_by_design_inside_an_input_is_not_refused(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    res = run_cli("plot-run", run, "--out", run / "loss.png")  # RUN/loss.png is its default
    assert res.returncode == 0 and (run / "loss.png").is_file(), res.stderr
    (tmp_path / "bbbp").mkdir()  # a task's name is no input folder, even when one is there
    res = run_cli("finetune", "bbbp", "--seeds", "0", "0", "--out", "bbbp/r", cwd=tmp_path)
    assert_one_line_error(res, "seed 0 is given more than once")


def test_the_shipped_models_are_never_written_into_however_the_model_is_named(tmp_path):
    """The default model (named by no option, by its name, or by its folder) and the twins are
    read-only: an output inside them is refused before any compute, and export-onnx refuses
    them as whiten does."""
    from smiexlm.modelio.layout import ASSETS_DIR

    before = sorted(p.relative_to(ASSETS_DIR) for p in ASSETS_DIR.rglob("*"))
    table = tmp_path / "t.csv"
    pd.DataFrame({"smiles": ["CCO", "CCN", "c1ccccc1"], "y": [0, 1, 0]}).to_csv(table, index=False)
    twin = ASSETS_DIR / "twins" / "mlm"
    for args, name in (
        (["embed", table, "--out", DEFAULT_MODEL_DIR / "emb.parquet"], "--out"),
        (["probe", "mine", "--data", table, "--label-cols", "y", "--checkpoint", "mlm", "--out",
          tmp_path / "p", "--save-dir", twin / "probe"], "--save-dir"),
        (["cliffs", table, "--label-col", "y", "--out", twin / "pairs.csv"], "--out"),
    ):  # fmt: skip
        assert_one_line_error(run_cli(*args), name, "lies inside the models shipped with smiexlm")
    assert_one_line_error(run_cli("export-onnx", twin), "is shipped with smiexlm and is read-only")
    assert sorted(p.relative_to(ASSETS_DIR) for p in ASSETS_DIR.rglob("*")) == before


def test_every_command_checks_its_outputs_can_be_written_before_any_compute(tmp_path):
    """Commands that check nothing of their own (the analyses) are checked by the wrapper of
    every command: /proc takes no file, whatever the modes say to root."""
    from smiexlm.modelio.layout import ASSETS_DIR

    smiles = tmp_path / "m.smi"
    smiles.write_text("CCO\nc1ccccc1\n")
    twin = ASSETS_DIR / "twins" / "mlm"
    for args in (["analyze", "rank", twin, "--smiles-file", smiles, "--out", "/proc/rank"],
                 ["analyze", "dag", ASSETS_DIR / "twins" / "exlm", "--smiles", "CCO", "--mask",
                  "1", "--out", "/proc/dag"]):  # fmt: skip
        assert_one_line_error(run_cli(*args), "--out '/proc/", "nothing can be written")
