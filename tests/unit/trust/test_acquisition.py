"""Picking the next molecules to test: scores, the diversity walk against RDKit's own Tanimoto,
the refusals, and the command."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from smiexlm.errors import ConfigError, DataError
from smiexlm.trust.acquisition import acquisition, select

# A homologous series (near-copies of each other) and unrelated molecules.
SERIES = ["CCCCCCCCCCO", "CCCCCCCCCCCO", "CCCCCCCCCCCCO", "CCCCCCCCCCCCCO"]
OTHERS = ["c1ccccc1C(=O)O", "CC(=O)Nc1ccc(O)cc1", "C1CCNCC1", "O=C(O)CCC(=O)O", "CN1CCCC1c1cccnc1"]


def _predictions(p, smiles=None, **extra):
    smiles = smiles or (SERIES + OTHERS)[: len(p)]
    frame = pd.DataFrame({"id": [f"m{i}" for i in range(len(p))], "smiles": smiles,
                          "valid": [True] * len(p), "active": p, **extra})  # fmt: skip
    return frame


def _tanimoto(a: str, b: str) -> float:
    from rdkit import Chem, DataStructs
    from rdkit.Chem import rdFingerprintGenerator

    gen = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=2048)
    fa, fb = (gen.GetFingerprint(Chem.MolFromSmiles(s)) for s in (a, b))
    return DataStructs.TanimotoSimilarity(fa, fb)


def test_uncertainty_ranks_probabilities_nearest_one_half_and_never_picks_bad_rows():
    p = [0.9, 0.52, 0.5, 0.1, 0.45, 0.7]
    frame = _predictions(p, smiles=OTHERS + ["CCO"])
    frame.loc[2, "valid"] = False  # an unparsable input: NaN in predict's output
    frame.loc[2, "active"] = np.nan
    np.testing.assert_allclose(acquisition(frame, "active", "uncertainty")[[0, 1, 4]],
                               [0.2, 0.96, 0.9])  # fmt: skip
    chosen = select(frame, 3, "uncertainty", max_similarity=1.0)
    assert chosen.picks["id"].tolist() == ["m1", "m4", "m5"] and chosen.picks["pick"].tolist() == [1, 2, 3]  # fmt: skip
    assert (chosen.n_rows, chosen.n_unscored, chosen.n_too_similar) == (6, 1, 0)
    lowest = select(frame, 2, "value", max_similarity=1.0, lowest=True)
    assert lowest.picks["id"].tolist() == ["m3", "m4"]


def test_the_diversity_walk_matches_rdkit_tanimoto_pair_by_pair():
    smiles = SERIES + OTHERS
    frame = _predictions(list(np.linspace(0.5, 0.95, len(smiles))), smiles=smiles)
    threshold = 0.6
    chosen = select(frame, 6, "uncertainty", max_similarity=threshold)
    picked = chosen.picks["smiles"].tolist()
    for a, b in itertools.combinations(picked, 2):  # no two picks above the threshold
        assert _tanimoto(a, b) <= threshold, (a, b)
    order = np.argsort(-(1 - np.abs(2 * frame["active"].to_numpy() - 1)), kind="stable")
    walked = [smiles[i] for i in order]
    walked = walked[: walked.index(picked[-1]) + 1]  # the ranking down to the last pick
    skipped = [s for s in walked if s not in picked]
    for s in skipped:  # each skipped one was too near a pick made before it
        before = [q for q in picked if walked.index(q) < walked.index(s)]
        assert max(_tanimoto(s, q) for q in before) > threshold, s
    assert chosen.n_too_similar == len(skipped) > 0 and picked[0] == SERIES[0]
    assert len(set(picked) & set(SERIES)) == 1  # one of the series stands for all of it


def test_spread_and_novelty_read_predicts_columns_and_say_what_is_missing():
    frame = _predictions([0.2, 0.4, 0.6], active_std=[0.05, 0.3, 0.1],
                         nearest_tanimoto=[0.9, 0.2, 0.5])  # fmt: skip
    assert select(frame, 1, "std", max_similarity=1.0).picks["id"].tolist() == ["m1"]
    assert select(frame, 3, "novelty", max_similarity=1.0).picks["id"].tolist() == ["m1", "m2", "m0"]  # fmt: skip
    with pytest.raises(DataError, match="active_tta_std.*--tta"):
        select(frame, 1, "tta_std")
    frame["activity"] = [3.0, 7.5, 5.0]  # a second numeric column: which task?
    with pytest.raises(DataError, match="name one with --task"):
        select(frame, 1, "value")
    with pytest.raises(DataError, match=r"outside \[0, 1\].*--by std"):
        select(frame, 1, "uncertainty", task="activity")
    with pytest.raises(ConfigError, match="-n"):
        select(frame, 0, "std", task="active")
    with pytest.raises(ConfigError, match="--by"):
        select(frame, 1, "entropy", task="active")


def test_ucb_adds_kappa_spreads_to_the_value_and_needs_a_spread():
    frame = _predictions([0.2, 0.5, 0.6], smiles=OTHERS[:3], active_tta_std=[0.5, 0.05, 0.0])
    # value + 1 x spread: 0.7, 0.55, 0.6 -> m0, m2, m1; kappa 0 is the value alone
    assert select(frame, 3, "ucb").picks["id"].tolist() == ["m0", "m2", "m1"]
    np.testing.assert_allclose(select(frame, 3, "ucb").picks["acquisition"], [0.7, 0.6, 0.55])
    assert select(frame, 3, "ucb", kappa=0).picks["id"].tolist() == ["m2", "m1", "m0"]
    # wanted low: -value + spread = 0.3, -0.45, -0.6
    assert select(frame, 1, "ucb", lowest=True).picks["id"].tolist() == ["m0"]
    frame["active_std"] = [0.0, 1.0, 0.0]  # the ensemble's spread comes first
    assert select(frame, 1, "ucb").picks["id"].tolist() == ["m1"]
    for kappa in (-1, float("nan"), float("inf"), True):
        with pytest.raises(ConfigError, match="--kappa"):
            select(frame, 1, "ucb", kappa=kappa)
    with pytest.raises(DataError, match=r"--by ucb needs a spread.*--tta K"):
        select(_predictions([0.2, 0.5]), 1, "ucb")


def test_an_option_that_does_nothing_with_the_chosen_score_is_refused(tmp_path):
    """--lowest orders predictions (value, ucb), --kappa weighs ucb's spread, and novelty is
    one column for every task: elsewhere each would be ignored, so each is refused."""
    frame = _predictions([0.2, 0.4, 0.6], active_std=[0.05, 0.3, 0.1],
                         nearest_tanimoto=[0.9, 0.2, 0.5])  # fmt: skip
    for by in ("uncertainty", "std", "novelty"):
        with pytest.raises(ConfigError, match=rf"'--lowest' = True: expected it only with "
                           rf"--by value or ucb .*--by {by} ranks by"):  # fmt: skip
            select(frame, 1, by, lowest=True)
    for by in ("uncertainty", "value"):
        with pytest.raises(ConfigError, match=rf"'--kappa' = 0.5: .*--by ucb.*--by {by}"):
            select(frame, 1, by, kappa=0.5)
    with pytest.raises(ConfigError, match=r"'--task' = 'active': expected none with --by novelty"):
        select(frame, 1, "novelty", task="active")
    frame["activity"] = [3.0, 7.5, 5.0]  # two tasks: novelty needs no --task all the same
    assert select(frame, 1, "novelty", max_similarity=1.0).picks["id"].tolist() == ["m1"]
    table = tmp_path / "preds.csv"
    frame.to_csv(table, index=False)
    from smiexlm.cli.main import app

    result = CliRunner().invoke(app, ["select", str(table), "--lowest", "--out",
                                      str(tmp_path / "picks.csv")])  # fmt: skip
    assert isinstance(result.exception, ConfigError), result.output
    assert "--lowest" in str(result.exception) and "--by uncertainty" in str(result.exception)
    assert not (tmp_path / "picks.csv").exists()


def test_the_select_command_writes_the_picks(tmp_path):
    from smiexlm.cli.main import app

    table = tmp_path / "preds.csv"
    _predictions([0.9, 0.52, 0.5, 0.1, 0.45], smiles=OTHERS).to_csv(table, index=False)
    out = tmp_path / "picks.csv"
    result = CliRunner().invoke(app, ["select", str(table), "-n", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    picks = pd.read_csv(out)
    assert picks["id"].tolist() == ["m2", "m1"] and list(picks.columns)[-2:] == ["acquisition", "pick"]  # fmt: skip
    assert "2 picked of 5 rows (0 without a score" in result.output
    spread = _predictions([0.9, 0.5], smiles=OTHERS[:2], active_std=[0.0, 0.6])
    spread.to_csv(table, index=False)
    result = CliRunner().invoke(app, ["select", str(table), "-n", "1", "--by", "ucb",
                                      "--kappa", "0.5", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert pd.read_csv(out)["acquisition"].tolist() == pytest.approx([0.9])  # 0.9 > 0.5 + 0.3


def test_input_columns_named_like_the_picks_columns_are_kept_under_new_names():
    frame = pd.DataFrame({"smiles": ["CCO", "CCN", "CCC"], "p": [0.5, 0.3, 0.9],
                          "pick": ["x", "y", "z"], "input_pick": [1, 2, 3],
                          "acquisition": ["a", "b", "c"]})  # fmt: skip
    picks = select(frame, 3, "uncertainty", "p", max_similarity=1.0).picks
    assert list(picks.columns) == ["smiles", "p", "input_input_pick", "input_pick",
                                   "input_acquisition", "acquisition", "pick"]  # fmt: skip
    assert picks["input_input_pick"].tolist() == ["x", "y", "z"]  # input_pick was taken
    assert picks["input_pick"].tolist() == [1, 2, 3]
    assert picks["pick"].tolist() == [1, 2, 3]


def test_select_on_a_csv_keeps_the_cells_as_written_and_reads_the_scores(tmp_path):
    """Ids such as 007 and NA come out as they went in; a blank score or an invalid row is
    never picked; the kernel members' columns beside a regression label are not labels."""
    from smiexlm.cli.main import app
    from smiexlm.forests.kernels import KERNELS

    table, out = tmp_path / "preds.csv", tmp_path / "picks.csv"
    members = {f"pIC50_svr_{k}": [5.0, 6.0, 7.0, 8.0, 4.0] for k in KERNELS}
    frame = pd.DataFrame({"cid": ["007", "1.50", "NA", "0012", "x"], "smiles": OTHERS,
                          "valid": [True, True, True, False, True],
                          "pIC50": ["6.5", "", "7.25", "9.0", "5.0"], **members,
                          "pIC50_model": [6.0] * 5, "pIC50_forest": [7.0] * 5})  # fmt: skip
    frame.to_csv(table, index=False)
    result = CliRunner().invoke(app, ["select", str(table), "-n", "5", "--by", "value",
                                      "--max-similarity", "1", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    picks = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert picks["cid"].tolist() == ["NA", "007", "x"]  # 9.0 is invalid, "" has no score
    assert picks["pIC50"].tolist() == ["7.25", "6.5", "5.0"]
    assert "3 picked of 5 rows (2 without a score" in result.output
    frame.assign(pIC50=["6.5", "high", "", "", ""]).to_csv(table, index=False)
    result = CliRunner().invoke(app, ["select", str(table), "--by", "value"])
    assert result.exit_code != 0 and "'pIC50'" in str(result.exception)
    assert "expected numbers" in str(result.exception)


def test_uncertainty_on_a_blend_reads_its_members_probabilities():
    """A quantile blend's score ranks (0.5 is the median validation molecule, not a toss-up):
    the closeness to 0.5 is taken of the mean of the network's and the forest's
    probabilities."""
    frame = _predictions([0.5, 0.92, 0.1], smiles=OTHERS[:3],
                         active_model=[0.05, 0.6, 0.2], active_forest=[0.1, 0.4, 0.1])  # fmt: skip
    score = acquisition(frame, "active", "uncertainty")
    np.testing.assert_allclose(score, [0.15, 1.0, 0.3])
    assert select(frame, 1, max_similarity=1.0).picks["id"].tolist() == ["m1"]
