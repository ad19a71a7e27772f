"""``smiexlm predict`` into a folder of Parquet parts: the same rows as the CSV output, and
the same again from 2 processes under torchrun."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pandas as pd

from smiexlm.parts.reading import read_parts
from tests.conftest import torchrun_command


def test_predict_into_parts_matches_the_csv(tmp_path):
    from typer.testing import CliRunner

    from smiexlm.cli.main import app
    from tests.unit.finetuning.test_moleculenet_finetune import _small_csv

    train, _ = _small_csv(tmp_path)
    models = tmp_path / "models"
    result = CliRunner().invoke(app, [
        "finetune", "mini", "--data", str(train), "--smiles-col", "smi", "--label-cols", "y",
        "--split", "random", "--max-train-steps", "1", "--batch-size", "8", "--epochs", "1",
        "--device", "cpu", "--random-init", "--seeds", "0", "1", "--save-dir", str(models),
        "--out", str(tmp_path / "ft"),
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    inputs = tmp_path / "new.csv"
    new = ["CCO", "", "c1ccccc1CC", "C C", "xx", "CCN", "CCCO"]
    pd.DataFrame({"name": list("abcdefg"), "smiles": new}).to_csv(inputs, index=False)
    ckpt = ["--checkpoint", str(models / "seed0"), str(models / "seed1")]
    csv = CliRunner().invoke(app, ["predict", *ckpt, "--input", str(inputs), "--out", str(tmp_path / "p.csv")])  # fmt: skip
    assert csv.exit_code == 0, csv.output
    parts = CliRunner().invoke(app, ["predict", *ckpt, "--input", str(inputs), "--out",
                                     str(tmp_path / "p"), "--part-rows", "3"])  # fmt: skip
    assert parts.exit_code == 0, parts.output
    want = pd.read_csv(tmp_path / "p.csv", dtype={"name": str}, keep_default_na=False)
    got = read_parts(tmp_path / "p").to_pandas()
    domain = ["nearest_tanimoto", "mean_tanimoto_k5", "nearest_cosine", "mean_cosine_k5"]
    assert (
        list(got.columns)
        == list(want.columns)
        == [
            "name",
            "smiles",
            "valid",
            "y",
            "y_std",
            "y_model",
            "y_forest",
            "truncated",
            *domain,
            "in_domain",
        ]
    )  # fmt: skip (the default's forest beside the model)
    assert (
        got["name"].tolist() == list("abcdefg") and got["valid"].tolist() == want["valid"].tolist()
    )
    for column in [
        "y",
        "y_model",
        "y_forest",
        *domain,
    ]:  # a molecule's values do not depend on its part
        np.testing.assert_allclose(
            got[column].to_numpy(), pd.to_numeric(want[column]).to_numpy(), rtol=1e-6
        )
    assert got["in_domain"].tolist() == (want["in_domain"].astype(str) == "True").tolist()
    assert not got["in_domain"][~got["valid"]].any()
    rejects = pd.read_csv(tmp_path / "p" / "rejects.csv", keep_default_na=False)
    assert rejects["row"].tolist() == [1, 3, 4]
    assert rejects["reason"].tolist()[:2] == ["empty string", "whitespace inside the SMILES"]
    # Parquet columns of a bool and an integer, null all through the first part: each part
    # keeps the input's types, so the folder reads back as one table
    import pyarrow as pa
    import pyarrow.parquet as pq

    nullable = tmp_path / "nullable.parquet"
    pq.write_table(pa.table({"smiles": new, "tested": pa.array([None, None, None, True, False,
                                                                None, True]),
                             "batch": pa.array([None] * 3 + [7, None, 8, 9], pa.int64())}),
                   nullable)  # fmt: skip
    parts = CliRunner().invoke(app, ["predict", *ckpt, "--input", str(nullable), "--out",
                                     str(tmp_path / "pn"), "--part-rows", "3"])  # fmt: skip
    assert parts.exit_code == 0, parts.output
    kept = read_parts(tmp_path / "pn")
    assert kept.schema.field("tested").type == pa.bool_()
    assert kept.schema.field("batch").type == pa.int64()
    assert kept.column("batch").to_pylist() == [None] * 3 + [7, None, 8, 9]
    # the same job as 2 processes under torchrun: each writes its share of the parts
    run = subprocess.run(
        [*torchrun_command(2), "predict", *ckpt, "--input", str(inputs), "--out",
         str(tmp_path / "p2"), "--part-rows", "2"],
        capture_output=True, text=True, timeout=180, env=os.environ | {"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    manifest = json.loads((tmp_path / "p2" / "manifest.json").read_text())
    assert [w["parts"] for w in manifest["last_run"]["workers"]] == [[0, 2], [1, 3]]
    shared = read_parts(tmp_path / "p2").to_pandas()
    assert shared[["name", "smiles", "valid"]].equals(got[["name", "smiles", "valid"]])
    np.testing.assert_allclose(shared["y"].to_numpy(), got["y"].to_numpy(), rtol=1e-6)
