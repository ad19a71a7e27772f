"""Hostile input to embed, predict, finetune --data, preprocess and baseline.

Each case is one a user met: the real command runs in a subprocess and must end with exit
code 0 (every input row accounted for: an output row, a NaN row or a reject with its reason)
or exit code 2 with one ``error:`` line, never a crash or a traceback, and never after the
compute when the problem was knowable before it. The fuzz at the end drives the library's
table reader and normalisation with many generated files, and the real ``embed`` command
with a few of them.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smiexlm.errors import DataError
from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
from tests.conftest import smiexlm_command
from tests.integration.test_faults import assert_one_line_error, leftovers, run_cli

LONG = "C" * 100_000  # a valid SMILES whose canonicalisation used to segfault RDKit
SMILES = [f"C1{'C' * n}1{tail}" for n in range(2, 16) for tail in ("", "O", "N", "Cl")]


def _labelled(path: Path, labels, extra_rows: str = "") -> Path:
    frame = pd.DataFrame({"smiles": SMILES[: len(labels)], "y": labels})
    path.write_text(frame.to_csv(index=False) + extra_rows)
    return path


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory) -> Path:
    """``finetune mine --data`` on a CSV holding one 100,000-character SMILES."""
    root = tmp_path_factory.mktemp("finetuned")
    rng = random.Random(0)
    data = _labelled(root / "train.csv", [rng.randint(0, 1) for _ in SMILES], f"{LONG},1\n")
    res = run_cli("finetune", "mine", "--data", data, "--label-cols", "y", "--seeds", "0",
                  "--max-train-steps", "1", "--batch-size", "8", "--device", "cpu",
                  "--split", "random", "--out", root / "report", "--save-dir", root / "models")  # fmt: skip
    assert res.returncode == 0, res.stderr
    return root


# ---------------------------------------------------------------------- 1. a 100k SMILES
def test_embed_rejects_a_100k_character_smiles_before_rdkit(tmp_path):
    table = tmp_path / "in.csv"
    table.write_text(f"smiles,id\nCCO,a\n{LONG},b\nc1ccccc1,c\n")
    res = run_cli("embed", table, "--out", tmp_path / "e.npy", "--device", "cpu", timeout=60)
    assert res.returncode == 0, res.stderr
    emb = np.load(tmp_path / "e.npy")
    assert emb.shape[0] == 3 and np.isnan(emb[1]).all() and not np.isnan(emb[[0, 2]]).any()
    assert "row 1:" in res.stderr and "longer than 8,192 characters" in res.stderr
    rejects = pd.read_csv(tmp_path / "e.rejects.csv")
    assert rejects["row"].tolist() == [1] and rejects["reason"][0].startswith("longer than")
    huge = tmp_path / "huge.csv"  # past the csv module's 131,072-character field
    huge.write_text(f"smiles\nCCO\n{'C' * 200_000}\n")
    for args in (("embed", huge, "--out", tmp_path / "parts"), ("preprocess", huge, "--out",
                 tmp_path / "ds", "--no-progress")):  # fmt: skip
        res = run_cli(*args, timeout=120)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    kept = pd.read_csv(tmp_path / "parts" / "rejects.csv")["smiles"]
    assert kept.str.len().tolist() == [200_000]  # listed whole


def test_embed_lists_every_bad_row_not_only_the_first_ten(tmp_path):
    from smiexlm.embedding.embed import embed_file

    smiles = [("CCO" if i % 3 == 0 else f"C1C{i}") for i in range(40)]  # 26 unclosed rings
    table = tmp_path / "in.csv"
    pd.DataFrame({"smiles": smiles, "id": range(40)}).to_csv(table, index=False)
    result = embed_file(table, tmp_path / "e.parquet", progress=False, chunk_rows=8,
                        device="cpu")  # fmt: skip
    bad = [i for i, s in enumerate(smiles) if s != "CCO"]
    assert result.report.n_failed == len(bad) == 26 and len(result.report.failed) == 10
    rejects = pd.read_csv(result.rejects_path)
    assert result.rejects_path == tmp_path / "e.rejects.csv" and rejects["row"].tolist() == bad
    assert (rejects["smiles"] == [smiles[i] for i in bad]).all()
    assert set(rejects["reason"]) == {"RDKit cannot parse it"}
    embedded = pd.read_parquet(result.out)
    assert embedded["e0"].isna().tolist() == [s != "CCO" for s in smiles]
    (tmp_path / "ok.csv").write_text("smiles\nCCO\n")
    clean = embed_file(tmp_path / "ok.csv", tmp_path / "ok.npy", progress=False, device="cpu")
    assert pd.read_csv(clean.rejects_path).empty  # the header alone when nothing failed


def test_preprocess_rejects_a_100k_character_smiles_and_resume_passes_it(tmp_path):
    raw = tmp_path / "in.smi"
    raw.write_text(f"CCO\n{LONG} huge\nc1ccccc1\n")
    out = tmp_path / "ds"
    res = run_cli("preprocess", raw, "--out", out, "--no-progress", timeout=60)
    assert res.returncode == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["molecules_out"] == 2 and manifest["rejected"]["too_many_characters"] == 1
    rejects = pd.read_csv(out / "rejects.csv")
    assert rejects[["line", "reason"]].values.tolist() == [[2, "too_many_characters"]]
    again = run_cli("preprocess", raw, "--out", out, "--no-progress", "--resume", timeout=60)
    assert again.returncode == 0, again.stderr


def test_finetune_data_counts_a_100k_character_smiles_and_titles_the_report_by_name(finetuned):
    rows = pd.read_csv(finetuned / "report" / "results.csv")
    assert rows["n_invalid"].tolist() == [1] and rows["dataset"].tolist() == ["mine"]
    assert (finetuned / "report" / "report.md").read_text().startswith("# Fine-tuning mine\n")


def test_predict_gives_a_100k_character_smiles_a_nan_row_with_its_reason(tmp_path, finetuned):
    table = tmp_path / "in.csv"
    table.write_text(f"id,smiles\na,CCO\nb,{LONG}\nc,\n")
    out = tmp_path / "preds.csv"
    res = run_cli("predict", "--checkpoint", finetuned / "models" / "seed0", "--input", table,
                  "--out", out, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    preds = pd.read_csv(out)
    assert preds.valid.tolist() == [True, False, False]
    assert preds.y.isna().tolist() == [False, True, True]
    assert "row 1:" in res.stderr and "longer than 8,192 characters" in res.stderr
    assert "row 2: '' (empty string)" in res.stderr
    rejects = pd.read_csv(tmp_path / "preds.rejects.csv", keep_default_na=False)
    assert rejects["row"].tolist() == [1, 2] and rejects["reason"][1] == "empty string"


def test_a_missing_smiles_cell_is_a_blank_row_in_every_table_command(tmp_path, finetuned):
    """A Parquet file's null and a CSV's empty cell: pandas keeps them missing through
    ``astype(str)``; each is a blank SMILES, listed or dropped with its reason, never a
    traceback."""
    table = tmp_path / "nulls.parquet"
    pd.DataFrame({"smiles": ["CCCCCCCCO", None, "CCCCCCCCN", "c1ccccc1CCO"],
                  "y": [1.0, 2.0, None, 5.0]}).to_parquet(table)  # fmt: skip
    out = tmp_path / "preds.csv"
    res = run_cli("predict", "--checkpoint", finetuned / "models" / "seed0", "--input", table,
                  "--out", out, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    rejects = pd.read_csv(tmp_path / "preds.rejects.csv", keep_default_na=False)
    assert rejects.values.tolist() == [[1, "", "empty string"]]
    res = run_cli("cliffs", table, "--label-col", "y", "--out", tmp_path / "pairs.csv")
    assert res.returncode == 0, res.stderr
    listed = pd.read_csv(tmp_path / "pairs.rejects.csv", keep_default_na=False)
    assert listed.values.tolist()[0] == [1, "", "no SMILES"]
    labelled = _labelled(tmp_path / "blank.csv", [0, 1] * 6)
    lines = labelled.read_text().splitlines()
    labelled.write_text("\n".join([lines[0], ",1", *lines[1:]]) + "\n")
    res = run_cli("baseline", "--data", labelled, "--label-cols", "y", "--seeds", "0",
                  "--n-trees", "5", "--split", "random", "--out", tmp_path / "rf", timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert pd.read_csv(tmp_path / "rf" / "results.csv")["n_invalid"].tolist() == [1]


# ---------------------------------------------------------------------- 2. bad --out
def _bad_out_commands(tmp_path: Path, out: Path) -> dict[str, list]:
    """Each command, given an input that would fail *after* the --out check (a missing
    file), so that the one error proves the check came first."""
    missing = tmp_path / "missing.csv"
    model = tmp_path / "no-model"
    return {
        "embed": ["embed", missing, "--out", out / "e.npy"],
        "predict": ["predict", "--checkpoint", model, "--input", missing, "--out", out / "p.csv"],
        "finetune --out": ["finetune", "x", "--data", missing, "--label-cols", "y", "--out", out],
        "finetune --save-dir": ["finetune", "x", "--data", missing, "--label-cols", "y",
                                "--out", tmp_path / "ok", "--save-dir", out],
        "benchmark": ["benchmark", "--tasks", "nope", "--out", out],
        "baseline": ["baseline", "--data", missing, "--label-cols", "y", "--out", out],
        "preprocess": ["preprocess", missing, "--out", out],
    }  # fmt: skip


@pytest.mark.parametrize("command", list(_bad_out_commands(Path("."), Path("."))))
def test_an_out_under_a_regular_file_fails_before_any_compute(tmp_path, command):
    blocker = tmp_path / "afile"
    blocker.write_text("")
    args = _bad_out_commands(tmp_path, blocker / "sub")[command]
    res = run_cli(*args, timeout=60)
    assert_one_line_error(res, "afile' is a file, expected a folder")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores modes")
@pytest.mark.parametrize("command", ["embed", "finetune --out", "preprocess"])
def test_an_out_in_a_read_only_folder_fails_before_any_compute(tmp_path, command):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        res = run_cli(*_bad_out_commands(tmp_path, locked / "sub")[command], timeout=60)
        assert_one_line_error(res, "locked", "is not writable")
    finally:
        locked.chmod(0o755)


def test_embed_out_that_is_a_directory_is_one_line(tmp_path):
    table = tmp_path / "in.csv"
    table.write_text("smiles\nCCO\n")
    (tmp_path / "x.npy").mkdir()
    res = run_cli("embed", table, "--out", tmp_path / "x.npy", timeout=60)
    assert_one_line_error(res, "x.npy", "is a directory")
    (tmp_path / "y.csv").mkdir()  # a folder without a suffix would be a folder of parts
    (tmp_path / "model").mkdir()  # beside the output: one inside an input folder is refused
    res = run_cli("predict", "--checkpoint", tmp_path / "model", "--input", table,
                  "--out", tmp_path / "y.csv", timeout=60)  # fmt: skip
    assert_one_line_error(res, "--out", "is a directory")


def test_rows_of_more_fields_than_the_header_and_a_bom_in_a_smi_file(tmp_path):
    """Every row one field more than the header (pandas would make the first an index and
    shift the rest) is one line; a .smi file's byte-order mark is not part of its first SMILES."""
    from smiexlm.data.readers import iter_smiles, read_table

    ragged = tmp_path / "ragged.csv"
    ragged.write_text("smiles,alt\nCCO,CCN,O\nCCC,CCCl,C\n")
    with pytest.raises(DataError, match="more fields than its header's 2"):
        read_table(ragged)
    bom = tmp_path / "bom.smi"
    bom.write_bytes(b"\xef\xbb\xbfCCO first\nc1ccccc1\n")
    assert read_table(bom)["smiles"].tolist() == ["CCO", "c1ccccc1"]
    assert list(iter_smiles(bom)) == ["CCO", "c1ccccc1"]  # the pretraining corpus's reader


