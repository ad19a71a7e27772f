"""``smiexlm embed`` and ``smiexlm demo`` through the real entry point."""

from __future__ import annotations

import subprocess

import numpy as np
import pandas as pd
import pytest

from smiexlm import Featurizer
from smiexlm.cli.demo import DRUG_PANEL, cosine_matrix, run_demo
from smiexlm.embedding.embed import embed_file, embed_parts
from smiexlm.errors import ConfigError, DataError, InvalidSmilesError
from tests.unit.featurizer.test_featurizer import make_checkpoint
from tests.warm_cli import run_smiexlm


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_smiexlm(*args)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("cli"))


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("in") / "mols.csv"
    smiles = ["CCO", "c1ccccc1", "C1CC", "CC(=O)Oc1ccccc1C(=O)O", "OCC"]
    frame = pd.DataFrame({"mol_id": [f"m{i}" for i in range(5)], "smiles": smiles, "y": range(5)})
    frame.to_csv(path, index=False)
    return path


def test_embed_parquet_keeps_ids_and_matches_api(checkpoint, table, tmp_path):
    out = tmp_path / "emb.parquet"
    res = run_cli("embed", str(table), "--smiles-col", "smiles", "--out", str(out),
                  "--checkpoint", str(checkpoint), "--id-cols", "mol_id", "--device", "cpu")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "1 failed" in res.stdout and "'C1CC'" in res.stderr
    got = pd.read_parquet(out)
    assert got.columns[:2].tolist() == ["mol_id", "smiles"] and got.shape == (5, 2 + 128)
    assert got.mol_id.tolist() == [f"m{i}" for i in range(5)]
    emb = got.filter(regex=r"^e\d+$").to_numpy()
    ref = Featurizer.from_pretrained(checkpoint, device="cpu").featurize(
        pd.read_csv(table).smiles, errors="nan"
    )
    np.testing.assert_allclose(emb, ref, atol=1e-5)
    assert np.isnan(emb[2]).all()


def test_embed_npy_writes_ids_beside(checkpoint, table, tmp_path):
    out = tmp_path / "emb.npy"
    res = run_cli("embed", str(table), "--smiles-col", "smiles", "--out", str(out),
                  "-c", str(checkpoint))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert np.load(out).shape == (5, 128)
    ids = pd.read_csv(tmp_path / "emb.ids.csv")
    assert ids.columns.tolist() == ["mol_id", "y", "smiles"]


def test_embed_bad_input_is_one_clear_line(checkpoint, table, tmp_path):
    res = run_cli("embed", str(table), "--smiles-col", "SMILES", "--out", str(tmp_path / "x.npy"),
                  "-c", str(checkpoint))  # fmt: skip
    assert res.returncode == 2 and "no SMILES column 'SMILES'" in res.stderr
    with pytest.raises(DataError, match=r"\.parquet"):
        embed_file(table, tmp_path / "x.txt", checkpoint=checkpoint)
    with pytest.raises(InvalidSmilesError, match="input index 2"):
        embed_file(table, tmp_path / "x.npy", checkpoint=checkpoint, errors="raise", progress=False)
    with pytest.raises(DataError, match="id columns"):
        embed_file(table, tmp_path / "x.npy", id_cols=["nope"], checkpoint=checkpoint)
    kept = embed_file(table, tmp_path / "s.parquet", id_cols=["smiles", "mol_id"],
                      checkpoint=checkpoint, errors="nan", progress=False)  # fmt: skip
    assert kept.id_columns == ["mol_id"]  # the SMILES column is kept in any case, once


@pytest.mark.parametrize("layers", [99, 3])
def test_embed_layers_beyond_the_models_blocks_is_refused(checkpoint, table, tmp_path, layers):
    """The test model has 2 blocks: more is one line naming --layers, the value and the range,
    from the CLI and from the Python API alike, before anything is written."""
    out = tmp_path / "e.npy"
    res = run_cli("embed", str(table), "--out", str(out), "-c", str(checkpoint), "--layers",
                  str(layers))  # fmt: skip
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"'layers' = {layers}" in errors[0] and "1 to 2" in errors[0] and "(-1" not in errors[0]
    assert not out.exists()
    for bad in (layers, 0):
        with pytest.raises(ConfigError, match=rf"'layers' = {bad}: expected 1 to 2"):
            embed_file(table, out, checkpoint=checkpoint, layers=bad, progress=False)
    with pytest.raises(ConfigError, match="1 to 2"):
        embed_parts(table, tmp_path / "parts", checkpoint=checkpoint, layers=layers,
                    progress=False)  # fmt: skip
    assert not out.exists() and not (tmp_path / "parts").exists()
    feat = Featurizer.from_pretrained(checkpoint, device="cpu")
    assert feat.last_blocks(2) == (-1, -2)
    with pytest.raises(ConfigError, match="the model has 2 encoder blocks"):
        feat.last_blocks(layers)


def test_demo_command(checkpoint):
    res = run_cli("demo", "--checkpoint", str(checkpoint), "--device", "cpu")
    assert res.returncode == 0, res.stderr
    assert f"({len(DRUG_PANEL)}, 128)" in res.stdout
    for name in ("aspirin", "caffeine", "ibuprofen", "paracetamol", "penicillin G", "morphine"):
        assert name in res.stdout


def test_demo_neighbours_are_the_brute_force_argmax(checkpoint):
    result = run_demo(checkpoint, device="cpu")
    sim = cosine_matrix(result.embeddings)
    for i, j in enumerate(result.neighbours):
        others = [k for k in range(len(sim)) if k != i]
        assert j == max(others, key=lambda k: sim[i, k])
        u, v = result.embeddings[i], result.embeddings[j]
        assert result.cosine[i] == pytest.approx(
            u @ v / np.linalg.norm(u) / np.linalg.norm(v), abs=1e-5
        )
    # ECFP4: caffeine's nearest is theophylline (a fingerprint fact, independent of the model)
    names = result.names
    assert names[result.ecfp_neighbours[names.index("caffeine")]] == "theophylline"


def test_demo_without_default_model_says_so(monkeypatch, tmp_path):
    import smiexlm.modelio.layout as module

    monkeypatch.setattr(module, "DEFAULT_MODEL_DIR", tmp_path / "none")
    with pytest.raises(DataError, match="not installed"):
        run_demo()
