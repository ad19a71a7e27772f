"""The compact copy of a cell's scores gives back what the cell kept, to float16's precision."""

from __future__ import annotations

import numpy as np
import pytest

from smiexlm.errors import DataError
from smiexlm.moleculenet import runs, score_store


def _cell(tmp_path, valid, test, near=True):
    folder = tmp_path / "row" / "runs" / "toy" / "seed2"
    folder.mkdir(parents=True)
    arrays = {"valid_rows": np.arange(len(valid)), "valid": valid,
              "test_rows": np.arange(len(test)) + 100, "test": test}  # fmt: skip
    if near:
        rng = np.random.default_rng(0)
        arrays |= {f"{p}_{k}": rng.random(len(a)) for p, a in (("valid", valid), ("test", test))
                   for k in score_store.NEARNESS}  # fmt: skip
    np.savez_compressed(folder / runs.PREDICTIONS_NAME, **arrays)
    return folder, arrays


def test_probabilities_keep_their_order_in_both_tails_and_their_ends_exactly(tmp_path):
    rng = np.random.default_rng(1)
    near_one = 1.0 - np.sort(rng.random(40)) * 1e-3  # float16 alone ties most of these
    test = np.concatenate([near_one, [0.0, 1.0, 0.5], rng.random(57)]).astype(np.float32)
    folder, arrays = _cell(tmp_path, rng.random((30, 2)).astype(np.float32), test[:, None])
    assert score_store.compact(folder.parents[1]) == 1
    (folder / runs.PREDICTIONS_NAME).unlink()
    back = score_store.read(folder)
    assert back["test"].dtype == np.float32 and back["test"].shape == (100, 1)
    assert back["test"][40:43, 0].tolist() == [0.0, 1.0, 0.5]
    assert np.array_equal(np.argsort(back["test"][:40, 0]), np.argsort(test[:40]))
    assert np.abs(back["test"][:, 0] - test).max() < 1e-3
    np.testing.assert_array_equal(back["test_rows"], arrays["test_rows"])
    assert back["test_rows"].dtype == np.int64
    np.testing.assert_allclose(back["valid_cosine"], arrays["valid_cosine"], atol=1e-3)
    assert runs.has_predictions(folder) and set(runs.kept_arrays(folder)) == set(arrays)


def test_values_outside_zero_one_are_kept_as_values_and_missing_similarities_stay_missing(tmp_path):
    valid = np.array([[-3.5], [0.25], [7.0]], np.float32)
    folder, _ = _cell(tmp_path, valid, np.array([[-1.0], [2.5]], np.float32), near=False)
    score_store.compact(folder.parents[1])
    (folder / runs.PREDICTIONS_NAME).unlink()
    back = score_store.read(folder)
    np.testing.assert_array_equal(back["valid"], valid)
    assert "valid_tanimoto" not in back and "test_cosine" not in back


def test_a_cell_without_scores_is_named(tmp_path):
    folder = tmp_path / "toy" / "seed0"
    folder.mkdir(parents=True)
    assert score_store.read(folder) is None and not runs.has_predictions(folder)
    with pytest.raises(DataError, match="no <set>/seed<k>/predictions.npz"):
        score_store.compact(tmp_path)
    (folder / score_store.STORE_NAME).write_bytes(b"not parquet")
    with pytest.raises(DataError, match="not a readable score file"):
        score_store.read(folder)