# ---------------------------------------------------------------------- 3. labels
def test_regression_labels_all_nan_fail_in_finetune_and_baseline(tmp_path):
    data = _labelled(tmp_path / "d.csv", [float("nan")] * 12)
    for command in ("finetune", "baseline"):
        res = run_cli(command, *(["mine"] if command == "finetune" else []), "--data", data,
                      "--label-cols", "y", "--task-type", "regression", "--out",
                      tmp_path / command, timeout=60)  # fmt: skip
        assert_one_line_error(res, "'y'", "0 labelled", "expected at least 3 numbers")
        assert not (tmp_path / command / "results.csv").exists()


def test_regression_label_infinity_and_classification_2_are_shown_plainly(tmp_path):
    data = _labelled(tmp_path / "d.csv", [1.5, float("inf")] + [0.5] * 10)
    res = run_cli("baseline", "--data", data, "--label-cols", "y", "--task-type", "regression",
                  "--out", tmp_path / "out", timeout=60)  # fmt: skip
    assert_one_line_error(res, "'y'", "line 3 = inf", "expected a finite number")
    data = _labelled(tmp_path / "d.csv", [0, 1, 2] + [0, 1] * 5)
    res = run_cli("finetune", "mine", "--data", data, "--label-cols", "y", "--out",
                  tmp_path / "out", timeout=60)  # fmt: skip
    line = assert_one_line_error(res, "'y'", "has value 2 (line 4)", "expected 0/1")
    assert "np." not in line


