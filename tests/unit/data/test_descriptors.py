"""Descriptor targets in the corpus pipeline: shards aligned with the tokens, NaN masking and
counting, robust statistics against a numpy reference, resume after SIGKILL, the CLI."""

from __future__ import annotations

import gzip
import itertools
import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from smiexlm.chemistry.descriptor_stats import DescriptorStats, fit_descriptor_stats
from smiexlm.chemistry.fingerprints import descriptor_names, rdkit2d_descriptors
from smiexlm.data import PreprocessConfig, TokenDataset, preprocess
from smiexlm.data.descriptors import DescriptorTable
from smiexlm.errors import ConfigError, DataError
from smiexlm.tokenizer import SmilesTokenizer
from tests.conftest import kill_after_two_train_shards, require_file
from tests.warm_cli import run_smiexlm

# Gasteiger charges (4) and BCUT2D (8) are undefined for selenium, BCUT2D for a lone atom.
NAN_MOLECULES = ["CC[Se]CC", "[He]"]
CONFIG = {"shard_size": 40, "chunk_size": 40, "valid_fraction": 0.1, "descriptors": "rdkit2d"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shared_data):
    """200 MOSES test SMILES, two molecules with NaN descriptors, a bad line, a duplicate."""
    root = tmp_path_factory.mktemp("desc")
    path = require_file(shared_data, "pretrain/moses_test.smi.gz")
    with gzip.open(path, "rt") as handle:
        smiles = [line.strip() for line in itertools.islice(handle, 200)]
    lines = smiles[:100] + NAN_MOLECULES + ["C1CC"] + smiles[100:] + [smiles[0]]
    smi = root / "mols.smi"
    smi.write_text("\n".join(lines) + "\n")
    vocab = SmilesTokenizer.build(smiles + NAN_MOLECULES).save(root / "vocab.json")
    out = root / "ref"
    result = preprocess([smi], out, PreprocessConfig(**CONFIG), vocab=vocab, progress=False)
    return {"smi": smi, "vocab": vocab, "out": out, "manifest": result.manifest}


def _files(out) -> dict[str, bytes]:
    keep = (".bin", ".idx", ".hash", ".desc")
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.suffix in keep}


def test_descriptor_rows_are_aligned_counted_and_masked(corpus):
    out, manifest = corpus["out"], corpus["manifest"]
    assert manifest["molecules_in"] == 204
    assert (manifest["molecules_out"], manifest["duplicates"]) == (202, 1)
    assert manifest["rejected"]["invalid_smiles"] == 1
    section = manifest["descriptors"]
    names = descriptor_names("rdkit2d")
    assert section["names"] == names and section["count"] == len(names)
    tokenizer = SmilesTokenizer.load(corpus["vocab"])
    nan_seen: dict[str, np.ndarray] = {}
    for split in ("train", "valid"):
        tokens = TokenDataset(out, split)
        table = DescriptorTable(out, split, manifest)
        assert len(table) == len(tokens) == manifest["splits"][split]["molecules"]
        rows = np.stack([table[i] for i in range(len(table))])  # (n, D) float32
        nan_seen[split] = np.isnan(rows).sum(axis=0)
        picks = list(range(0, len(tokens), 9))  # every 9th molecule against RDKit directly
        smiles = [tokenizer.decode(tokens[i]) for i in picks]
        expected = rdkit2d_descriptors(smiles).astype(np.float32)
        np.testing.assert_array_equal(rows[picks], expected)
    for split, counts in nan_seen.items():
        recorded = section["nan"].get(split, {})
        assert recorded == {n: int(c) for n, c in zip(names, counts, strict=True) if c}
    total = sum(sum(c.values()) for c in section["nan"].values())
    assert total == 12 + 8  # Se: 4 partial charges + 8 BCUT2D; He: 8 BCUT2D


