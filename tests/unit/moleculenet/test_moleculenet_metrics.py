"""Metrics against scikit-learn and by hand; configs (Table 8); reports; the RF baseline."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr
from sklearn.metrics import (
    average_precision_score,
    mean_absolute_error,
    mean_squared_error,
    r2_score,
    roc_auc_score,
)

from smiexlm.errors import ConfigError, DataError
from smiexlm.finetuning.config import finetune_config, load_table
from smiexlm.moleculenet.metrics import (
    binary_average_precision,
    binary_roc_auc,
    check_scorable,
    more_scores,
    multitask_rmse,
    multitask_roc_auc,
)
from smiexlm.moleculenet.registry import get_spec
from smiexlm.moleculenet.report import (
    RunResult,
    markdown_table,
    more_markdown,
    read_results,
    summarize,
    write_report,
)


@pytest.mark.parametrize(("ours", "sklearn"), [(binary_roc_auc, roc_auc_score),
                                               (binary_average_precision, average_precision_score)])  # fmt: skip
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 6)), min_size=2, max_size=40),
)
def test_binary_measures_equal_sklearn_with_ties(ours, sklearn, pairs):
    y = np.array([p[0] for p in pairs])
    s = np.array([p[1] for p in pairs], dtype=float) / 3  # few distinct values: many ties
    got = ours(y, s)
    if len(set(y)) < 2:
        assert math.isnan(got)
    else:
        assert got == pytest.approx(sklearn(y, s), abs=1e-12)


def test_multitask_roc_auc_masks_missing_labels_by_hand():
    nan = np.nan
    y = np.array([[1, nan, 0], [0, 1, 0], [1, 0, 0], [nan, 1, 0], [0, nan, 0]])
    s = np.array([[0.9, 0.8, 0.1], [0.2, 0.3, 0.2], [0.4, 0.6, 0.3], [0.5, 0.2, 0.4],
                  [0.5, 0.9, 0.5]])  # fmt: skip
    out = multitask_roc_auc(y, s)
    # task 0, known rows 0,1,2,4: positives {0.9, 0.4}, negatives {0.2, 0.5}
    # pairs won: (0.9>0.2) (0.9>0.5) (0.4>0.2) -> 3 of 4
    assert out.per_task[0] == pytest.approx(0.75)
    # task 1, known rows 1,2,3: positives {0.3, 0.2}, negative {0.6} -> 0 of 2
    assert out.per_task[1] == pytest.approx(0.0)
    # task 2 has one class only: excluded, not counted as 0.5
    assert math.isnan(out.per_task[2]) and out.skipped == [2] and out.n_scored == 2
    assert out.mean == pytest.approx(0.375)
    # the same numbers via scikit-learn on the masked columns
    ref0 = roc_auc_score([1, 0, 1, 0], [0.9, 0.2, 0.4, 0.5])
    ref1 = roc_auc_score([1, 0, 1], [0.3, 0.6, 0.2])
    assert out.mean == pytest.approx((ref0 + ref1) / 2)


def test_rmse_equals_sklearn_and_masks():
    rng = np.random.default_rng(0)
    y, p = rng.normal(size=(30, 2)), rng.normal(size=(30, 2))
    y[3, 1] = np.nan
    out = multitask_rmse(y, p)
    known = ~np.isnan(y[:, 1])
    assert out.per_task[0] == pytest.approx(math.sqrt(mean_squared_error(y[:, 0], p[:, 0])))
    assert out.per_task[1] == pytest.approx(math.sqrt(mean_squared_error(y[known, 1], p[known, 1])))


def test_average_precision_by_hand():
    # ranked: + - + -  -> precision 1 at recall 1/2, 2/3 at recall 1: AP = (1 + 2/3) / 2
    assert binary_average_precision([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1]) == pytest.approx(5 / 6)
    # one tied run holding both: a single threshold, precision 2/4 at recall 1
    assert binary_average_precision([1, 0, 1, 0], [0.5] * 4) == pytest.approx(0.5)


def test_more_scores_mask_and_average_over_tasks_as_sklearn_scipy():
    rng = np.random.default_rng(1)
    y = (rng.random((40, 3)) < 0.3).astype(float)
    y[:5, 0], y[:, 2] = np.nan, 0.0  # task 2 holds one class: left out, as ROC-AUC leaves it
    p = rng.random((40, 3))
    out = more_scores("classification", y, p)
    known = ~np.isnan(y[:, 0])
    aps = [average_precision_score(y[known, 0], p[known, 0]),
           average_precision_score(y[:, 1], p[:, 1])]  # fmt: skip
    assert out["pr_auc"] == pytest.approx(100 * np.mean(aps))
    assert out["positives"] == pytest.approx(100 * np.mean([y[known, 0].mean(), y[:, 1].mean()]))
    v, q = rng.normal(size=(30, 2)), rng.normal(size=(30, 2))
    v[4, 1] = np.nan
    got, k = more_scores("regression", v, v + q), ~np.isnan(v[:, 1])
    cols = [(v[:, 0], v[:, 0] + q[:, 0]), (v[k, 1], v[k, 1] + q[k, 1])]
    assert got["mae"] == pytest.approx(np.mean([mean_absolute_error(a, b) for a, b in cols]))
    assert got["r2"] == pytest.approx(np.mean([r2_score(a, b) for a, b in cols]))
    assert got["spearman"] == pytest.approx(np.mean([spearmanr(a, b)[0] for a, b in cols]))


def test_reports_show_the_measures_beside_the_score(tmp_path):
    results = [_result("m", "bace", s, 80.0) for s in range(3)]
    for r, ap in zip(results, (30.0, 40.0, 50.0), strict=True):
        r.more = {"pr_auc": ap, "positives": 12.5}
    text = more_markdown(results)
    assert "| m | 40.0 ± 10.0 |" in text
    assert "| random ranking (the share of positives) | 12.5 ± 0.0 |" in text
    assert more_markdown([_result("m", "bace", 0, 80.0)]) == ""  # older results: no table
    paths = write_report(results, tmp_path, "test")
    assert read_results(paths["json"]) == results
    assert "PR-AUC x 100" in paths["md"].read_text()
    runs = paths["runs"].read_text()  # every run on a page of its own, linked from the summary
    assert "(runs.md)" in paths["md"].read_text() and runs.count("| m | bace |") == len(results)


def test_single_class_test_split_is_an_error():
    with pytest.raises(DataError, match="single class"):
        check_scorable(np.array([[0.0], [0.0], [np.nan]]), ["A"], "my", "scaffold")
    check_scorable(np.array([[0.0, 0.0], [1.0, 0.0]]), ["A", "B"], "my", "scaffold")


def test_table8_ships_and_overrides():
    table = load_table()
    expected = {  # task: (epochs, batch, lr, warmup, dropout, pooler dropout)
        "bace": (60, 64, 1e-4, 0.06, 0.1, 0.2), "bbbp": (40, 128, 4e-4, 0.06, 0.1, 0.1),
        "tox21": (80, 128, 1e-4, 0.06, 0.1, 0.1), "sider": (100, 32, 5e-4, 0.4, 0.1, 0.0),
        "muv": (40, 128, 2e-5, 0.2, 0.1, 0.1), "clintox": (100, 256, 5e-5, 0.1, 0.1, 0.5),
        "toxcast": (80, 64, 1e-4, 0.06, 0.1, 0.1),
    }  # fmt: skip
    for task, row in expected.items():
        cfg = finetune_config(task)
        got = (cfg.loop.epochs, cfg.loop.batch_size, cfg.loop.lr, cfg.loop.warmup_ratio,
               cfg.dropout, cfg.pooler_dropout)  # fmt: skip
        assert got == row, task
        assert task in table
    # the one setting of the project's own: MUV's and ToxCast's classes weighted, the rest not
    weights = {task: finetune_config(task).class_weight for task in expected}
    assert weights == {t: "balanced" if t in ("muv", "toxcast") else "none" for t in expected}
    assert finetune_config(None).class_weight == "none"  # a user's CSV
    assert finetune_config("muv", class_weight="none").class_weight == "none"
    cfg = finetune_config("bbbp", epochs=3, lr=None)
    assert (
        cfg.loop.epochs == 3
        and cfg.loop.lr == 4e-4
        and cfg.split == "scaffold"
        and cfg.canonicalize
    )
    with pytest.raises(ConfigError, match="epochs"):
        finetune_config("bbbp", epochs=0)
    with pytest.raises(ConfigError, match="learning_rate"):
        finetune_config("bbbp", learning_rate=1.0)


def _result(model, dataset, seed, test, split="scaffold", sha256=None):
    """A result on the set's own file (its registry sha256), or on a table of ``sha256``."""
    return RunResult(model, dataset, seed, split, "roc_auc", test, test, (8, 1, 1), 0, 1, 1,
                     1.0, sha256 or get_spec(dataset).sha256)  # fmt: skip


