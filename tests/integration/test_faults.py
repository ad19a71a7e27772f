"""Fault injection: truncated, corrupted and interrupted inputs and outputs.

Each test is a user's command (the real ``smiexlm`` entry point, in a subprocess) plus the
exit code and message it must give. A bad input ends with exit code 2 and one line on stderr
that names the file and the problem, never a traceback; an interrupted command leaves the
previous result whole and no partial file under a final name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from tests.conftest import smiexlm_command
from tests.warm_cli import run_smiexlm

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "smiexlm" / "assets" / "default_model"


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_smiexlm(*args, cwd=cwd, timeout=timeout, env=os.environ | {"OMP_NUM_THREADS": "1"})


def assert_one_line_error(res: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, no traceback, one ``error:`` line that contains every needle."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def default_sigint() -> None:
    """``preexec_fn`` giving the child the default SIGINT: a shell starts background jobs with
    SIGINT ignored, and an ignored signal stays ignored across exec, so a test run launched
    with ``&`` would otherwise see Ctrl-C have no effect."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def leftovers(folder: Path) -> list[str]:
    """Temporary files an interrupted writer left behind (there must be none)."""
    return sorted(p.name for p in folder.rglob("*") if ".tmp" in p.name)


# ---------------------------------------------------------------------- DAG loss
@pytest.mark.parametrize("impl", ["reference", "matmul"])
def test_dag_backward_when_every_target_has_length_one(monkeypatch, impl):
    from smiexlm.dag import dag_log_likelihood

    monkeypatch.setenv("SMIEXLM_DAG_IMPL", impl)
    em = torch.randn(3, 1, 4, dtype=torch.float64, requires_grad=True)  # (B, M=1, L)
    links = torch.randn(3, 4, 4, dtype=torch.float64, requires_grad=True)
    s, m = torch.tensor([1, 3, 1]), torch.tensor([1, 1, 1])
    ll = dag_log_likelihood(em, links, s, m)
    finite = torch.isfinite(ll)
    assert finite.tolist() == [True, False, True]  # S = 3, M = 1: no path ends at state 2
    ll[finite].sum().backward()
    assert torch.equal(links.grad, torch.zeros_like(links))  # no transition is taken
    assert em.grad[0, 0, 0] == 1.0 and em.grad[2, 0, 0] == 1.0


# ---------------------------------------------------------------------- atomic writes
def test_atomic_paths_keep_the_old_result_on_error(tmp_path):
    from smiexlm.atomic import atomic_paths

    a, b = tmp_path / "emb.npy", tmp_path / "emb.ids.csv"
    a.write_text("old a")
    b.write_text("old b")
    with pytest.raises(RuntimeError), atomic_paths(a, b) as (ta, tb):
        ta.write_text("new a")
        raise RuntimeError("interrupted while writing the second file")
    assert (a.read_text(), b.read_text()) == ("old a", "old b")
    assert leftovers(tmp_path) == []
    with atomic_paths(a, b) as (ta, tb):
        ta.write_text("new a")
        tb.write_text("new b")
        assert a.read_text() == "old a"  # nothing visible before the block ends
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------------- embed
@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    from tests.unit.featurizer.test_featurizer import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("model"))


def test_embed_empty_csv_is_an_error_not_a_0_row_array(tmp_path, small_model):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    res = run_cli("embed", empty, "--out", tmp_path / "e.npy", "-c", small_model)
    assert_one_line_error(res, "empty.csv", "is empty")
    header = tmp_path / "header.csv"
    header.write_text("smiles,id\n")
    res = run_cli("embed", header, "--out", tmp_path / "e.npy", "-c", small_model)
    assert_one_line_error(res, "header.csv", "no rows")
    blank = tmp_path / "blank.smi"
    blank.write_text("\n  \n")
    res = run_cli("embed", blank, "--out", tmp_path / "e.npy", "-c", small_model)
    assert_one_line_error(res, "blank.smi", "no rows")
    assert not (tmp_path / "e.npy").exists()


def test_embed_binary_file_is_one_line(tmp_path, small_model):
    binary = tmp_path / "mols.csv"
    binary.write_bytes(b"smiles\nCCO\n" + bytes(range(128, 256)) * 4)
    res = run_cli("embed", binary, "--out", tmp_path / "e.npy", "-c", small_model)
    assert_one_line_error(res, "mols.csv", "not UTF-8")


