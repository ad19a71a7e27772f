"""Hostile model folders and runs: nothing silent, nothing overwritten unasked.

Each case is one a user can meet: a shipped model whitened in place, a ``vocab.json`` edited
by hand, a folder whose ``checksums.json`` was deleted, settings changed on ``--resume``. The
real ``smiexlm`` command runs in a subprocess on a copy of the shipped default model (or a
tiny run) and must refuse with exit code 2 and one ``error:`` line naming the file or the
setting, or go on and say what it did on stderr. The shipped assets are never written, and
the whitening test checks them byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from smiexlm.paths import ASSETS_DIR
from tests.integration.test_faults import DEFAULT_MODEL, assert_one_line_error, run_cli


def _copy(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder``, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _embed(tmp_path: Path, folder: Path):
    table = tmp_path / "t.csv"
    table.write_text("smiles\nCCO\nc1ccccc1O\n")
    return run_cli("embed", table, "--out", tmp_path / "e.npy", "-c", folder, "--device", "cpu")


# ---------------------------------------------------------------------- 2. whiten
def test_whiten_leaves_shipped_models_alone_and_writes_a_copy_with_out(shared_data, tmp_path):
    from smiexlm.modelio.integrity import read_checksums, verify_checksum
    from smiexlm.modelio.pretrained import load_pretrained
    from smiexlm.modelio.records import read_embedding
    from smiexlm.modelio.whitening_file import whitening_source

    before = _digests(ASSETS_DIR)
    small = tmp_path / "c.csv"
    small.write_text("smiles\nCCO\n")
    for model in ("default", "exlm", ASSETS_DIR / "twins" / "mlm"):  # by name and by path
        res = run_cli("whiten", model, "--corpus", small, "--pooling", "cls")
        assert_one_line_error(res, "read-only", "--out DIR")
    res = run_cli("whiten", "default", "--corpus", small, "--out", ASSETS_DIR / "twins" / "new")
    assert_one_line_error(res, "--out", "read-only")

    corpus = shared_data / "pretrain" / "moses_test.smi.gz"
    out = tmp_path / "whitened"
    # more rows than the 1152 columns of the default's own embedding (three blocks)
    res = run_cli("whiten", "default", "--corpus", corpus, "--rows", "1500", "--pooling", "cls",
                  "--out", out, "--device", "cpu")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in DEFAULT_MODEL.iterdir())
    assert read_embedding(out).pooling == "cls" and read_embedding(out).whiten
    assert whitening_source(out)["rows"] == 1500
    assert all(
        verify_checksum(out / name) for name in ("model.safetensors", "whitening.safetensors")
    )
    new, shipped = read_checksums(out), read_checksums(DEFAULT_MODEL)
    assert new["whitening.safetensors"] != shipped["whitening.safetensors"]
    assert load_pretrained(out).embedding.pooling == "cls"
    res = run_cli("whiten", "default", "--corpus", corpus, "--rows", "500", "--out", out)
    assert_one_line_error(res, str(out), "files in it", "new or empty folder")
    assert _digests(ASSETS_DIR) == before  # not one byte of the package changed


def test_whiten_still_writes_into_a_users_own_folder(shared_data, tmp_path):
    from smiexlm.modelio.integrity import verify_checksum

    folder = _copy(ASSETS_DIR / "twins" / "exlm", tmp_path / "mine")
    corpus = shared_data / "pretrain" / "moses_test.smi.gz"
    res = run_cli("whiten", folder, "--corpus", corpus, "--rows", "200", "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert verify_checksum(folder / "whitening.safetensors")
    assert json.loads((folder / "embedding.json").read_text()) == {"pooling": "cls", "whiten": True}


# ---------------------------------------------------------------------- 4. vocab.json edited
def _swap_c_and_C(vocab: Path, keep_hash: bool) -> str:
    """Swap the tokens ``C`` and ``c``; the hash the file records is kept or removed.
    Returns the hash recorded before."""
    doc = json.loads(vocab.read_text())
    tokens = doc["tokens"]
    i, j = tokens.index("C"), tokens.index("c")
    tokens[i], tokens[j] = tokens[j], tokens[i]
    recorded = doc["hash"] if keep_hash else doc.pop("hash")
    vocab.write_text(json.dumps(doc))
    return recorded


def test_vocab_edited_without_its_hash_is_refused(tmp_path):
    from smiexlm.tokenizer import vocabulary_hash

    folder = _copy(DEFAULT_MODEL, tmp_path / "model")
    _swap_c_and_C(folder / "vocab.json", keep_hash=False)
    expected = json.loads((folder / "config.json").read_text())["vocab_hash"]
    found = vocabulary_hash(json.loads((folder / "vocab.json").read_text())["tokens"])
    res = _embed(tmp_path, folder)
    assert_one_line_error(res, str(folder / "vocab.json"), expected, found)
    assert not (tmp_path / "e.npy").exists()


def test_vocab_whose_recorded_hash_disagrees_with_its_tokens_is_refused(tmp_path):
    folder = _copy(DEFAULT_MODEL, tmp_path / "model")
    recorded = _swap_c_and_C(folder / "vocab.json", keep_hash=True)
    res = _embed(tmp_path, folder)
    assert_one_line_error(res, "vocab.json", f"records hash {recorded!r}", "edited or corrupted")


# ---------------------------------------------------------------------- 7. no checksums.json
def test_folder_without_checksums_loads_and_says_so_once(tmp_path):
    folder = _copy(DEFAULT_MODEL, tmp_path / "model")
    (folder / "checksums.json").unlink()  # two weight files: model and whitening
    res = _embed(tmp_path, folder)
    assert res.returncode == 0, res.stderr
    said = [line for line in res.stderr.splitlines() if "unverified model folder" in line]
    assert len(said) == 1 and str(folder) in said[0] and "no checksums.json" in said[0]
    assert "unverified" not in _embed(tmp_path, DEFAULT_MODEL).stderr


# ---------------------------------------------------------------------- 10. settings on resume
@pytest.fixture(scope="module")
def dataset(shared_data, tmp_path_factory):
    from tests.unit.pretraining.test_training_support import build_dataset

    source = shared_data / "pretrain" / "moses_test.smi.gz"
    return build_dataset(source, tmp_path_factory.mktemp("data") / "ds", n=300)


def _resume(data: Path, run: Path, *extra: str):
    from tests.unit.pretraining.test_training_support import FAST, MICRO_MODEL

    return run_cli("pretrain", "--config", "mol_tiny_exlm", *MICRO_MODEL, *FAST, "--data", data,
                   "--out", run, "--resume", *extra)  # fmt: skip


def test_resume_records_safe_changes_and_refuses_the_others(dataset, tmp_path):
    from smiexlm.pretraining.trainer import pretrain
    from tests.unit.pretraining.test_training import _config

    run = tmp_path / "run"
    pretrain(_config(), dataset, run, max_steps=4)  # lr 0.003, seed 1; a checkpoint at step 4
    kept = {name: (run / name).read_bytes() for name in ("config.resolved.toml", "metrics.jsonl")}
    # three settings fixed for a run, changed at once: each is named with both values
    res = _resume(
        dataset, run, "--max-steps", "6", "seed=2", "weight_decay=0.01", "max_tokens=1024"
    )
    assert_one_line_error(res, "step_000004", "seed = 1", "seed = 2", "weight_decay = 0.0",
                          "weight_decay = 0.01", "max_tokens = 512", "max_tokens = 1024",
                          "start a new --out")  # fmt: skip
    assert {name: (run / name).read_bytes() for name in kept} == kept
    assert not (run / "config.changes.json").exists()

    # spread over two worker processes, the refusal is still one line from one of them
    res = _resume(dataset, run, "--max-steps", "6", "--nproc", "2", "update_freq=2", "seed=2")
    assert_one_line_error(res, "step_000004", "seed = 1", "seed = 2", "start a new --out")
    assert not (run / "config.changes.json").exists()

    res = _resume(dataset, run, "--max-steps", "6", "lr=0.01")
    assert res.returncode == 0, res.stderr
    assert "lr 0.003 -> 0.01" in res.stderr and "max_steps 4 -> 6" in res.stderr
    history = json.loads((run / "config.changes.json").read_text())["changes"]
    assert len(history) == 1 and history[0]["from_step"] == 4
    assert history[0]["settings"] == {"max_steps": {"old": 4, "new": 6},
                                      "lr": {"old": 0.003, "new": 0.01}}  # fmt: skip
    assert "lr = 0.01" in (run / "config.resolved.toml").read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert records[3]["lr"] < 0.0031 < records[4]["lr"]  # the new rate trains from step 5

    res = _resume(dataset, run, "--max-steps", "8", "lr=0.01")  # lr already 0.01 at step 6
    assert res.returncode == 0, res.stderr
    history = json.loads((run / "config.changes.json").read_text())["changes"]
    assert history[1]["from_step"] == 6 and list(history[1]["settings"]) == ["max_steps"]
