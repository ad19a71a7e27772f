"""``smiexlm index`` / ``smiexlm search``: HNSW cosine search over embedding parts against exact
search, and exact ECFP4 Tanimoto search against RDKit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from smiexlm.cli.demo import DRUG_PANEL
from smiexlm.embedding.embed import embed_parts
from smiexlm.errors import ConfigError, DataError, InvalidSmilesError
from tests.unit.featurizer.test_featurizer import make_checkpoint

faiss = pytest.importorskip("faiss")

from smiexlm.chemistry.fingerprints import ecfp4_packed  # noqa: E402
from smiexlm.embedding.search import SearchIndex, build_index, popcount  # noqa: E402
from tests.warm_cli import run_smiexlm  # noqa: E402

TAILS = ["", "C", "CC", "O", "N", "Cl", "CO", "C(=O)O", "c1ccccc1", "CCN"]
BAD_ROWS = [5, 77]  # rows whose SMILES fail, so the library has holes


def _library() -> list[str]:
    """~200 molecules: the drug panel with substituents appended, and two bad rows."""
    smiles = [s + t for _, s, _ in DRUG_PANEL for t in TAILS if not (s.endswith(")") and t)]
    smiles += [f"{head}{'C' * n}{tail}" for n in range(1, 9)
               for head, tail in (("c1ccccc1", "O"), ("CC(C)", "N"), ("c1ccncc1", "Cl"))]  # fmt: skip
    from rdkit import Chem, rdBase

    with rdBase.BlockLogs():
        smiles = [s for s in smiles if Chem.MolFromSmiles(s) is not None]
    for row in BAD_ROWS:
        smiles[row] = "C1CC"
    return smiles


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> tuple[Path, list[str]]:
    import torch

    torch.set_num_threads(1)
    smiles = _library()
    folder = tmp_path_factory.mktemp("lib")
    table = folder / "library.csv"
    pd.DataFrame({"name": [f"mol{i}" for i in range(len(smiles))], "smiles": smiles}).to_csv(
        table, index=False
    )
    embed_parts(table, folder / "emb", device="cpu", progress=False, part_rows=64)
    return folder / "emb", smiles


@pytest.fixture(scope="module")
def index(library, tmp_path_factory) -> SearchIndex:
    out = tmp_path_factory.mktemp("idx") / "idx"
    info = build_index(library[0], out, progress=False)
    assert info.n_rows == len(library[1])
    assert info.n_embedded == info.n_fingerprinted == len(library[1]) - len(BAD_ROWS)
    return SearchIndex(out, device="cpu")


def test_hnsw_finds_what_exact_search_finds_and_skips_failed_rows(index, library):
    _, smiles = library
    queries = [s for i, s in enumerate(smiles) if i not in BAD_ROWS][::7]
    vectors = index.embed(queries)  # (q, d), unit length
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    scores, rows = index.search_embedding(vectors, k=10)
    exact_scores, exact_rows = index.search_embedding(vectors, k=10, exact=True)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact_rows, strict=True)])
    assert recall >= 0.98
    np.testing.assert_allclose(scores[:, 0], exact_scores[:, 0], atol=1e-5)
    assert np.all(scores[:, 0] > 0.999)  # each library molecule finds itself (or a duplicate)
    assert not set(BAD_ROWS) & set(rows.ravel().tolist())
    # brute force by hand over the stored parts
    from smiexlm.parts.reading import read_parts

    table = read_parts(library[0]).to_pandas()
    emb = table.filter(regex=r"^e\d+$").to_numpy()
    emb = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    cos = np.nan_to_num(vectors @ emb.T, nan=-2.0)  # (q, N)
    np.testing.assert_allclose(exact_scores, -np.sort(-cos, axis=1)[:, :10], atol=1e-5)


def test_ecfp4_search_is_rdkits_bulk_tanimoto(index, library):
    from rdkit import Chem, DataStructs

    from smiexlm.chemistry.fingerprints import morgan_generator

    _, smiles = library
    generator = morgan_generator(2, 2048)
    mols = [Chem.MolFromSmiles(s) for s in smiles]
    fps = [generator.GetFingerprint(m) for m in mols if m is not None]
    rows = [i for i, m in enumerate(mols) if m is not None]
    queries = ["CC(=O)Nc1ccc(O)cc1CC", "c1ccncc1CCCCl", "CCN(CC)CC(=O)Nc1c(C)cccc1C"]
    scores, found = index.search_ecfp4(queries, k=10)
    for q, query in enumerate(queries):
        sims = DataStructs.BulkTanimotoSimilarity(generator.GetFingerprint(Chem.MolFromSmiles(query)), fps)  # fmt: skip
        order = sorted(range(len(sims)), key=lambda j: (-sims[j], rows[j]))[:10]
        assert found[q].tolist() == [rows[j] for j in order]
        np.testing.assert_allclose(scores[q], [sims[j] for j in order], atol=1e-6)


def test_search_table_and_its_errors(index, library, tmp_path):
    hits = index.search(["CCO", "c1ccccc1CCO"], k=3, by="both")
    assert len(hits) == 2 * 2 * 3
    assert list(hits.columns) == ["query_index", "query", "by", "rank", "score", "row", "name",
                                  "smiles"]  # fmt: skip
    assert (hits["name"] == "mol" + hits["row"].astype(str)).all()
    assert hits.groupby(["query_index", "by"])["score"].apply(lambda s: s.is_monotonic_decreasing).all()  # fmt: skip
    assert index.search(["CCO"], k=2, by="ecfp4")["by"].unique().tolist() == ["ecfp4"]
    with pytest.raises(ConfigError, match="'by'"):
        index.search(["CCO"], by="maccs")  # type: ignore[arg-type]
    with pytest.raises(InvalidSmilesError):
        index.search(["C1CC"], by="ecfp4")
    other = SearchIndex(index.directory, make_checkpoint(tmp_path / "other"), device="cpu")
    with pytest.raises(DataError, match="is not the model that made the index's embeddings"):
        other.search(["CCO"], by="embedding")
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "manifest.json").write_text('{"format": "smiexlm-parts/1", "complete": false}')
    with pytest.raises(DataError, match="unfinished"):
        build_index(unfinished, tmp_path / "idx")


def test_packed_fingerprints_and_popcount():
    from rdkit import Chem

    from smiexlm.chemistry.fingerprints import morgan_fingerprints

    smiles = ["CCO", "c1ccccc1O", "not a smiles"]
    packed = ecfp4_packed(smiles)
    assert packed.shape == (3, 32) and packed.dtype == np.uint64
    bits = morgan_fingerprints(smiles[:2])
    assert popcount(packed).tolist() == [*bits.sum(axis=1).tolist(), 0]
    unpacked = np.unpackbits(packed[:2].view(np.uint8), axis=1)
    np.testing.assert_array_equal(unpacked, bits)
    assert Chem.MolFromSmiles("CCO") is not None


def test_cli_index_then_search(library, tmp_path):
    idx, hits = tmp_path / "idx", tmp_path / "hits.csv"
    res = run_smiexlm("index", library[0], "--out", idx, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"indexed {len(library[1])} rows" in res.stdout
    res = run_smiexlm("search", idx, "--query", "CCO", "c1ccccc1CCO", "-k", "3", "--by", "both",
                      "--out", hits, "--device", "cpu", timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "query 2 'c1ccccc1CCO', embedding cosine:" in res.stdout
    assert "ECFP4 Tanimoto" in res.stdout
    table = pd.read_csv(hits)
    assert len(table) == 12 and set(table["by"]) == {"embedding", "ecfp4"}
    # a query RDKit cannot read is left out and listed; the others keep their numbers
    res = run_smiexlm("search", idx, "--query", "C1CC", "c1ccccc1CCO", "-k", "3", "--out", hits,
                      "--device", "cpu", timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "1 of 2 queries left out" in res.stderr and "query 1 'C1CC'" in res.stderr
    assert set(pd.read_csv(hits)["query_index"]) == {1}
    listed = pd.read_csv(tmp_path / "hits.rejects.csv")
    assert listed.values.tolist() == [[0, "C1CC", "RDKit cannot parse it"]]
    res = run_smiexlm("search", idx, "--query", "C1CC", timeout=120)
    assert res.returncode == 2 and "RDKit reads none of the 1 queries" in res.stderr
    # a query longer than the model's positions is left out of both methods, and listed
    queries = tmp_path / "queries.csv"
    pd.DataFrame({"SMILES": ["C" * 1200, "CCO"]}).to_csv(queries, index=False)
    res = run_smiexlm("search", idx, "--queries", queries, "--smiles-col", "SMILES", "-k", "2",
                      "--out", hits, "--device", "cpu", timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "1 of 2 queries left out" in res.stderr and "exceed" in res.stderr
    assert set(pd.read_csv(hits)["query_index"]) == {1} and len(pd.read_csv(hits)) == 4


def test_library_columns_named_like_the_hits_own_are_kept_under_new_names(tmp_path):
    """A library whose id columns are called score and rank: the hits' own scores are the
    similarities, the library's come under input_score and input_rank."""
    smiles = [s for _, s, _ in DRUG_PANEL[:12]]
    table = tmp_path / "lib.csv"
    pd.DataFrame({"score": [-5.0 - i for i in range(12)], "rank": range(100, 112),
                  "smiles": smiles}).to_csv(table, index=False)  # fmt: skip
    embed_parts(table, tmp_path / "emb", device="cpu", progress=False)
    build_index(tmp_path / "emb", tmp_path / "idx", progress=False)
    hits = SearchIndex(tmp_path / "idx", device="cpu").search([smiles[3]], k=2, by="ecfp4")
    assert list(hits.columns) == ["query_index", "query", "by", "rank", "score", "row",
                                  "input_score", "input_rank", "smiles"]  # fmt: skip
    assert hits["score"].iloc[0] == pytest.approx(1.0) and hits["rank"].tolist() == [1, 2]
    assert (
        hits["input_score"].iloc[0] == "-8.0" and hits["input_rank"].iloc[0] == "103"
    )  # as written
    res = run_smiexlm("search", tmp_path / "idx", "--query", smiles[3], "-k", "1", "--by",
                      "ecfp4", "--device", "cpu", timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "  1  1.000  row 3" in res.stdout and "-8.0 103" in res.stdout, res.stdout
