"""Hostile edges: OS faults, outputs over inputs, planted links, loosely typed configs.

Each case is one a user met, the real command in a subprocess. An OS fault (a file past the
size the system allows, a cache folder that is a file) is one ``error:`` line naming the path
and the errno's words, or, for a cache, a note and a result; an output that names an input is
refused before any compute; a temporary is never opened through a link someone planted; a
config value of the wrong type is refused naming key, value and type. The shared mechanisms
live in ``smiexlm.cli.main`` (the wrapper of every command), ``smiexlm.errors``
(``storage_error``, ``check_field_types``) and ``smiexlm.paths`` (``check_outputs_apart``,
``atomic_paths``, ``keep_in_cache``).
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
from tests.conftest import smiexlm_command
from tests.integration.test_faults import assert_one_line_error, run_cli

SMILES = [f"C1{'C' * n}1{tail}" for n in range(2, 10) for tail in ("", "O", "N")]  # 24
FINETUNE = ("--seeds", "0", "--max-train-steps", "1", "--batch-size", "8", "--device", "cpu")


def _table(path: Path, **columns) -> Path:
    rng = random.Random(0)  # labels both splits of these 24 molecules can score
    frame = {"smiles": SMILES, "y": [rng.randint(0, 1) for _ in SMILES],
             "z": [rng.random() for _ in SMILES]}  # fmt: skip
    pd.DataFrame(frame | columns).to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    return _table(tmp_path_factory.mktemp("table") / "t.csv")


@pytest.fixture(scope="module")
def finetuned(table) -> Path:
    root = table.parent
    res = run_cli("finetune", "mine", "--data", table, "--label-cols", "y", *FINETUNE,
                  "--split", "random", "--out", root / "report", "--save-dir", root / "models")  # fmt: skip
    assert res.returncode == 0, res.stderr
    return root / "models" / "seed0"


def _limited(*args: object, max_bytes: int = 20_000, env: dict | None = None):
    """The command with files capped at ``max_bytes`` (RLIMIT_FSIZE; SIGXFSZ ignored, so a
    write past it fails with EFBIG, as a full disk fails with ENOSPC)."""

    def cap() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))

    return subprocess.run([smiexlm_command(), *map(str, args)], capture_output=True, text=True,
                          preexec_fn=cap, timeout=300, env=(env or os.environ) | {"OMP_NUM_THREADS": "1"})  # fmt: skip


# ---------------------------------------------------------------------- 1. OS faults
@pytest.mark.parametrize(
    "command, out, resumes",
    [("embed", "e.npy", ""), ("embed", "parts", "from its finished parts"),
     ("predict", "p.csv", ""), ("finetune", "report", "--resume goes on"),
     ("preprocess", "ds", "--resume goes on")],
)  # fmt: skip
def test_a_write_the_system_refuses_is_one_line_naming_the_path(
    tmp_path, table, finetuned, command, out, resumes
):
    big = tmp_path / "big.smi"
    big.write_text("".join(f"{'C' * i}O{'C' * j}N\n" for i in range(1, 60) for j in range(1, 60)))
    args = {
        "embed": ["embed", table, "--out", tmp_path / out, "--device", "cpu"]
        + (["--part-rows", "6"] if out == "parts" else []),
        "predict": ["predict", "--checkpoint", finetuned, "--input", table, "--out", tmp_path / out],
        "finetune": ["finetune", "mine", "--data", table, "--label-cols", "y", *FINETUNE,
                     "--split", "random", "--out", tmp_path / out, "--save-dir", tmp_path / "m"],
        "preprocess": ["preprocess", big, "--out", tmp_path / out, "--shard-size", "500"],
    }[command]  # fmt: skip
    res = _limited(*args, max_bytes={"parts": 8_000, "p.csv": 2_000}.get(out, 20_000))
    line = assert_one_line_error(res, str(tmp_path / out), "File too large (EFBIG)")
    assert resumes in line
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]  # nothing left behind


def test_a_path_through_a_file_is_one_line(tmp_path, table):
    (tmp_path / "afile").write_text("x")
    res = run_cli("finetune", "mine", "--data", table, "--label-cols", "y", *FINETUNE,
                  "--split", "random", "--out", tmp_path / "r", "--save-dir",
                  tmp_path / "afile" / "m")  # fmt: skip
    assert_one_line_error(res, "afile", "expected a folder")


# ---------------------------------------------------------------------- 2. a cache that cannot be made
def test_a_cache_that_cannot_be_made_is_skipped_and_said_once(tmp_path, table):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    env = os.environ | {"SMIEXLM_CACHE": str(blocker), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([smiexlm_command(), "finetune", "mine", "--data", str(table),
                          "--label-cols", "y", *FINETUNE, "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert (tmp_path / "r" / "results.json").is_file()


def test_keep_in_cache_goes_on_and_warns_once(tmp_path, monkeypatch, caplog):
    from smiexlm import paths

    blocker = tmp_path / "cache"
    blocker.write_text("x")
    monkeypatch.setenv("SMIEXLM_CACHE", str(blocker))
    monkeypatch.setattr(paths, "_CACHE_REFUSED", set())
    for name in ("a.json", "b.json"):
        assert not paths.keep_in_cache(blocker / "sub" / name, lambda tmp: tmp.write_text("{}"))
    said = [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]
    assert len(said) == 1 and str(blocker) in said[0] and blocker.read_text() == "x"


# ---------------------------------------------------------------------- 3. an output over an input
def test_an_output_naming_an_input_is_refused_before_any_compute(tmp_path, table, finetuned):
    own = tmp_path / "t.csv"
    own.write_bytes(table.read_bytes())
    os.link(own, tmp_path / "hard.csv")
    (tmp_path / "soft.csv").symlink_to(own)
    smi = tmp_path / "v.smi"
    smi.write_text("\n".join(SMILES) + "\n")
    kept = {p: p.read_bytes() for p in (own, smi)}
    cases = [
        (["predict", "--checkpoint", finetuned, "--input", own, "--out", own], "--out", "--input"),
        (["predict", "--checkpoint", finetuned, "--input", own, "--out", tmp_path / "hard.csv"],
         "same file by a link", "--input"),
        (["predict", "--checkpoint", finetuned, "--input", own, "--out", tmp_path / "soft.csv"],
         "same file by a link", "--input"),
        (["select", own, "--out", own, "--task", "z"], "--out", "INPUT"),
        (["widen", smi, smi], "OUT", "INPUT"),
        (["vocab", "build", smi, "--out", smi], "--out", "INPUTS"),
        (["embed", own, "--out", own], "--out", "INPUT"),
        (["finetune", "mine", "--data", own, "--label-cols", "y", "--save-dir", own], "--save-dir",
         "--data"),
    ]  # fmt: skip
    for args, *needles in cases:
        assert_one_line_error(run_cli(*args), *needles, "would replace it")
    assert {p: p.read_bytes() for p in kept} == kept


def test_an_input_named_as_a_side_file_or_inside_an_owned_folder_is_refused(tmp_path, table,
                                                                            finetuned):  # fmt: skip
    """The rejects file beside a one-file output, a .npy's ids, and any file of a parts or
    dataset folder the job fills are outputs too: an input there is refused, kept as it was."""
    rejects, ids = tmp_path / "e.rejects.csv", tmp_path / "n.ids.csv"
    owned, dotted = tmp_path / "owned", tmp_path / "zinc.v2"  # preprocess's, whatever its name
    owned.mkdir()
    dotted.mkdir()
    inside, vocab = owned / "rejects.csv", dotted / "vocab.json"
    for path in (rejects, ids, inside):
        path.write_bytes(table.read_bytes())
    vocab.write_bytes(DEFAULT_MODEL_DIR.joinpath("vocab.json").read_bytes())
    kept = {p: p.read_bytes() for p in (rejects, ids, inside, vocab)}
    cases = [
        (["embed", rejects, "--out", tmp_path / "e.parquet"], "side file", "would replace it"),
        (["predict", "--checkpoint", finetuned, "--input", rejects, "--out", tmp_path / "e.csv"],
         "side file", "would replace it"),
        (["embed", ids, "--out", tmp_path / "n.npy", "--id-cols", "y"], "side file"),
        (["embed", inside, "--out", owned], "lies inside --out", "could be written over"),
        (["preprocess", inside, "--out", owned], "lies inside --out", "could be written over"),
        (["preprocess", table, "--vocab", vocab, "--out", dotted], "lies inside --out"),
    ]  # fmt: skip
    for args, *needles in cases:
        assert_one_line_error(run_cli(*args), *needles)
    assert {p: p.read_bytes() for p in kept} == kept


def test_an_input_under_a_name_a_job_writes_in_its_folder_is_never_written_over(tmp_path,
                                                                                table):  # fmt: skip
    """finetune and baseline write results.csv (and more) into --out: an input of that name
    there is refused before any training, and is kept as it was."""
    project = tmp_path / "project"
    project.mkdir()
    data = project / "results.csv"
    data.write_bytes(table.read_bytes())
    for args in (["baseline", "--data", data, "--label-cols", "y", "--seeds", "0", "--n-trees",
                  "5", "--split", "random", "--out", project],
                 ["finetune", "mine", "--data", data, "--label-cols", "y", *FINETUNE, "--split",
                  "random", "--out", project]):  # fmt: skip
        assert_one_line_error(run_cli(*args), "results.csv", "would replace it")
        assert data.read_bytes() == table.read_bytes()
        assert sorted(p.name for p in project.iterdir()) == ["results.csv"]  # nothing ran


# ---------------------------------------------------------------------- 4. labels past float32
@pytest.mark.parametrize("value", ["1e39", "1e308", "-3.5e38"])
def test_a_regression_label_past_float32_is_refused_naming_its_line(tmp_path, value):
    path = tmp_path / "r.csv"
    labels = [str(0.1 * i) for i in range(len(SMILES))]
    labels[5] = value
    pd.DataFrame({"smiles": SMILES, "y": labels}).to_csv(path, index=False)
    res = run_cli("finetune", "mine", "--data", path, "--label-cols", "y", "--task-type",
                  "regression", *FINETUNE, "--out", tmp_path / "r")  # fmt: skip
    assert_one_line_error(res, "'y'", "line 7", f"{float(value):g}", "float32")


# ---------------------------------------------------------------------- 5, 6. typed configs
@pytest.mark.parametrize(
    "line, needle",
    [('freeze = "no"', "'freeze' = 'no': expected true or false"),
     ('lr = "fast"', "'lr' = 'fast': expected a finite number"),
     ("epochs = 2.5", "'epochs' = 2.5: expected an integer"),
     ("augment = true", "'augment' = True: expected an integer"),
     ('adam_betas = [0.9, "x"]', "'adam_betas'")],
)  # fmt: skip
def test_a_finetune_config_value_of_another_type_is_refused(tmp_path, table, line, needle):
    config = tmp_path / "c.toml"
    config.write_text(line + "\n")
    res = run_cli("finetune", "mine", "--data", table, "--label-cols", "y", *FINETUNE,
                  "--config", config, "--out", tmp_path / "r")  # fmt: skip
    assert_one_line_error(res, needle)
    assert not (tmp_path / "r").exists()


def test_a_pretrain_config_value_of_another_type_is_refused(tmp_path):
    config = tmp_path / "p.toml"
    config.write_text('[model]\npreset = "tiny"\nk = "4"\n')
    data = tmp_path / "data"  # beside the run: an output inside an input folder is refused
    data.mkdir()
    res = run_cli("pretrain", "--config", config, "--data", data, "--out", tmp_path / "r")
    assert_one_line_error(res, "'k' = '4': expected an integer")
    res = run_cli("pretrain", "--config", "mol_tiny_mlm", "--data", data, "--out",
                  tmp_path / "r", "tensorboard=1")  # fmt: skip
    assert_one_line_error(res, "'tensorboard' = 1: expected true or false")


def test_the_shipped_configs_pass_their_own_types():
    from smiexlm.finetuning.config import finetune_config, load_table
    from smiexlm.pretraining.config import load_config, shipped_configs

    for task in [k for k in load_table() if k != "defaults"]:
        finetune_config(task)
    for name in shipped_configs():
        load_config(name)


# ---------------------------------------------------------------------- 7. repeated columns
def test_a_column_named_twice_is_refused(tmp_path, table):
    res = run_cli("finetune", "mine", "--data", table, "--label-cols", "y", "y", *FINETUNE)
    assert_one_line_error(res, "--label-cols", "['y']", "more than once")
    res = run_cli("embed", table, "--out", tmp_path / "e.npy", "--id-cols", "z,z")
    assert_one_line_error(res, "--id-cols", "['z']", "more than once")


# ---------------------------------------------------------------------- 8-10, 14. select and predict's columns
def test_predict_keeps_every_input_column_and_select_reads_its_output(tmp_path, finetuned):
    source = _table(tmp_path / "in.csv", valid=["yes"] * len(SMILES), in_domain=range(24))
    res = run_cli("predict", "--checkpoint", finetuned, "--input", source, "--out",
                  tmp_path / "p.csv")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "kept as ['input_y', 'input_valid', 'input_in_domain']" in res.stderr
    preds = pd.read_csv(tmp_path / "p.csv")
    original = pd.read_csv(source)
    for column in ("y", "valid", "in_domain"):  # the input's own, untouched
        assert preds[f"input_{column}"].tolist() == original[column].tolist()
    assert preds["z"].tolist() == original["z"].tolist()
    assert preds["valid"].all() and preds["y"].between(0, 1).all()  # predict's own

    picked = run_cli("select", tmp_path / "p.csv", "-n", 3, "--out", tmp_path / "s.csv")
    assert picked.returncode == 0, picked.stderr  # the only label: y (untrained_tokens is not one)
    assert len(pd.read_csv(tmp_path / "s.csv")) == 3

    parts = tmp_path / "parts"
    res = run_cli("predict", "--checkpoint", finetuned, "--input", source, "--out", parts,
                  "--part-rows", 10)  # fmt: skip
    assert res.returncode == 0, res.stderr
    res = run_cli("select", parts, "-n", 3, "--out", tmp_path / "s2.csv")
    assert res.returncode == 0, res.stderr
    assert pd.read_csv(tmp_path / "s2.csv")["smiles"].tolist() == pd.read_csv(tmp_path / "s.csv")["smiles"].tolist()  # fmt: skip
    line = assert_one_line_error(run_cli("select", tmp_path / "p.csv", "--task", "smiles"),
                                 "--task 'smiles'", "holds text", "expected numbers")  # fmt: skip
    assert len(line) < 200

    # a .parquet name is written as Parquet, which select reads and writes again
    res = run_cli("predict", "--checkpoint", finetuned, "--input", source, "--out",
                  tmp_path / "p.parquet")  # fmt: skip
    assert res.returncode == 0, res.stderr
    written = pd.read_parquet(tmp_path / "p.parquet")  # the input's cells kept as text
    assert written.columns.tolist() == preds.columns.tolist()
    assert written["smiles"].tolist() == preds["smiles"].tolist()
    np.testing.assert_allclose(written["y"], preds["y"], rtol=1e-6)
    res = run_cli("select", tmp_path / "p.parquet", "-n", 3, "--out", tmp_path / "s.parquet")
    assert res.returncode == 0, res.stderr
    assert pd.read_parquet(tmp_path / "s.parquet")["smiles"].tolist() == pd.read_csv(tmp_path / "s.csv")["smiles"].tolist()  # fmt: skip


# ---------------------------------------------------------------------- 11. empty vocabularies
def test_vocab_build_of_no_molecule_is_refused(tmp_path):
    for name, text in (("empty.smi", ""), ("blank.smi", "\n  \n\n"), ("header.csv", "smiles\n")):
        (tmp_path / name).write_text(text)
        res = run_cli("vocab", "build", tmp_path / name, "--out", tmp_path / "v.json")
        assert_one_line_error(res, name, "no tokenizable SMILES")
    assert not (tmp_path / "v.json").exists()


def test_preprocess_refuses_a_vocabulary_that_leaves_the_corpus_unknown(tmp_path):
    corpus, other = tmp_path / "c.smi", tmp_path / "o.smi"
    corpus.write_text("\n".join(SMILES) + "\n")
    other.write_text("Cl\nBr\n")
    assert run_cli("vocab", "build", other, "--out", tmp_path / "v.json").returncode == 0
    res = run_cli("preprocess", corpus, "--out", tmp_path / "ds", "--vocab", tmp_path / "v.json")
    assert_one_line_error(res, "'" + str(tmp_path / "v.json"), "100.0% of the tokens",
                          "at most 1.0%", "vocab build")  # fmt: skip
    assert not (tmp_path / "ds").exists()
    res = run_cli("preprocess", corpus, "--out", tmp_path / "ds")
    assert res.returncode == 0 and "[UNK] tokens: 0 (0.000% of" in res.stdout, res.stderr


# ---------------------------------------------------------------------- 12. whitening of nothing
def test_whiten_refuses_a_corpus_of_one_molecule(tmp_path):
    corpus = tmp_path / "one.smi"
    corpus.write_text("CCO\n" * 400)
    res = run_cli("whiten", DEFAULT_MODEL_DIR, "--corpus", corpus, "--rows", 400,
                  "--out", tmp_path / "w", "--device", "cpu")  # fmt: skip
    assert_one_line_error(res, "one.smi", "(1 distinct) span 0 of their 128 directions",
                          "at least 8")  # fmt: skip
    assert not (tmp_path / "w").exists()


# ---------------------------------------------------------------------- 13. export with another dataset
def test_export_refuses_a_dataset_the_run_never_trained_on(shared_data, tmp_path):
    from smiexlm.pretraining.trainer import pretrain
    from tests.unit.pretraining.test_training import _config
    from tests.unit.pretraining.test_training_support import build_dataset

    source = shared_data / "pretrain" / "moses_test.smi.gz"
    data = build_dataset(source, tmp_path / "ds", n=200)
    other = build_dataset(source, tmp_path / "other", n=150)
    pretrain(_config(), data, tmp_path / "run", max_steps=2)
    res = run_cli("export", tmp_path / "run", "--out", tmp_path / "m", "--data", other)
    assert_one_line_error(res, "--data", "other", "not the dataset the run trained on")
    assert not (tmp_path / "m").exists()
    moved = tmp_path / "moved"
    data.rename(moved)  # the same dataset moved: its content id is kept
    res = run_cli("export", tmp_path / "run", "--out", tmp_path / "m", "--data", moved)
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------------- 15. planted links
PLANT = """
import os, sys
pid, victim, folder = os.getpid(), sys.argv[1], sys.argv[2]
for name in ("p.csv", "p.rejects.csv"):  # every name the writers ever gave a temporary
    stem, suffix = os.path.splitext(name)
    for planted in (f".{stem}.tmp-{pid}{suffix}", f".{name}.tmp-{pid}"):
        os.symlink(victim, os.path.join(folder, planted))