def test_stats_are_fitted_on_train_only(corpus):
    out, manifest = corpus["out"], corpus["manifest"]
    table = DescriptorTable(out, "train", manifest)
    train = np.stack([table[i] for i in range(len(table))]).astype(np.float64)
    stats = DescriptorStats.load(out / "descriptors.json")
    assert stats.n_fit == len(train) and stats.names == descriptor_names("rdkit2d")
    reference = fit_descriptor_stats([train], "rdkit2d", stats.names, version=stats.version)
    np.testing.assert_array_equal(stats.center, reference.center)
    np.testing.assert_array_equal(stats.scale, reference.scale)
    mol_wt = stats.names.index("MolWt")
    assert stats.center[mol_wt] == pytest.approx(np.median(train[:, mol_wt]), rel=1e-12)


def test_descriptors_are_rdkits_own_values(data_file):
    """Bit for bit what RDKit's ``CalcMolDescriptors`` gives (the EState extremes read the
    indices the first of them cached), on molecules with charges, metals, salts, selenium and
    a lone atom; values beyond the limit are NaN in both."""
    from rdkit import Chem
    from rdkit.Chem import Descriptors

    from smiexlm.chemistry.fingerprints import DESCRIPTOR_LIMIT

    raw = pd.read_csv(data_file("moleculenet/clintox.csv"))["smiles"].astype(str).str.strip()
    smiles = [s for s in raw.tolist()[:120] if Chem.MolFromSmiles(s) is not None]
    smiles += NAN_MOLECULES
    names = descriptor_names("rdkit2d")
    rows = [Descriptors.CalcMolDescriptors(Chem.MolFromSmiles(s), np.nan) for s in smiles]
    expected = np.array([[row[n] for n in names] for row in rows], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        expected[~(np.abs(expected) <= DESCRIPTOR_LIMIT)] = np.nan
    got = rdkit2d_descriptors(smiles)
    assert len(smiles) > 100 and np.isnan(got).any()
    np.testing.assert_array_equal(got, expected)


def test_an_unparsable_smiles_is_a_row_of_nan_for_targets_and_an_error_for_features():
    from smiexlm.chemistry.fingerprints import compute_descriptors
    from smiexlm.errors import InvalidSmilesError

    good = rdkit2d_descriptors(["CCO", "c1ccccc1"]).astype(np.float32)
    got = compute_descriptors(["CCO", "C1CC", "c1ccccc1"], "rdkit2d")
    assert np.isnan(got[1]).all()
    np.testing.assert_array_equal(got[[0, 2]], good)
    with pytest.raises(InvalidSmilesError, match="C1CC"):
        rdkit2d_descriptors(["CCO", "C1CC"])
    with pytest.raises(ConfigError, match="unparsable"):
        rdkit2d_descriptors(["CCO"], unparsable="skip")  # type: ignore[arg-type]


def test_a_data_sets_descriptors_are_kept_and_read_back_bit_for_bit(tmp_path, monkeypatch):
    """``cache=True`` keeps a list's matrix once and reads it back without RDKit; another
    order, another ``unparsable`` rule or a shorter list than the threshold is not that file."""
    from smiexlm.chemistry import fingerprints

    monkeypatch.setenv("SMIEXLM_CACHE", str(tmp_path))
    monkeypatch.setattr(fingerprints, "CACHE_MIN_MOLECULES", 3)
    smiles = ["CCO", "c1ccccc1O", "C" * 80, "CC(=O)[O-].[Na+]"]  # one with NaN (Ipc 1e17)
    fresh = rdkit2d_descriptors(smiles)
    kept = rdkit2d_descriptors(smiles, cache=True)
    (path,) = (tmp_path / "descriptors").iterdir()
    np.testing.assert_array_equal(kept, fresh)
    assert np.isnan(fresh).any()

    def no_rdkit():
        raise AssertionError("computed again")

    monkeypatch.setattr(fingerprints, "_rdkit2d_functions", no_rdkit)
    np.testing.assert_array_equal(rdkit2d_descriptors(smiles, cache=True), fresh)
    with pytest.raises(AssertionError, match="computed again"):
        rdkit2d_descriptors(smiles[::-1], cache=True)
    with pytest.raises(AssertionError, match="computed again"):
        rdkit2d_descriptors(smiles, unparsable="nan", cache=True)
    with pytest.raises(AssertionError, match="computed again"):
        rdkit2d_descriptors(smiles[:2], cache=True)  # below the threshold: never kept
    assert list((tmp_path / "descriptors").iterdir()) == [path]


@pytest.mark.parametrize("damage", ["truncated", "wrong shape", "pickled object"])
def test_a_damaged_kept_matrix_is_computed_again_and_replaced(tmp_path, monkeypatch, caplog,
                                                              damage):  # fmt: skip
    from smiexlm.chemistry import fingerprints

    monkeypatch.setenv("SMIEXLM_CACHE", str(tmp_path))
    monkeypatch.setattr(fingerprints, "CACHE_MIN_MOLECULES", 2)
    smiles = ["CCO", "c1ccccc1O", "CCN"]
    fresh = rdkit2d_descriptors(smiles, cache=True)
    (path,) = (tmp_path / "descriptors").iterdir()
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    elif damage == "wrong shape":
        np.save(path, fresh[:2])
    else:
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with caplog.at_level("WARNING", logger="smiexlm.chemistry.fingerprints"):
        again = rdkit2d_descriptors(smiles, cache=True)
    np.testing.assert_array_equal(again, fresh)
    assert "computing them again" in caplog.text and str(path) in caplog.text
    np.testing.assert_array_equal(np.load(path, allow_pickle=False), fresh)  # replaced


def test_both_features_keep_only_the_descriptors(tmp_path, monkeypatch):
    from smiexlm.chemistry import fingerprints

    monkeypatch.setenv("SMIEXLM_CACHE", str(tmp_path))
    monkeypatch.setattr(fingerprints, "CACHE_MIN_MOLECULES", 2)
    smiles = ["CCO", "c1ccccc1O", "CCN"]
    got = fingerprints.molecule_features(smiles, "both", cache=True)
    np.testing.assert_array_equal(got, fingerprints.molecule_features(smiles, "both"))
    (path,) = (tmp_path / "descriptors").iterdir()
    assert np.load(path).shape == (3, len(descriptor_names("rdkit2d")))


def test_descriptors_shrink_the_default_shard_so_that_progress_is_committed_often():
    """A shard is the unit of progress; with descriptors a million molecules are hours."""
    from dataclasses import asdict

    assert PreprocessConfig().shard_size == 1_000_000
    config = PreprocessConfig(descriptors="rdkit2d")
    assert config.shard_size == 50_000 and asdict(config)["shard_size"] == 50_000  # recorded
    assert PreprocessConfig(descriptors="rdkit2d", shard_size=7).shard_size == 7
    with pytest.raises(ConfigError, match="shard_size"):
        PreprocessConfig(shard_size=0)


def test_stats_match_a_numpy_reference():
    rng = np.random.default_rng(0)
    n = 501
    x = np.stack(
        [
            rng.lognormal(0, 3, n),  # heavy tailed
            rng.normal(5, 2, n),
            (rng.random(n) < 0.1).astype(float),  # IQR 0: falls back to the std
            np.full(n, 7.0),  # constant: scale 1
            np.full(n, np.nan),  # never computed: centre 0, scale 1
        ],
        axis=1,
    )
    x[rng.random((n, 5)) < 0.05] = np.nan
    x[3, 1] = np.inf  # an infinity counts as missing
    parts = [x[:200].astype(np.float32), x[200:].astype(np.float32)]
    stats = fit_descriptor_stats(parts, "test", list("abcde"), block=2)
    values = np.concatenate(parts).astype(np.float64)
    for j in range(5):
        col = np.sort(values[np.isfinite(values[:, j]), j])
        if not len(col):
            assert (stats.center[j], stats.scale[j], stats.n_finite[j]) == (0.0, 1.0, 0)
            continue

        def quantile(q, col=col):  # linear interpolation between order statistics
            pos = q * (len(col) - 1)
            lo = int(np.floor(pos))
            hi = min(lo + 1, len(col) - 1)
            return col[lo] + (pos - lo) * (col[hi] - col[lo])

        iqr = quantile(0.75) - quantile(0.25)
        std = np.sqrt(np.mean((col - col.mean()) ** 2))
        scale = iqr / 1.3489795003921634 if iqr > 0 else (std if std > 0 else 1.0)
        assert stats.center[j] == pytest.approx(quantile(0.5), rel=1e-12)
        assert stats.scale[j] == pytest.approx(scale, rel=1e-9)
        assert stats.n_finite[j] == len(col)
    z = stats.normalize(values)
    assert z.dtype == np.float32 and np.isnan(z).sum() == (~np.isfinite(values)).sum()
    assert np.nanmax(np.abs(z)) == stats.clip  # the lognormal tail is clipped
    inside = np.abs((values - stats.center) / stats.scale) < stats.clip
    error = (stats.denormalize(z) - values) / stats.scale  # float32 z: 1e-7 of a scale
    np.testing.assert_allclose(error[inside], 0.0, atol=1e-6)
    again = DescriptorStats.from_dict(json.loads(json.dumps(stats.to_dict())))
    np.testing.assert_array_equal(again.scale, stats.scale)


_KILL_SCRIPT = """
import sys
from smiexlm.data import PreprocessConfig, preprocess
config = PreprocessConfig(**{config!r})
preprocess([sys.argv[1]], sys.argv[2], config, vocab=sys.argv[3], workers=1, progress=False,
           resume=len(sys.argv) > 4)
"""


def test_sigkill_then_resume_is_byte_identical(corpus, tmp_path):
    out = tmp_path / "killed"
    script = _KILL_SCRIPT.format(config=CONFIG)
    args = [sys.executable, "-c", script, str(corpus["smi"]), str(out), str(corpus["vocab"])]
    proc = subprocess.Popen(args)
    kill_after_two_train_shards(proc, out)
    (out / "train-00042.desc").write_bytes(b"written after the last commit")
    config = PreprocessConfig(**CONFIG)
    preprocess([corpus["smi"]], out, config, vocab=corpus["vocab"], resume=True, progress=False)
    assert _files(out) == _files(corpus["out"])
    for name in ("descriptors.json", "manifest.json"):
        assert (out / name).read_bytes() == (corpus["out"] / name).read_bytes(), name


def test_corrupted_descriptor_shard_is_refused(corpus, tmp_path):
    manifest = corpus["manifest"]
    folder = tmp_path / "copy"
    folder.mkdir()
    for path in corpus["out"].iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    target = folder / "train-00000.desc"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0xFF
    target.write_bytes(bytes(data))
    with pytest.raises(DataError, match="sha256"):
        DescriptorTable(folder, "train", manifest)
    with pytest.raises(DataError, match="--descriptors rdkit2d"):
        DescriptorTable(folder, "train", {**manifest, "descriptors": None})
    with pytest.raises(ConfigError, match="descriptors"):
        PreprocessConfig(descriptors="padel")


def test_cli_preprocess_with_descriptors(corpus, tmp_path):
    smi = tmp_path / "few.smi"
    smi.write_text("\n".join(["CCO", "c1ccccc1O", "CC[Se]CC", "CC(=O)Nc1ccc(O)cc1"]) + "\n")
    out = tmp_path / "ds"
    result = run_smiexlm("preprocess", smi, "--out", out, "--no-progress", "--descriptors",
                         "rdkit2d", "--valid-fraction", "0", "--vocab", corpus["vocab"],
                         timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"{len(descriptor_names('rdkit2d'))} descriptors (12 NaN values)" in result.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["descriptors"]["nan"]["train"]["MaxPartialCharge"] == 1
    assert DescriptorStats.load(out / "descriptors.json").n_fit == 4


def test_two_workers_write_the_same_bytes(corpus, tmp_path):
    out = tmp_path / "two"
    config = PreprocessConfig(**CONFIG)
    preprocess([corpus["smi"]], out, config, vocab=corpus["vocab"], workers=2, progress=False)
    assert _files(out) == _files(corpus["out"])
    assert (out / "descriptors.json").read_bytes() == (
        corpus["out"] / "descriptors.json"
    ).read_bytes()