def test_true_false_labels_are_1_0_for_classification_and_refused_for_regression(tmp_path):
    from smiexlm.moleculenet import read_task

    words = ["True", "false", "TRUE", "False"] * 3
    data = _labelled(tmp_path / "d.csv", words)
    task = read_task(data, "smiles", ["y"], "classification")
    assert task.labels[:, 0].tolist() == [1.0, 0.0, 1.0, 0.0] * 3
    res = run_cli("baseline", "--data", data, "--label-cols", "y", "--task-type", "regression",
                  "--out", tmp_path / "out", timeout=60)  # fmt: skip
    assert_one_line_error(res, "'y'", "line 2 = 'True'", "expected a number")


# ---------------------------------------------------------------------- 4. messages
@pytest.mark.parametrize("command", ["embed", "predict", "finetune", "preprocess"])
def test_a_directory_as_input_is_named_as_a_directory(tmp_path, command):
    folder = tmp_path / "mols.csv"
    folder.mkdir()
    (tmp_path / "model").mkdir()
    args = {
        "embed": ["embed", folder, "--out", tmp_path / "e.npy"],
        "predict": ["predict", "--checkpoint", tmp_path / "model", "--input", folder, "--out",
                    tmp_path / "p.csv"],
        "finetune": ["finetune", "x", "--data", folder, "--label-cols", "y", "--out",
                     tmp_path / "report"],
        "preprocess": ["preprocess", folder, "--out", tmp_path / "ds"],
    }[command]  # fmt: skip
    line = assert_one_line_error(run_cli(*args, timeout=60), "mols.csv", "is a directory")
    assert "does not exist" not in line


