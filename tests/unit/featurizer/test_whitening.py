"""The corpus whitening of a model's embeddings: the arithmetic against scikit-learn's PCA,
the file in a model folder, and the featurizer, ``embed`` and the CLI using it."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from smiexlm import Featurizer
from smiexlm.cli.main import app
from smiexlm.embedding.whitening_fit import whiten_model
from smiexlm.errors import ConfigError, DataError
from smiexlm.modelio.layout import DEFAULT_MODEL_DIR, WHITENING_NAME
from smiexlm.modelio.records import EmbeddingSettings, read_embedding, write_embedding
from smiexlm.modelio.whitening_file import load_whitening, save_whitening, whitening_source
from smiexlm.whitening import Whitening, fit_whitening

# 225 small molecules the shipped vocabulary covers: ethers and amines of two alkyl chains
CORPUS = [f"{'C' * i}{x}{'C' * j}" for i in range(1, 16) for j in range(1, 16) for x in "O"]
CORPUS += [f"{'C' * i}N{'C' * j}" for i in range(1, 16) for j in range(1, 6)]
PANEL = ["CC(=O)Oc1ccccc1C(=O)O", "CN1C=NC2=C1C(=O)N(C(=O)N2C)C", "c1ccccc1O", "CCO"]


def correlated(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(d, d)) * np.linspace(0.1, 3.0, d)
    return rng.normal(size=(n, d)) @ mix + rng.normal(size=d) * 5


def test_whitened_corpus_has_identity_covariance_and_matches_sklearn_pca():
    from sklearn.decomposition import PCA

    x = correlated(2000, 8, 0)
    w = fit_whitening(x, rel_tol=0.0)
    z = w(x)
    np.testing.assert_allclose(z.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(np.cov(z.T), np.eye(8), atol=1e-4)
    # scikit-learn's whitened PCA differs at most by the sign of each direction: the same
    # inner products, so the same cosine neighbours
    ref = PCA(whiten=True).fit(x).transform(x)
    np.testing.assert_allclose(z @ z[:50].T, ref @ ref[:50].T, rtol=1e-4, atol=1e-3)


def test_a_direction_without_spread_is_dropped_not_divided_by_zero():
    x = correlated(1000, 6, 1)
    x[:, 5] = x[:, 0] + x[:, 1]  # rank 5: one direction has no spread at all
    w = fit_whitening(x)
    assert w.rank == 5 and np.isfinite(w.matrix).all()
    assert np.abs(w(x)).max() < 10  # nothing blown up by 1 / 1e-16
    np.testing.assert_allclose(np.cov(w(x).T)[:5, :5], np.eye(5), atol=1e-4)
    assert np.abs(w(x)[:, 5]).max() == 0.0


def test_nan_rows_stay_nan_and_are_ignored_when_fitting():
    x = correlated(500, 4, 2)
    with_nan = np.vstack([x, np.full((3, 4), np.nan)])
    fitted = fit_whitening(with_nan)
    np.testing.assert_array_equal(fitted.matrix, fit_whitening(x).matrix)
    out = fitted(with_nan)
    assert np.isnan(out[-3:]).all() and np.isfinite(out[:-3]).all()


@pytest.mark.parametrize("float32", [False, True])
def test_a_row_is_whitened_the_same_alone_or_in_a_batch(float32):
    w = fit_whitening(correlated(1000, 64, 3))
    x = correlated(300, 64, 4).astype(np.float32)
    whole = w(x, float32=float32)
    assert whole.dtype == np.float32
    for i in range(0, 300, 37):
        np.testing.assert_array_equal(w(x[i : i + 1], float32=float32), whole[i : i + 1])
    exact = (x.astype(np.float64) - w.mean) @ w.matrix.astype(np.float64)
    tol = 1e-6 if not float32 else 1e-4  # float32 rounding of the result, or of its sums
    np.testing.assert_allclose(whole, exact, rtol=tol, atol=tol * np.abs(exact).max())
    assert np.array_equal(whole, w(x)) is not float32  # the float32 sums round otherwise


def test_bad_input_is_named():
    with pytest.raises(DataError, match="more rows than columns"):
        fit_whitening(correlated(5, 8, 0))
    with pytest.raises(ConfigError, match="rel_tol"):
        fit_whitening(correlated(50, 4, 0), rel_tol=1.5)
    with pytest.raises(DataError, match=r"width 4.*\(3, 5\)"):
        fit_whitening(correlated(50, 4, 0))(np.zeros((3, 5)))
    with pytest.raises(DataError, match="mean \\(d,\\) and matrix \\(d, d\\)"):
        Whitening(np.zeros(3, np.float32), np.zeros((3, 4), np.float32))


def test_the_file_round_trips_and_is_checked(tmp_path):
    w = fit_whitening(correlated(400, 16, 5))
    save_whitening(tmp_path, {"cls": w}, {"corpus": "toy", "rows": 400})
    back = load_whitening(tmp_path, 16)
    assert list(back) == ["cls"]
    np.testing.assert_array_equal(back["cls"].matrix, w.matrix)
    assert whitening_source(tmp_path) == {"corpus": "toy", "rows": 400}
    assert load_whitening(tmp_path / "nowhere", 16) is None
    with pytest.raises(DataError, match=r"'cls.mean' of shape \(32,\)"):
        load_whitening(tmp_path, 32)
    raw = bytearray((tmp_path / WHITENING_NAME).read_bytes())
    raw[-1] ^= 1
    (tmp_path / WHITENING_NAME).write_bytes(bytes(raw))
    with pytest.raises(DataError, match="does not match the sha256 recorded"):
        load_whitening(tmp_path, 16)


def test_a_folder_without_checksums_stays_loadable_when_whitened(tmp_path):
    from smiexlm.modelio.pretrained import load_pretrained

    folder = shutil.copytree(DEFAULT_MODEL_DIR, tmp_path / "old")
    (folder / "checksums.json").unlink()  # written before checksums.json existed
    save_whitening(folder, load_whitening(DEFAULT_MODEL_DIR, 128), {"corpus": "toy"})
    assert not (folder / "checksums.json").exists()  # a record of the whitening alone
    assert load_pretrained(folder).whitening is not None  # would fail the weights' check


@pytest.fixture(scope="module")
def whitened(tmp_path_factory):
    """A copy of the shipped model, whitened on CORPUS and made the default."""
    folder = tmp_path_factory.mktemp("model") / "m"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    for name in (WHITENING_NAME, "embedding.json"):
        (folder / name).unlink(missing_ok=True)
    smi = folder.parent / "corpus.smi"
    smi.write_text("\n".join(CORPUS) + "\n")
    record = whiten_model(folder, smi, rows=len(CORPUS), device="cpu", progress=False)
    assert record["rows"] == len(CORPUS) and record["default"] is True
    return folder


def test_the_featurizer_whitens_by_default_when_the_folder_says_so(whitened):
    feat = Featurizer.from_pretrained(whitened, device="cpu")
    assert read_embedding(whitened).whiten and feat.whiten
    raw = feat.featurize(PANEL, whiten=False)
    np.testing.assert_array_equal(feat.featurize(PANEL), feat.whitening["cls"](raw))
    corpus = feat.featurize(CORPUS)
    np.testing.assert_allclose(corpus.mean(0)[: feat.whitening["cls"].rank], 0, atol=1e-4)
    # mean pooling has its own whitening; another block is served raw unless asked
    np.testing.assert_array_equal(
        feat.featurize(PANEL, pooling="mean"),
        feat.whitening["mean"](feat.featurize(PANEL, pooling="mean", whiten=False)),
    )
    np.testing.assert_array_equal(
        feat.featurize(PANEL, layer=0), feat.featurize(PANEL, layer=0, whiten=False)
    )
    with pytest.raises(ConfigError, match="layer.*the last block or the last few"):
        feat.featurize(PANEL, layer=0, whiten=True)
    write_embedding(whitened, "cls", whiten=False)
    try:
        plain = Featurizer.from_pretrained(whitened, device="cpu")
        np.testing.assert_array_equal(plain.featurize(PANEL), raw)
        np.testing.assert_array_equal(plain.featurize(PANEL, whiten=True), feat.featurize(PANEL))
    finally:
        write_embedding(whitened, "cls", whiten=True)


def test_whiten_needs_a_stored_whitening(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(DEFAULT_MODEL_DIR, folder)
    (folder / WHITENING_NAME).unlink(missing_ok=True)
    write_embedding(folder, "cls")
    feat = Featurizer.from_pretrained(folder, device="cpu")
    with pytest.raises(ConfigError, match="stores no whitening for cls"):
        feat.featurize(PANEL, whiten=True)
    (folder / "embedding.json").write_text(json.dumps({"pooling": "cls", "whiten": True}))
    with pytest.raises(DataError, match="says whiten.*no whitening.safetensors"):
        Featurizer.from_pretrained(folder, device="cpu")
    (folder / "embedding.json").write_text(json.dumps({"pooling": "cls", "whiten": "yes"}))
    with pytest.raises(ConfigError, match="whiten.*'yes'.*true or false"):
        Featurizer.from_pretrained(folder, device="cpu")


def test_embed_records_and_the_cli_fits_the_whitening(whitened, tmp_path):
    from smiexlm.embedding.embed import EmbedOptions

    assert EmbedOptions(checkpoint=whitened).settings()["whiten"] is True
    assert "whiten" not in EmbedOptions(checkpoint=whitened, whiten=False).settings()
    table = tmp_path / "in.csv"
    table.write_text("smiles\n" + "\n".join(PANEL) + "\n")
    runner = CliRunner()
    for flag, expect in (("--whiten", True), ("--no-whiten", False)):
        out = tmp_path / f"emb{flag}.npy"
        result = runner.invoke(
            app, ["embed", str(table), "-o", str(out), "-c", str(whitened), flag]
        )
        assert result.exit_code == 0, result.output
        feat = Featurizer.from_pretrained(whitened, device="cpu")
        np.testing.assert_array_equal(np.load(out), feat.featurize(PANEL, whiten=expect))
    smi = tmp_path / "c.smi"
    smi.write_text("\n".join(CORPUS) + "\n")
    result = runner.invoke(
        app, ["whiten", str(whitened), "--corpus", str(smi), "--rows", "200", "--no-default"]
    )
    assert result.exit_code == 0, result.output
    assert "fitted on 200 molecules" in result.output
    assert not read_embedding(whitened).whiten and whitening_source(whitened)["rows"] == 200
    write_embedding(whitened, "cls", whiten=True)


def test_the_probe_whitens_on_request_with_the_folder_whitening(whitened, tmp_path):
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.probe import ProbeConfig, pooled_embeddings

    backbone = Backbone(whitened)
    inputs = backbone.model_texts(PANEL)
    raw = pooled_embeddings(backbone, inputs, ProbeConfig(device="cpu"))
    white = pooled_embeddings(backbone, inputs, ProbeConfig(device="cpu", whiten=True))
    np.testing.assert_allclose(white, backbone.whitening("cls")(raw), rtol=0, atol=1e-6)
    bare = tmp_path / "bare"
    shutil.copytree(DEFAULT_MODEL_DIR, bare)
    (bare / WHITENING_NAME).unlink(missing_ok=True)
    write_embedding(bare, "cls")
    with pytest.raises(ConfigError, match="stores no whitening for cls"):
        pooled_embeddings(Backbone(bare), inputs, ProbeConfig(device="cpu", whiten=True))


def test_the_probe_puts_combined_poolings_side_by_side(whitened):
    from smiexlm.finetuning.backbone import Backbone
    from smiexlm.finetuning.probe import ProbeConfig, pooled_embeddings

    backbone = Backbone(whitened)
    inputs = backbone.model_texts(PANEL)
    one = {p: pooled_embeddings(backbone, inputs, ProbeConfig(pooling=p, device="cpu")) for p in ("cls", "max")}  # fmt: skip
    both = pooled_embeddings(backbone, inputs, ProbeConfig(pooling="cls+max", device="cpu"))
    np.testing.assert_array_equal(both, np.hstack([one["cls"], one["max"]]))
    for bad in ("cls+cls", "cls+sum", "cls,mean"):
        with pytest.raises(ConfigError, match="joined by '\\+'"):
            ProbeConfig(pooling=bad)


def test_a_safetensors_file_of_another_kind_is_refused(tmp_path):
    from safetensors.numpy import save_file

    save_file({"cls.mean": np.zeros(4, np.float32), "cls.matrix": np.eye(4, dtype=np.float32)},
              str(tmp_path / WHITENING_NAME))  # fmt: skip
    with pytest.raises(DataError, match="format None, expected 'smiexlm-whitening/1'"):
        load_whitening(tmp_path, 4)


def test_side_by_side_whitening_whitens_each_block_by_its_own():
    a, b = fit_whitening(correlated(800, 6, 5)), fit_whitening(correlated(800, 4, 6))
    both = Whitening.side_by_side([a, b])
    x, y = correlated(50, 6, 7), correlated(50, 4, 8)
    np.testing.assert_array_equal(both(np.hstack([x, y])), np.hstack([a(x), b(y)]))
    assert both.dim == 10 and both.rank == a.rank + b.rank


def test_a_combined_pooling_is_served_side_by_side_whitened_and_from_the_folder(whitened, tmp_path):
    from smiexlm.embedding.embed import EmbedOptions

    feat = Featurizer.from_pretrained(whitened, device="cpu")
    d = feat.model.config.d_model
    single = {p: feat.featurize(PANEL, pooling=p) for p in ("cls", "max")}
    both = feat.featurize(PANEL, pooling="cls+max")
    assert both.shape == (len(PANEL), 2 * d) and feat.width("cls+max") == 2 * d
    np.testing.assert_array_equal(both, np.hstack([single["cls"], single["max"]]))
    raw = feat.featurize(PANEL, pooling="max+cls", whiten=False)
    np.testing.assert_array_equal(raw[:, :d], feat.featurize(PANEL, pooling="max", whiten=False))
    # a folder whose embedding.json names a combined pooling serves it by default, everywhere
    write_embedding(whitened, "cls+max", whiten=True)
    try:
        served = Featurizer.from_pretrained(whitened, device="cpu")
        assert served.dim == 2 * d
        np.testing.assert_array_equal(served.featurize(PANEL), both)
        assert EmbedOptions(checkpoint=whitened).settings() == {
            "pooling": "cls+max",
            "errors": "nan",
            "canonicalize": True,
            "whiten": True,
        }
        table = tmp_path / "in.csv"
        table.write_text("smiles\n" + "\n".join(PANEL) + "\n")
        out = tmp_path / "emb.npy"
        result = CliRunner().invoke(app, ["embed", str(table), "-o", str(out), "-c", str(whitened)])
        assert result.exit_code == 0, result.output
        np.testing.assert_array_equal(np.load(out), both)
    finally:
        write_embedding(whitened, "cls", whiten=True)
    for bad in ("cls+cls", "cls+sum", "cls,max"):
        with pytest.raises(ConfigError, match="pooling.*several joined by '\\+'"):
            feat.featurize(PANEL, pooling=bad)
    with pytest.raises(ConfigError, match="pooling.*several joined by '\\+'"):
        write_embedding(whitened, "")


def test_a_combined_pooling_can_have_a_joint_whitening_of_its_own(whitened, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(whitened, folder)
    smi = tmp_path / "corpus.smi"
    smi.write_text("\n".join(CORPUS) + "\n")
    result = CliRunner().invoke(app, ["whiten", str(folder), "--corpus", str(smi),
                                      "--pooling", "cls+max", "--device", "cpu"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "(cls+max pooling)" in result.output
    assert read_embedding(folder) == EmbeddingSettings("cls+max", whiten=True)
    feat = Featurizer.from_pretrained(folder, device="cpu")
    d = feat.model.config.d_model
    assert set(feat.whitening) == {"cls", "mean", "max", "cls+max"}
    assert feat.whitening["cls+max"].dim == 2 * d
    raw = feat.featurize(CORPUS, pooling="cls+max", whiten=False)
    joint = feat.featurize(CORPUS)  # the folder's pooling, its own whitening
    np.testing.assert_array_equal(joint, feat.whitening["cls+max"](raw))
    rank = feat.whitening["cls+max"].rank
    cov = np.cov(joint.T)
    kept = np.abs(feat.whitening["cls+max"].matrix).sum(0) > 0
    np.testing.assert_allclose(cov[np.ix_(kept, kept)], np.eye(rank), atol=1e-3)
    # part by part, the two halves stay correlated with each other; jointly they are not
    apart = Whitening.side_by_side([feat.whitening["cls"], feat.whitening["max"]])(raw)
    with np.errstate(invalid="ignore"):  # the dropped directions are all zero
        across = np.corrcoef(apart[:, :d].T, apart[:, d:].T)[:d, d:]
    assert np.nanmax(np.abs(across)) > 0.3
    with pytest.raises(ConfigError, match="pooling.*'cls\\+sum'"):
        whiten_model(folder, smi, pooling="cls+sum", device="cpu", progress=False)
    # a file whose tensors are not named after a pooling, or of the wrong width, is refused
    w = feat.whitening["cls"]
    save_whitening(tmp_path, {"cls+sum": w}, {})
    with pytest.raises(DataError, match="'cls\\+sum', not a pooling"):
        load_whitening(tmp_path, d)
    save_whitening(tmp_path, {"cls+max": w}, {})
    with pytest.raises(DataError, match=f"'cls\\+max.mean' of shape \\({2 * d},\\)"):
        load_whitening(tmp_path, d)


def test_the_last_blocks_side_by_side_have_a_joint_whitening_of_their_own(whitened, tmp_path):
    """``whiten --layers 2``: ``cls@2`` is the whitening of the last two blocks' cls states
    side by side, refitted here from the corpus; the folder then serves those two blocks,
    whitened, and ``embed`` records them; one block keeps its own whitening."""
    from smiexlm.embedding.embed import EmbedOptions

    smi = tmp_path / "corpus.smi"
    smi.write_text("\n".join(CORPUS) + "\n")
    result = CliRunner().invoke(app, ["whiten", str(whitened), "--corpus", str(smi), "--layers",
                                      "2", "--device", "cpu", "--out", str(tmp_path / "two")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "(cls pooling, last 2 blocks)" in result.output
    folder = tmp_path / "two"
    assert read_embedding(folder) == EmbeddingSettings("cls", whiten=True, layers=2)
    feat = Featurizer.from_pretrained(folder, device="cpu")
    d = feat.model.config.d_model
    assert feat.blocks == (-1, -2) and feat.dim == 2 * d and "cls@2" in feat.whitening
    corpus = feat.featurize(CORPUS, layer=(-1, -2), whiten=False)
    refit = fit_whitening(corpus)
    np.testing.assert_allclose(feat.whitening["cls@2"].mean, refit.mean, atol=1e-6)
    np.testing.assert_allclose(np.abs(feat.whitening["cls@2"].matrix), np.abs(refit.matrix),
                               rtol=1e-3, atol=1e-3)  # fmt: skip
    raw = feat.featurize(PANEL, whiten=False)
    np.testing.assert_array_equal(raw, feat.featurize(PANEL, layer=(-1, -2), whiten=False))
    np.testing.assert_array_equal(feat.featurize(PANEL), feat.whitening["cls@2"](raw))
    last = feat.featurize(PANEL, layer=-1)  # one block: its own whitening
    np.testing.assert_array_equal(last, feat.whitening["cls"](raw[:, :d]))
    with pytest.raises(ConfigError, match="the last block or the last few"):
        feat.featurize(PANEL, layer=(-1, -3), whiten=True)
    assert EmbedOptions(checkpoint=folder).settings() == {
        "pooling": "cls", "errors": "nan", "canonicalize": True, "layers": 2, "whiten": True,
    }  # fmt: skip
    for name in ("cls@1", "cls@x", "cls@02"):  # not names whiten_model writes
        save_whitening(tmp_path / "bad", {name: feat.whitening["cls"]}, {})
        with pytest.raises(DataError, match="not a pooling"):
            load_whitening(tmp_path / "bad", d)
        (tmp_path / "bad" / WHITENING_NAME).unlink()
    with pytest.raises(ConfigError, match="layers"):
        whiten_model(folder, smi, layers=9, device="cpu", progress=False, out=tmp_path / "x")