def test_report_mean_std_and_files(tmp_path):
    results = [_result("m", "bbbp", s, v) for s, v in enumerate([70.0, 72.0, 74.0])]
    results += [_result("m", "bace", s, v) for s, v in enumerate([80.0, 80.0, 80.0])]
    summary = summarize(results)
    assert summary["m"]["bbbp"] == pytest.approx((72.0, 2.0, 3))  # sample std
    table = markdown_table(results)
    assert "| m | 80.0 ± 0.0 | 72.0 ± 2.0 | 76.0 |" in table  # paper column order: BACE first
    assert "ExLM (paper) | 79.6 | 72.8 | 76.2 |" in table
    paths = write_report(results, tmp_path, "test")
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths.values())
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
    assert read_results(paths["json"]) == results
    text = paths["md"].read_text()
    assert "Split: scaffold." in text and get_spec("bbbp").sha256 in text
    esol = RunResult("m", "esol", 0, "scaffold", "rmse", 1.2, 1.1, (8, 1, 1), 0, 1, 1, 1.0,
                     get_spec("esol").sha256)  # fmt: skip
    mixed = write_report([*results, esol], tmp_path / "mixed", "mixed")["md"].read_text()
    assert "## Summary (test ROC-AUC x 100 or test RMSE, by set," in mixed