def test_embed_whitespace_like_preprocess_and_long_smiles_shortened(tmp_path, small_model):
    table = tmp_path / "t.csv"
    long = "C" * 5000
    table.write_text(f"smiles,id\n  CCCC  ,a\n\tCCOCC,b\n{long},c\n,d\n")
    res = run_cli("embed", table, "--out", tmp_path / "e.parquet", "-c", small_model)
    assert res.returncode == 0, res.stderr
    got = pd.read_parquet(tmp_path / "e.parquet").filter(regex=r"^e\d+$").to_numpy()
    assert not np.isnan(got[:2]).any() and np.isnan(got[2:]).all()
    assert "(5,000 characters)" in res.stderr and long not in res.stderr + res.stdout
    assert res.stderr.count("row 2:") == 1 and res.stderr.count("row 3:") == 1  # listed once
    smi = tmp_path / "w.smi"
    smi.write_text("  CCCC  \n\tCCOCC\n")
    res = run_cli("preprocess", smi, "--out", tmp_path / "ds", "--no-progress")
    assert res.returncode == 0, res.stderr
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["molecules_out"] == 2 and manifest["rejected"]["empty"] == 0


def _slow_table(path: Path, n: int = 4000) -> Path:
    smiles = ["CC(=O)Oc1ccccc1C(=O)O", "c1ccccc1CC", "CCN(CC)CC(=O)Nc1ccccc1"]
    rows = [f"m{i},{smiles[i % 3]}{'C' * (i % 7)}" for i in range(n)]
    path.write_text("id,smiles\n" + "\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_embed_interrupted_keeps_the_previous_result(tmp_path, small_model, sig):
    table = _slow_table(tmp_path / "in.csv")
    out = tmp_path / "emb.npy"
    out.write_bytes(b"previous embeddings")
    (tmp_path / "emb.ids.csv").write_text("previous ids\n")
    proc = subprocess.Popen(
        [smiexlm_command(), "embed", str(table), "--out", str(out), "-c", str(small_model),
         "--device", "cpu"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"OMP_NUM_THREADS": "1"}, preexec_fn=default_sigint,
    )  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not leftovers(tmp_path):
        time.sleep(0.02)  # poll until the first temporary is there: the outputs are being made
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(sig)  # lands anywhere from making the other temporaries to writing rows
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr  # unwound by the handler, not killed outright
    assert f"interrupted by {'SIGTERM' if sig == signal.SIGTERM else 'Ctrl-C'}" in stderr
    assert out.read_bytes() == b"previous embeddings"
    assert (tmp_path / "emb.ids.csv").read_text() == "previous ids\n"
    assert leftovers(tmp_path) == []  # the process has ended: nothing can still remove them
    # the same command run to the end replaces both files as one unit
    res = run_cli("embed", table, "--out", out, "-c", small_model, "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert leftovers(tmp_path) == []
    assert np.load(out).shape == (4000, 128)
    assert pd.read_csv(tmp_path / "emb.ids.csv").id.tolist() == [f"m{i}" for i in range(4000)]


def test_embed_streams_in_chunks_with_the_same_result(tmp_path, small_model):
    from smiexlm import Featurizer
    from smiexlm.embedding.embed import embed_file

    table = _slow_table(tmp_path / "in.csv", n=50)
    one = embed_file(table, tmp_path / "a.npy", checkpoint=small_model, progress=False)
    many = embed_file(table, tmp_path / "b.parquet", checkpoint=small_model, progress=False,
                      chunk_rows=7)  # fmt: skip
    assert one.n_rows == many.n_rows == 50
    a = np.load(tmp_path / "a.npy")
    b = pd.read_parquet(tmp_path / "b.parquet")
    assert b.id.tolist() == [f"m{i}" for i in range(50)]
    np.testing.assert_allclose(b.filter(regex=r"^e\d+$").to_numpy(), a, atol=1e-5)
    ref = Featurizer.from_pretrained(small_model).featurize(pd.read_csv(table).smiles)
    np.testing.assert_allclose(a, ref, atol=1e-5)


# ---------------------------------------------------------------------- model folders
def _model_copy(tmp_path: Path) -> Path:
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(DEFAULT_MODEL, folder)
    return folder


@pytest.mark.parametrize("damage", ["truncate", "random"])
def test_broken_model_safetensors_is_one_line(tmp_path, damage):
    folder = _model_copy(tmp_path)
    weights = folder / "model.safetensors"
    if damage == "truncate":
        os.truncate(weights, weights.stat().st_size // 2)
    else:
        weights.write_bytes(np.random.default_rng(0).bytes(4096))
    table = tmp_path / "t.csv"
    table.write_text("smiles\nCCO\n")
    res = run_cli("embed", table, "--out", tmp_path / "e.npy", "-c", folder)
    assert_one_line_error(res, "model.safetensors", "truncated or corrupted")


def test_model_config_not_json_is_one_line(tmp_path):
    folder = _model_copy(tmp_path)
    (folder / "config.json").write_text("{not json")
    table = tmp_path / "t.csv"
    table.write_text("smiles\nCCO\n")
    res = run_cli("embed", table, "--out", tmp_path / "e.npy", "-c", folder)
    assert_one_line_error(res, "config.json", "not valid JSON")


# ---------------------------------------------------------------------- tokenize
def test_tokenize_file_missing_binary_and_blank_lines(tmp_path):
    assert_one_line_error(run_cli("tokenize", "--file", tmp_path / "nope.smi"),
                          "nope.smi", "does not exist")  # fmt: skip
    binary = tmp_path / "bin.smi"
    binary.write_bytes(b"CCO\n\xff\xfe\x00\x01\n")
    assert_one_line_error(run_cli("tokenize", "--file", binary), "bin.smi", "not UTF-8")
    smi = tmp_path / "in.smi"
    smi.write_text("CCO a\n\n  c1ccccc1  b\n")
    res = run_cli("tokenize", "--file", smi)
    assert res.returncode == 0 and res.stdout.splitlines() == ["C C O", "", "c 1 c c c c c 1"]


# ---------------------------------------------------------------------- usage errors
@pytest.mark.parametrize(("args", "needles"), [
    (["select", "t.csv", "-n", "0"], ["smiexlm select:", "'-n'", "greater than or equal to 1",
                                      "(got '0')", "smiexlm select --help"]),
    (["finetune", "bbbp", "--seed", "1"], ["No such option: --seed", "--seeds"]),
    (["analyze", "entropy"], ["smiexlm analyze entropy: Missing argument 'checkpoints'"]),
    (["nosuch"], ["No such command 'nosuch'"]),
])  # fmt: skip
def test_a_usage_error_is_one_line_naming_the_option_and_the_value(args, needles):
    res = run_cli(*args)
    assert_one_line_error(res, *needles)
    assert "╭" not in res.stderr + res.stdout and "Usage:" not in res.stderr


def test_a_bare_group_shows_its_help():
    res = run_cli("analyze")
    assert res.returncode == 2 and "entropy" in res.stdout + res.stderr


# ---------------------------------------------------------------------- preprocess
@pytest.mark.parametrize("content", ["", "not_a_smiles\n\nC1CC\n  \n"])
def test_preprocess_with_no_molecule_fails_and_leaves_nothing(tmp_path, content):
    raw = tmp_path / "in.smi"
    raw.write_text(content)
    out = tmp_path / "ds"
    res = run_cli("preprocess", raw, "--out", out, "--no-progress")
    assert_one_line_error(res, "in.smi", "gave no molecule", "nothing was written")
    assert not out.exists()
    raw.write_text("CCO\n")  # the same command on good input needs no --resume
    assert run_cli("preprocess", raw, "--out", out, "--no-progress").returncode == 0


def test_preprocess_interrupted_before_its_first_shard_leaves_nothing(tmp_path):
    raw = tmp_path / "in.smi"
    raw.write_text("\n".join(["CCO", "c1ccccc1", "CC(=O)O"] * 40000) + "\n")
    out = tmp_path / "ds"
    proc = subprocess.Popen([smiexlm_command(), "preprocess", str(raw), "--out", str(out),
                             "--no-progress"], stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)  # fmt: skip
    deadline = time.time() + 60
    while time.time() < deadline and not (out / "progress.json").exists():
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode != 0 and not out.exists()


def test_preprocess_interrupted_while_it_starts_its_folder_leaves_nothing(tmp_path, monkeypatch):
    """The interrupt lands just after ``progress.json`` first appears, before any chunk."""
    from smiexlm.data import preprocess
    from smiexlm.data.preprocess_run import PreprocessRun
    from smiexlm.errors import DataError

    def interrupted(self, complete=False):
        saving(self, complete)
        raise KeyboardInterrupt

    saving = PreprocessRun.save_progress
    monkeypatch.setattr(PreprocessRun, "save_progress", interrupted)
    raw = tmp_path / "in.smi"
    raw.write_text("CCO\nc1ccccc1\n")
    with pytest.raises(KeyboardInterrupt):
        preprocess([raw], tmp_path / "ds", progress=False)
    assert not (tmp_path / "ds").exists()
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "manifest.json").write_text("{}")  # someone else's folder stays whole
    monkeypatch.setattr(PreprocessRun, "save_progress", saving)
    with pytest.raises(DataError, match="already holds a dataset"):
        preprocess([raw], tmp_path / "ds", progress=False)
    assert (tmp_path / "ds" / "manifest.json").read_text() == "{}"


# ---------------------------------------------------------------------- datasets and runs
@pytest.fixture(scope="module")
def dataset(shared_data, tmp_path_factory):
    from tests.unit.pretraining.test_training_support import build_dataset

    source = shared_data / "pretrain" / "moses_test.smi.gz"
    return build_dataset(source, tmp_path_factory.mktemp("data") / "ds", n=300)


def _pretrain_args(data: Path, out: Path, *extra: str) -> list[str]:
    from tests.unit.pretraining.test_training_support import FAST, MICRO_MODEL

    return ["pretrain", "--config", "mol_tiny_exlm", *MICRO_MODEL, *FAST,
            "--data", str(data), "--out", str(out), *extra]  # fmt: skip


def _damaged_copy(dataset: Path, tmp_path: Path, damage: str) -> tuple[Path, str]:
    """A copy of the dataset with one fault; returns it and the file the error must name."""
    import shutil

    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    manifest_path = copy / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    shard = manifest["splits"]["train"]["shards"][0]["name"]
    bin_path = copy / f"{shard}.bin"
    if damage == "truncated_bin":
        os.truncate(bin_path, bin_path.stat().st_size - 7)
        return copy, f"{shard}.bin"
    if damage == "manifest_not_json":
        manifest_path.write_text(manifest_path.read_text()[:-40])
        return copy, "manifest.json"
    if damage == "impossible_counts":
        manifest["splits"]["train"]["tokens"] = 10**9
        manifest["duplicates"] = -3
    elif damage == "changed_bin":  # same size, other bytes: only the sha256 sees it
        ids = np.fromfile(bin_path, dtype="<u2")
        ids[1] = ids[1] - 1 if ids[1] > 5 else ids[1] + 1  # still a valid token id
        ids.tofile(bin_path)
        return copy, f"{shard}.bin"
    elif damage == "out_of_range_ids":  # a dataset without recorded hashes
        for entry in manifest["splits"]["train"]["shards"]:
            entry.pop("sha256", None)
        ids = np.fromfile(bin_path, dtype="<u2")
        ids[1] = 60000
        ids.tofile(bin_path)
    manifest_path.write_text(json.dumps(manifest))
    return copy, (f"{shard}.bin" if damage == "out_of_range_ids" else "manifest.json")


@pytest.mark.parametrize("damage, problem", [
    ("truncated_bin", "truncated"),
    ("manifest_not_json", "not valid JSON"),
    ("impossible_counts", "tokens = 1,000,000,000"),
    ("changed_bin", "sha256"),
    ("out_of_range_ids", "token id 60000"),
])  # fmt: skip
def test_damaged_dataset_is_one_line(dataset, tmp_path, damage, problem):
    copy, culprit = _damaged_copy(dataset, tmp_path, damage)
    res = run_cli(*_pretrain_args(copy, tmp_path / "run", "--max-steps", "1"))
    assert_one_line_error(res, culprit, problem)


@pytest.mark.parametrize("damage", ["truncated_weights", "state_not_json", "flipped_weights",
                                    "flipped_optimizer"])  # fmt: skip
def test_resume_from_a_bad_checkpoint(dataset, tmp_path, damage):
    """A damaged newest checkpoint, whether it still reads (a flipped bit: its sha256) or not,
    is named with the older one, and --skip-bad-checkpoints resumes from that."""
    from smiexlm.pretraining.trainer import pretrain
    from tests.unit.pretraining.test_training import _config

    run = tmp_path / "run"
    pretrain(_config(), dataset, run, max_steps=8)  # checkpoints at steps 4 and 8
    newest = run / "checkpoints" / "step_000008"
    if damage == "truncated_weights":
        weights = newest / "model.safetensors"
        os.truncate(weights, weights.stat().st_size // 3)
    elif damage == "state_not_json":
        (newest / "trainer_state.json").write_text('{"format": "smiexlm-trainer-state/1", "st')
    else:  # a bit of the last tensor's data flipped: the file still reads
        damaged = newest / ("model" if damage == "flipped_weights" else "optimizer")
        data = bytearray(damaged.with_suffix(".safetensors").read_bytes())
        data[-5] ^= 0x10
        damaged.with_suffix(".safetensors").write_bytes(bytes(data))
    res = run_cli(*_pretrain_args(dataset, run, "--max-steps", "10", "--resume"))
    line = assert_one_line_error(res, "step_000008", "--skip-bad-checkpoints", "step_000004")
    named = {"truncated_weights": "model.safetensors", "state_not_json": "trainer_state.json",
             "flipped_weights": "model.safetensors", "flipped_optimizer": "optimizer.safetensors"}  # fmt: skip
    assert named[damage] in line and ("sha256" in line or "flipped" not in damage), line
    res = run_cli(*_pretrain_args(dataset, run, "--max-steps", "10", "--resume",
                                  "--skip-bad-checkpoints"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "resumed from step_000004" in res.stderr and "step 10:" in res.stdout


def test_export_without_data_writes_its_card_and_failures_leave_the_old_folder(dataset, tmp_path):
    from smiexlm import Featurizer
    from smiexlm.modelio.integrity import verify_checksum
    from smiexlm.pretraining.trainer import pretrain
    from tests.unit.pretraining.test_training import _config

    run = tmp_path / "run"
    pretrain(_config(), dataset, run, max_steps=4)
    model = tmp_path / "model"
    res = run_cli("export", run, "--out", model)  # the README's form: no --data
    assert res.returncode == 0, res.stderr
    card = (model / "MODEL_CARD.md").read_text()
    assert "- molecules: ? train" not in card and "- molecules: " in card  # the run's dataset
    assert Featurizer.from_pretrained(model).featurize(["CCO"]).shape == (1, 32)
    assert verify_checksum(model / "model.safetensors")  # the weights' sha256 is recorded
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    (run / "checkpoints" / "last" / "train_config.json").write_text("{")
    res = run_cli("export", run, "--out", model)
    assert_one_line_error(res, "train_config.json", "not valid JSON")
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before  # untouched
    assert leftovers(tmp_path) == []
    res = run_cli("export", run, "--out", tmp_path / "new")
    assert res.returncode == 2 and not (tmp_path / "new").exists()  # no card-less model
    kept = tmp_path / "notes.csv"
    kept.write_text("keep\n")
    assert_one_line_error(run_cli("export", run, "--out", kept), "is a file: expected a folder")
    assert kept.read_text() == "keep\n"  # a file named as --out is never replaced


# ---------------------------------------------------------------------- predict
@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    import random

    root = tmp_path_factory.mktemp("finetuned")
    rng = random.Random(0)
    smiles = [f"C1{'C' * n}1{tail}" for n in range(2, 16) for tail in ("", "O", "N", "Cl")]
    pd.DataFrame({"smiles": smiles, "y": [rng.randint(0, 1) for _ in smiles]}).to_csv(
        root / "train.csv", index=False
    )
    res = run_cli("finetune", "mine", "--data", root / "train.csv", "--label-cols", "y",
                  "--seeds", "0", "--max-train-steps", "1", "--batch-size", "8",
                  "--device", "cpu", "--split", "random", "--out", root / "report",
                  "--save-dir", root / "models")  # fmt: skip
    assert res.returncode == 0, res.stderr
    return root / "models" / "seed0"


def test_predict_empty_cell_is_a_nan_row_and_ids_are_kept(tmp_path, finetuned):
    table = tmp_path / "in.csv"
    table.write_text("mol_id,smiles,y\na,CCO,1\nb,,0\nc,not a smiles,1\nd,  c1ccccc1O  ,0\n")
    out = tmp_path / "preds.csv"
    res = run_cli("predict", "--checkpoint", finetuned, "--input", table, "--output", out)
    assert res.returncode == 0, res.stderr
    assert "wrote 4 rows (2 unparsable)" in res.stdout
    preds = pd.read_csv(out, keep_default_na=False, na_values=[""])
    domain = ["nearest_tanimoto", "mean_tanimoto_k5", "nearest_cosine", "mean_cosine_k5",
              "in_domain"]  # fmt: skip
    assert preds.columns.tolist() == ["mol_id", "input_y", "smiles", "valid", "y", "y_model",
                                      "y_forest", "truncated", "untrained_tokens", *domain]  # y: predicted, blended with the default's forest  # fmt: skip
    assert preds.input_y.tolist() == [1, 0, 1, 0]  # the measured labels, kept beside
    assert preds.mol_id.tolist() == ["a", "b", "c", "d"]
    assert preds.valid.tolist() == [True, False, False, True]
    assert preds.y.isna().tolist() == [False, True, True, False]


def test_predict_failure_keeps_the_previous_output(tmp_path, finetuned):
    out = tmp_path / "preds.csv"
    out.write_text("previous predictions\n")
    for content, problem in ((b"", "is empty"), (b"smiles\n\xff\xfe\n", "not UTF-8")):
        table = tmp_path / "in.csv"
        table.write_bytes(content)
        res = run_cli("predict", "--checkpoint", finetuned, "--input", table, "--output", out)
        assert_one_line_error(res, "in.csv", problem)
        assert out.read_text() == "previous predictions\n" and leftovers(tmp_path) == []
