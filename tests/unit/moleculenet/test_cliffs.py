"""Activity cliffs against a brute force of their definition: RDKit's own Tanimoto on
ECFP4 and on generic Murcko scaffolds, and an edit distance computed by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from smiexlm.errors import ConfigError
from smiexlm.moleculenet.cliffs import cliff_molecules, cliff_pairs, cliff_rmse

SMILES = ["c1ccccc1CCN", "c1ccccc1CCO", "c1ccccc1CCCN", "Cc1ccccc1CCN", "CCOC(=O)C",
          "CCOC(=O)CC", "c1ccncc1C(=O)N", "c1ccncc1C(=O)O", "not a smiles", "OCC1CCCC1"]  # fmt: skip
VALUES = [5.0, 7.5, 5.2, 6.9, 4.0, 4.1, 8.0, 6.5, 9.0, float("nan")]


def _levenshtein(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def _by_hand(similarity: float, gap: float) -> set[tuple[int, int]]:
    from rdkit import Chem, DataStructs
    from rdkit.Chem import rdFingerprintGenerator
    from rdkit.Chem.Scaffolds import MurckoScaffold

    gen = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)
    mols = [Chem.MolFromSmiles(s) for s in SMILES]
    out = set()
    for i, j in itertools.combinations(range(len(SMILES)), 2):
        if mols[i] is None or mols[j] is None or not abs(VALUES[i] - VALUES[j]) > gap:
            continue
        a, b = (Chem.MolToSmiles(mols[k]) for k in (i, j))
        edit = 1 - _levenshtein(a, b) / max(len(a), len(b))
        ecfp = DataStructs.TanimotoSimilarity(
            gen.GetFingerprint(mols[i]), gen.GetFingerprint(mols[j])
        )
        cores = [MurckoScaffold.MakeScaffoldGeneric(MurckoScaffold.GetScaffoldForMol(mols[k]))
                 for k in (i, j)]  # fmt: skip
        scaffold = 0.0
        if all(c.GetNumAtoms() for c in cores):
            fps = [gen.GetFingerprint(c) for c in cores]
            scaffold = DataStructs.TanimotoSimilarity(*fps)
        if max(edit, ecfp, scaffold) >= similarity - 1e-6:
            out.add((i, j))
    return out


@pytest.mark.parametrize(("similarity", "gap"), [(0.9, 1.0), (0.6, 1.0), (0.5, 0.05)])
def test_cliff_pairs_are_the_brute_force_of_the_definition(similarity, gap):
    pairs = cliff_pairs(SMILES, VALUES, similarity, gap)
    assert set(zip(pairs.i, pairs.j, strict=True)) == _by_hand(similarity, gap)
    assert (pairs.gap > gap).all() and pairs.gap.is_monotonic_decreasing
    assert all(row.by for row in pairs.itertuples())  # each names a measure that reached it
    mask = cliff_molecules(SMILES, np.array(VALUES), similarity, gap)[:, 0]
    in_pairs = set(pairs.i) | set(pairs.j)
    assert set(np.flatnonzero(mask)) == in_pairs
    assert not mask[8] and not mask[9]  # unparsable, and no value


def test_a_methyl_with_a_big_jump_is_a_cliff_and_the_rmse_is_over_its_molecules():
    pairs = cliff_pairs(SMILES, VALUES)
    first = pairs.iloc[0]
    assert {first.smiles_i, first.smiles_j} <= set(SMILES) and first.gap > 1
    cliffs = cliff_molecules(SMILES, np.array(VALUES))
    y, pred = np.array(VALUES)[:, None], np.array(VALUES)[:, None] + 0.5
    pred[cliffs[:, 0]] += 1.5  # wrong by 2 on the cliff molecules, by 0.5 elsewhere
    rmse, n = cliff_rmse(y, pred, cliffs)
    assert n == int(cliffs.sum()) > 0 and rmse == pytest.approx(2.0)
    assert cliff_rmse(y, pred, np.zeros_like(cliffs)) == (pytest.approx(math.nan, nan_ok=True), 0)


def test_bad_thresholds_are_refused_and_the_cli_writes_the_pairs(tmp_path):
    from typer.testing import CliRunner

    from smiexlm.cli.main import app

    for kwargs in ({"similarity": 0}, {"similarity": 1.5}, {"gap": -1}, {"gap": math.inf}):
        with pytest.raises(ConfigError):
            cliff_pairs(SMILES, VALUES, **kwargs)
    table = tmp_path / "t.csv"
    pd.DataFrame({"smiles": SMILES, "pki": VALUES}).to_csv(table, index=False)
    done = CliRunner().invoke(app, ["cliffs", str(table), "--label-col", "pki", "--out",
                                    str(tmp_path / "pairs.csv")])  # fmt: skip
    assert done.exit_code == 0, done.output
    written = pd.read_csv(tmp_path / "pairs.csv")
    assert len(written) == len(cliff_pairs(SMILES, VALUES)) and "cliff pairs" in done.output
    bad = CliRunner().invoke(app, ["cliffs", str(table), "--label-col", "pic50", "--out",
                                   str(tmp_path / "p.csv")])  # fmt: skip
    assert bad.exit_code != 0 and "'pic50' is not a column" in str(bad.exception)


def test_the_cli_lists_the_rows_in_no_pair_and_the_measures_can_be_chosen(tmp_path):
    """Rows without a parsable SMILES or a finite value go to OUT.rejects.csv with their
    reason; a molecule measured twice is flagged; --measures leaves the scaffold out (one-ring
    molecules are then no longer one core); a folder as --out, a column of text, refused."""
    from typer.testing import CliRunner

    from smiexlm.cli.main import app

    rows = [("c1ccccc1CCO", "5.0"), ("OCCc1ccccc1", "7.0"), ("CN(C)C(=O)c1ccc(cc1)OC", "2.0"),
            ("CC1CCCCC1C", "4.5"), ("CCCCCCCCO", "abc"), ("CCCCCCCCCO", "inf"), ("C1CC", "3"),
            ("", "3"), ("CCCCCCO", ""), ("CCCCCCOc1ccccc1\u00d6", "9")]  # fmt: skip
    table = tmp_path / "t.csv"
    pd.DataFrame(rows, columns=["smiles", "y"]).to_csv(table, index=False)

    def run(*extra: str):
        return CliRunner().invoke(app, ["cliffs", str(table), "--label-col", "y", *extra])

    done = run("--out", str(tmp_path / "all.csv"))
    assert done.exit_code == 0, done.output
    rejects = pd.read_csv(tmp_path / "all.rejects.csv", keep_default_na=False)
    assert rejects["row"].tolist() == [4, 5, 6, 7, 8, 9]
    assert [r.split(":")[0].split(",")[0] for r in rejects["reason"]] == [
        "'y' = 'abc'",
        "'y' = 'inf'",
        "RDKit cannot parse the SMILES",
        "no SMILES",
        "no value in 'y'",
        "a character beyond ASCII",
    ]  # fmt: skip (RDKit would drop it)
    pairs = pd.read_csv(tmp_path / "all.csv")
    twice = pairs[pairs["same_molecule"]]  # rows 0 and 1: one molecule, two values
    assert (twice.i.tolist(), twice.j.tolist(), twice.gap.tolist()) == ([0], [1], [2.0])
    assert ((pairs.i == 2) & (pairs.j == 3) & (pairs.by == "scaffold")).any()  # one ring each
    done = run("--out", str(tmp_path / "two.csv"), "--measures", "ecfp4,smiles")
    assert done.exit_code == 0, done.output
    assert set(pd.read_csv(tmp_path / "two.csv")["by"]) <= {"ecfp4", "smiles", "ecfp4+smiles"}
    assert len(pd.read_csv(tmp_path / "two.csv")) == 1
    for extra, words in ((("--measures", "ecfp6"), "measures"),
                         (("--out", str(tmp_path)), "is a directory"),
                         (("--out", str(tmp_path / "x.csv"), "--label-col", "smiles"),
                          "none of its 10 rows")):  # fmt: skip
        args = ["--out", str(tmp_path / "x.csv"), *extra] if extra[0] != "--out" else extra
        bad = run(*args)
        assert bad.exit_code != 0 and words in str(bad.exception), bad.output


def test_values_near_the_float_range_give_their_gaps_without_warnings():
    import warnings

    smiles = ["c1ccccc1CCCCCC", "c1ccccc1CCCCCCC", "CCCCCCCCO"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's overflow warning would fail here
        pairs = cliff_pairs(smiles, [1e308, -1e308, 1.0], similarity=0.3)
        marked = cliff_molecules(smiles, np.array([1e308, -1e308, 1.0]), similarity=0.3)
    gaps = dict(zip(zip(pairs["i"], pairs["j"], strict=True), pairs["gap"], strict=True))
    assert gaps[(0, 1)] == math.inf and gaps[(0, 2)] == 1e308
    assert marked[:, 0].tolist() == [True, True, True]


def test_exactly_tenfold_is_no_cliff_whatever_the_floating_point_says():
    """8.3 - 7.3 is 1.0000000000000009 in floating point: still exactly tenfold, no cliff."""
    smiles = ["c1ccccc1CCN", "c1ccccc1CCCN", "c1ccccc1CCCCN"]
    assert 8.3 - 7.3 > 1.0
    assert cliff_pairs(smiles, [8.3, 7.3, 8.3], similarity=0.5).empty
    assert not cliff_molecules(smiles, np.array([8.3, 7.3, 8.3]), similarity=0.5).any()
    assert len(cliff_pairs(smiles, [8.3, 7.29, 8.3], similarity=0.5)) == 2


def test_a_molecule_without_a_generic_scaffold_is_similar_by_the_other_measures():
    """RDKit parses a spirophosphorane but cannot make its scaffold generic (a valence
    error): its scaffold is similar to nothing, its own bits and SMILES still count."""
    smiles = ["P12(OCCO1)(OCCO2)c1ccccc1", "P12(OCCO1)(OCCO2)c1ccccc1C", "CCO"]
    pairs = cliff_pairs(smiles, [5.0, 7.0, 9.0], similarity=0.45)
    assert list(zip(pairs.i, pairs.j, strict=True)) == [(0, 1)] and pairs.scaffold[0] == 0.0


def test_blocks_of_rows_give_what_the_whole_table_gives(monkeypatch):
    from smiexlm.moleculenet import cliffs

    whole = cliff_pairs(SMILES, VALUES, 0.5, 0.05)
    every = cliff_molecules(SMILES, np.array(VALUES), 0.5, 0.05)
    monkeypatch.setattr(cliffs, "BLOCK", 3)  # 10 rows in blocks of 3, 3, 3 and 1
    pd.testing.assert_frame_equal(cliff_pairs(SMILES, VALUES, 0.5, 0.05), whole)
    rows = np.array([7, 0, 3, 9])
    np.testing.assert_array_equal(
        cliff_molecules(SMILES, np.array(VALUES), 0.5, 0.05, rows=rows), every[rows]
    )


def test_a_regression_result_reports_the_cliff_rmse_at_the_runs_own_gap():
    """A seed's record holds the RMSE on the test molecules that form cliffs and their
    count, with any molecule of the table, at the config's ``cliff_gap``."""
    from smiexlm.moleculenet.metrics import TaskScores
    from smiexlm.moleculenet.splits import Split
    from smiexlm.moleculenet.task import MoleculeTask

    parsable = [i for i in range(len(SMILES)) if i != 8 and not math.isnan(VALUES[i])]
    smiles = [SMILES[i] for i in parsable]
    y = np.array([VALUES[i] for i in parsable])[:, None]
    task = MoleculeTask("toy", smiles, y, ["y"], "regression")
    split = Split("random", 0, [0, 2, 4, 6], [5], [1, 3, 7])
    pred = y[split.test] + 1.0  # wrong by 1 everywhere
    counted = []
    for gap in (1.0, 2.0, 5.0):
        config = {"cliff_gap": gap}
        more = task.result("m", split, 0, 0.0, TaskScores(1.0, [1.0], 1), 0.0, config,
                           test_pred=pred).more  # fmt: skip
        expected = cliff_molecules(smiles, y, gap=gap, similarity=0.9)[split.test, 0]
        assert more["n_cliff"] == int(expected.sum())
        assert more["cliff_rmse"] == (pytest.approx(1.0) if expected.any() else
                                      pytest.approx(math.nan, nan_ok=True))  # fmt: skip
        counted.append(more["n_cliff"])
    assert counted[0] > counted[-1] == 0, counted  # no pair differs by more than 5