def test_kill_9_during_embed_leaves_temporaries_that_the_next_run_removes(tmp_path):
    smiles = ["CC(=O)Oc1ccccc1C(=O)O", "c1ccccc1CC", "CCN(CC)CC(=O)Nc1ccccc1"]
    table = tmp_path / "in.csv"
    table.write_text("id,smiles\n" + "".join(f"m{i},{smiles[i % 3]}\n" for i in range(6000)))
    out = tmp_path / "emb.npy"
    proc = subprocess.Popen(
        [smiexlm_command(), "embed", str(table), "--out", str(out), "--device", "cpu"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None and not leftovers(tmp_path):
        time.sleep(0.02)
    assert proc.poll() is None, "embed ended before it wrote anything"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    left = leftovers(tmp_path)
    assert left and all(f".tmp-{proc.pid}-" in name for name in left)
    table.write_text("id,smiles\na,CCO\n")
    res = run_cli("embed", table, "--out", out, "--device", "cpu", timeout=60)
    assert res.returncode == 0, res.stderr
    from smiexlm.modelio.records import read_embedding

    own = read_embedding(DEFAULT_MODEL_DIR)  # the default's own pooling and blocks
    width = 128 * len(own.pooling.split("+")) * own.layers
    assert leftovers(tmp_path) == [] and np.load(out).shape == (1, width)


def test_blank_lines_are_counted_not_listed(tmp_path):
    raw = tmp_path / "in.smi"
    raw.write_text("CCO\n" + "\n" * 200_000 + "   \n\t\nc1ccccc1\nnot_a_smiles\n")
    out = tmp_path / "ds"
    res = run_cli("preprocess", raw, "--out", out, "--no-progress", timeout=60)
    assert res.returncode == 0, res.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["rejected"]["empty"] == 200_002 and manifest["molecules_out"] == 2
    assert "empty=200002" in res.stdout
    rejects = pd.read_csv(out / "rejects.csv")
    assert rejects.reason.tolist() == ["invalid_smiles"]  # the one real reject, listed


def test_huge_rdkit2d_descriptors_become_counted_nans_not_numpy_warnings(tmp_path):
    smiles = [*SMILES, "C" * 170, "C" * 80]  # Ipc 8e44 (past float32) and 1e17
    data = tmp_path / "d.csv"
    pd.DataFrame({"smiles": smiles, "y": [i % 2 for i in range(len(smiles))]}).to_csv(data)
    res = run_cli("baseline", "--data", data, "--label-cols", "y", "--features", "rdkit2d",
                  "--n-trees", "5", "--seeds", "0", "--split", "random", "--out",
                  tmp_path / "out", timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "RuntimeWarning" not in res.stderr and "overflow" not in res.stderr
    assert "rdkit2d: 2 descriptor values beyond ±1e+15 (Ipc) set to NaN" in res.stderr


def test_an_input_column_named_like_an_embedding_column_is_refused_before_any_compute(tmp_path):
    table = tmp_path / "clash.csv"
    table.write_text("mol,name,e0\nCCO,a,1\nCCC,b,2\n")
    for out in ("emb.parquet", "parts"):
        res = run_cli("embed", table, "--smiles-col", "mol", "--out", tmp_path / out)
        assert_one_line_error(res, "['e0'] are named like the embedding columns")
        assert not (tmp_path / out).exists()
    res = run_cli("embed", table, "--smiles-col", "mol", "--id-cols", "name", "--out",
                  tmp_path / "emb.parquet")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert list(pd.read_parquet(tmp_path / "emb.parquet").columns[:3]) == ["name", "mol", "e0"]


def test_python_predict_takes_what_featurize_takes_and_gives_bad_values_nan_rows(finetuned):
    from smiexlm.errors import ConfigError, DataError
    from smiexlm.serving.prediction import predict

    model = finetuned / "models" / "seed0"
    frame = predict(model, pd.Series(["CCO", np.nan, 5, "C C", "CCÖ", " CCN "]))
    assert frame["valid"].tolist() == [True, False, False, False, False, True]
    assert frame["y"].isna().tolist() == [False, True, True, True, True, False]
    assert predict(model, (s for s in ["CCO", "CCN"]))["valid"].tolist() == [True, True]
    for bad, words in (("CCO", "got one 'CCO'"), (pd.DataFrame({"smiles": ["CCO"]}), "DataFrame")):
        with pytest.raises(DataError, match=words):
            predict(model, bad)
    assert predict(model, ["XYZ"])["valid"].tolist() == [False] and len(predict(model, [])) == 0
    with pytest.raises(ConfigError, match="batch_size"):
        predict(model, ["CCO"], batch_size=0)


def test_a_character_beyond_ascii_is_a_reason_not_dropped_by_rdkit(tmp_path):
    """RDKit reads ``CCÖ`` as ``CC`` (a last character it cannot place is dropped unsaid):
    such a molecule would be served as another one. Every path refuses it, naming it."""
    texts = ["CCÖ", "CC\uff2f", "c1ccccc1Cl\u00b2", "CCO"]
    _, reasons, _ = _featurizer().prepare(texts)
    assert [r is not None and "beyond ASCII" in r for r in reasons] == [True, True, True, False]
    assert "'Ö' at position 2" in reasons[0]
    raw = tmp_path / "in.smi"
    raw.write_text("\n".join(texts) + "\n", encoding="utf-8")
    res = run_cli("preprocess", raw, "--out", tmp_path / "ds", "--no-progress")
    assert res.returncode == 0, res.stderr
    rejects = pd.read_csv(tmp_path / "ds" / "rejects.csv")
    assert rejects["line"].tolist() == [1, 2, 3]


# ---------------------------------------------------------------------- 5. fuzz
HOSTILE = [
    b"CCO", b"c1ccccc1", b"C" * 9000, LONG.encode(), b"C\x00C", b"\x00", b"caf\xe9",
    b"\xff\xfe", b'"', b'"CC,O"', b'""', b"\r", b"C\rC", b" ", b"\t", b"", b"[Na+].[Cl-]",
    "é".encode(), "CC\u2028O".encode(),
]  # fmt: skip
FIELDS = st.one_of(st.text(max_size=12), st.binary(max_size=12), st.sampled_from(HOSTILE))
ROWS = st.lists(st.lists(FIELDS, min_size=1, max_size=3), max_size=8)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip

_FEATURIZER: list = []


def _featurizer():
    if not _FEATURIZER:
        from smiexlm import Featurizer

        _FEATURIZER.append(Featurizer.from_pretrained(device="cpu"))
    return _FEATURIZER[0]


def _hostile_file(folder: Path, rows: list[list], suffix: str) -> Path:
    """Rows of text or raw bytes (any encoding), joined by commas and line breaks."""
    cells = [[v if isinstance(v, bytes) else v.encode() for v in row] for row in rows]
    body = b"".join(b",".join(row) + b"\n" for row in cells)
    path = folder / f"in{suffix}"
    path.write_bytes((b"smiles,id\n" if suffix == ".csv" else b"") + body)
    return path


def _accounted(values: list) -> None:
    """Every value gets token ids or a reason, never both, never neither."""
    ids, reasons, _ = _featurizer().prepare(values)
    assert len(ids) == len(reasons) == len(values)
    assert all((row is None) != (why is None) for row, why in zip(ids, reasons, strict=True))


@FUZZ
@given(rows=ROWS, suffix=st.sampled_from([".csv", ".smi"]))
def test_fuzz_table_readers_and_normalisation_account_for_every_row(tmp_path, rows, suffix):
    from smiexlm.data.normalize import NormalizeConfig, process_chunk
    from smiexlm.data.readers import iter_table, read_chunks
    from smiexlm.tokenizer import SmilesTokenizer
    from smiexlm.tokenizer.fast import ChunkEncoder

    path = _hostile_file(tmp_path, rows, suffix)
    try:  # embed's and predict's reader; a whole-file DataError is an answer too
        for frame in iter_table(path, "smiles", chunk_rows=4):
            _accounted(frame["smiles"].tolist())
    except DataError:
        pass
    encoder = ChunkEncoder(SmilesTokenizer())
    try:  # preprocess's reader
        for lines, items in read_chunks(path, 4, "smiles" if suffix == ".csv" else None):
            result = process_chunk(items, NormalizeConfig(), encoder)
            assert len(result.rows) + len(result.rejects) == result.n_rows == len(lines)
    except DataError:
        pass


@FUZZ
@given(st.lists(st.one_of(
    st.text(max_size=20), st.text(st.characters(categories=["Cs"]), max_size=3),  # surrogates
    st.sampled_from([v.decode("latin-1") for v in HOSTILE]), st.none(), st.floats(),
    st.integers())))  # fmt: skip
def test_fuzz_featurizer_and_predict_checks_take_any_python_value(values):
    from smiexlm.data.normalize import smiles_problem

    _accounted(values)
    for value in values:
        if isinstance(value, str):
            assert smiles_problem(value) is None or isinstance(smiles_problem(value), str)


def test_embed_on_generated_hostile_files_exits_0_or_2_and_accounts_for_rows(tmp_path):
    from smiexlm.data.readers import read_table

    rng = random.Random(7)
    pool = [v for v in HOSTILE if len(v) < 9000] + [LONG.encode()]
    for case in range(4):
        folder = tmp_path / f"case{case}"
        folder.mkdir()
        rows = [[rng.choice(pool), str(i).encode()] for i in range(rng.randint(4, 12))]
        if case < 2:  # valid UTF-8 files, so that some cases surely embed
            rows = [row for row in rows if row[0].isascii()] + [[b"CCO", b"x"]]
        path = _hostile_file(folder, rows, ".csv")
        res = run_cli("embed", path, "--out", folder / "e.npy", "--device", "cpu", timeout=60)
        assert res.returncode in (0, 2), (path.read_bytes()[:200], res.stderr[-2000:])
        assert "Traceback" not in res.stderr
        if res.returncode == 2:
            assert_one_line_error(res)
            continue
        n_rows = len(read_table(path, "smiles"))
        emb = np.load(folder / "e.npy")
        n_nan = int(np.isnan(emb).all(axis=1).sum())
        assert emb.shape[0] == n_rows and f"{n_rows:,} SMILES, {n_nan:,} failed" in res.stdout


# ---------------------------------------------------------------------- a column named twice
def _twice_named(folder: Path, suffix: str) -> Path:
    """A table whose header is ``id,smiles,y,y`` (pandas would read ``y`` and ``y.1``)."""
    path = folder / f"mols{suffix}"
    rows = [(f"m{i}", s, str(i % 2), str(1 - i % 2)) for i, s in enumerate(SMILES[:12])]
    if suffix == ".parquet":  # pandas refuses to write repeats; pyarrow writes them
        import pyarrow as pa
        import pyarrow.parquet as pq

        names = ["id", "smiles", "y", "y"]
        pq.write_table(pa.table([pa.array(c) for c in zip(*rows, strict=True)], names=names), path)  # fmt: skip
        return path
    sep = "\t" if suffix == ".tsv" else ","
    path.write_text("\n".join(sep.join(r) for r in [("id", "smiles", "y", "y"), *rows]) + "\n")
    return path


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".parquet"])
def test_a_header_naming_a_column_twice_is_one_line_for_every_command(tmp_path, finetuned, suffix):
    path = _twice_named(tmp_path, suffix)
    commands = {
        "finetune": ["finetune", "mine", "--data", path, "--label-cols", "y", "--seeds", "0",
                     "--max-train-steps", "1", "--device", "cpu", "--split", "random",
                     "--out", tmp_path / "report"],
        "predict": ["predict", "--checkpoint", finetuned / "models" / "seed0", "--input", path,
                    "--out", tmp_path / "p.csv"],
        "embed": ["embed", path, "--out", tmp_path / "e.npy", "--device", "cpu"],
    }  # fmt: skip
    for args in commands.values():
        res = run_cli(*args, timeout=120)
        assert_one_line_error(res, path.name, "names the column 'y' 2 times", "columns 3 and 4")
    assert not any((tmp_path / n).exists() for n in ("report", "p.csv", "e.npy"))


def test_the_header_check_reads_the_header_as_written_in_every_reader(tmp_path):
    from smiexlm.data.readers import iter_table, read_chunks, read_table

    path = _twice_named(tmp_path, ".csv")
    for read in (lambda: next(iter_table(path, chunk_rows=2)),  # chunks: checked once, first
                 lambda: read_table(path, infer_types=True),
                 lambda: next(read_chunks(path, 4, "smiles"))):  # fmt: skip
        with pytest.raises(DataError, match=r"'y' 2 times \(columns 3 and 4"):
            read()
    # repeats pandas would not have made: blank names, a real "y.1", blank lines before it
    fine = tmp_path / "fine.csv"
    fine.write_text("\n  \nid,smiles,y,y.1,,\nm0,CCO,1,0,,\n")
    assert read_table(fine).columns.tolist() == ["id", "smiles", "y", "y.1", "Unnamed: 4",
                                                 "Unnamed: 5"]  # fmt: skip
    three = tmp_path / "three.tsv"
    three.write_text("smiles\ty\tid\ty\ty\nCCO\t1\ta\t2\t3\n")
    with pytest.raises(DataError, match=r"three.tsv.*'y' 3 times \(columns 2, 4 and 5"):
        read_table(three)