def test_reports_name_the_split_and_never_mix_splits_or_misplace_the_paper():
    from smiexlm.moleculenet.report import describe_splits

    scaffold = [_result("m", "bbbp", s, 70.0 + s) for s in range(3)]
    seeded = [_result("m", "bbbp", s, 90.0, f"random(seed={s})") for s in range(3)]
    assert describe_splits(seeded) == "random (seeds 0, 1, 2)"
    table = markdown_table(seeded)
    assert "| m | 90.0 ± 0.0 | 90.0 |" in table and "paper" not in table  # not the paper's split
    both = scaffold + seeded
    assert describe_splits(both) == "scaffold; random (seeds 0, 1, 2)"
    summary = summarize(both)  # one row per split: 71.0 and 90.0, never their mean 80.5
    assert summary["m [scaffold]"]["bbbp"][0] == pytest.approx(71.0)
    assert summary["m [random]"]["bbbp"][0] == pytest.approx(90.0)
    table = markdown_table(both)
    assert "| model | split | bbbp | mean |" in table
    assert "| m [random] | random | 90.0 ± 0.0 | 90.0 |" in table
    assert "| ExLM (paper) | scaffold | 72.8 | 72.8 |" in table
    own = [_result("m", "bbbp", s, 70.0, sha256="0" * 64) for s in range(3)]  # a user's table
    assert "paper" not in markdown_table(own)  # named bbbp, but not the set the paper scored


def test_rf_baseline_runs_and_is_seeded(shared_data):
    from smiexlm.forests.baseline import BaselineConfig, run_baseline
    from smiexlm.moleculenet import load_task

    task = load_task("bbbp")
    cfg = BaselineConfig(n_trees=20)
    first = run_baseline(task, [0], cfg)[0]
    again = run_baseline(task, [0], cfg)[0]
    assert first.test == again.test and first.sizes == (1631, 204, 204)
    assert 55.0 < first.test < 85.0  # a working forest; chance is 50
    assert first.split == "scaffold" and first.n_tasks_scored == 1
    with pytest.raises(ConfigError):
        BaselineConfig(n_trees=0)
    with pytest.raises(ConfigError, match="class_weight"):
        BaselineConfig(class_weight="auto")