os.execv(sys.argv[3], sys.argv[3:])  # the same process, so the same PID
"""


def test_a_temporary_is_never_opened_through_a_planted_link(tmp_path, table, finetuned):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "out"
    out.mkdir()
    args = [smiexlm_command(), "predict", "--checkpoint", finetuned, "--input", table,
            "--out", out / "p.csv"]  # fmt: skip
    res = subprocess.run([sys.executable, "-c", PLANT, victim, out, *map(str, args)],
                         capture_output=True, text=True, timeout=300,
                         env=os.environ | {"OMP_NUM_THREADS": "1"})  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert victim.read_text() == "precious\n"
    assert not (out / "p.csv").is_symlink() and "smiles" in (out / "p.csv").read_text()


def test_stale_temporaries_are_removed_without_following_links(tmp_path):
    from smiexlm.atomic import atomic_path

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    dead = 2**22 + 12345  # above any PID this machine gives (pid_max is at most 2**22)
    (out / f".emb.npy.tmp-{dead}-abcdefgh").symlink_to(victim)
    with atomic_path(out / "emb.npy") as tmp:
        assert tmp.parent.parent == out and not tmp.parent.is_symlink()
        assert oct(tmp.parent.stat().st_mode)[-3:] == "700"  # only this user writes there
        tmp.write_bytes(b"new")
    assert (victim / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in out.iterdir()) == ["emb.npy"]


# ---------------------------------------------------------------------- the minor ones
def test_label_and_split_errors_count_lines_of_the_file(tmp_path):
    path = tmp_path / "t.csv"
    frame = pd.DataFrame({"smiles": SMILES, "y": [0, 1] * 12, "fold": ["train"] * 24})
    frame.loc[3, "y"] = 2
    frame.to_csv(path, index=False)
    res = run_cli("finetune", "mine", "--data", path, "--label-cols", "y", *FINETUNE)
    assert_one_line_error(res, "(line 5)")
    frame.loc[3, "y"], frame.loc[4, "fold"] = 1, "holdout"
    frame.to_csv(path, index=False)
    res = run_cli("finetune", "mine", "--data", path, "--label-cols", "y", *FINETUNE,
                  "--split", "column:fold")  # fmt: skip
    assert_one_line_error(res, "split column 'fold', line 6, holds 'holdout'")


def test_normalization_json_is_recorded_and_checked(tmp_path, table, finetuned):
    import shutil

    copy = tmp_path / "m"
    shutil.copytree(finetuned, copy)
    record = json.loads((copy / "checksums.json").read_text())["sha256"]
    meta = json.loads((copy / "finetune.json").read_text())
    assert "normalization.json" in record and meta["normalization"]["canonicalize"] is True
    path = copy / "normalization.json"
    path.write_text(path.read_text().replace("true", "false", 1))
    res = run_cli("predict", "--checkpoint", copy, "--input", table, "--out", tmp_path / "p.csv")
    assert_one_line_error(res, "normalization.json", "sha256")


def test_options_that_did_nothing_are_refused(tmp_path, table, finetuned):
    res = run_cli("predict", "--checkpoint", finetuned, "--input", table, "--out",
                  tmp_path / "p.csv", "--mondrian")  # fmt: skip
    assert_one_line_error(res, "--mondrian", "--conformal-alpha")
    assert_one_line_error(run_cli("tokenize", "C C"), "at character 1")  # exit 2, like the rest


def test_too_few_molecules_for_a_random_split_does_not_advise_a_random_split(tmp_path):
    path = tmp_path / "few.csv"
    pd.DataFrame({"smiles": SMILES[:3], "y": [0, 1, 0]}).to_csv(path, index=False)
    line = assert_one_line_error(
        run_cli("finetune", "mine", "--data", path, "--label-cols", "y", *FINETUNE,
                "--split", "random"), "labelled molecules"
    )  # fmt: skip
    assert "--split random" not in line


def test_offline_message_lists_each_folder_once(tmp_path):
    env = os.environ | {"SMIEXLM_OFFLINE": "1", "SMIEXLM_DATA": str(tmp_path),
                        "SMIEXLM_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}  # fmt: skip
    res = subprocess.run([smiexlm_command(), "probe", "bbbp"], capture_output=True, text=True,
                         env=env, timeout=120)  # fmt: skip
    line = assert_one_line_error(res, "SMIEXLM_OFFLINE is set")
    assert "network" not in line and line.count(str(tmp_path / "cache" / "moleculenet")) == 1


def test_interrupt_says_how_the_command_goes_on(tmp_path):
    table = tmp_path / "big.csv"
    table.write_text("smiles\n" + "".join(f"{SMILES[i % 24]}\n" for i in range(200_000)))
    proc = subprocess.Popen(
        [smiexlm_command(), "embed", str(table), "--out", str(tmp_path / "parts"),
         "--part-rows", "5000", "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / "parts").is_dir():
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "interrupted by SIGTERM; the same command goes on from its finished parts" in err
    assert "Traceback" not in err
