"""An option is never ignored without a word: one that does nothing in its context is refused,
and a setting that quietly throws data away (a SMILES cut short) or a name that matches no set
(a typo) is said on stderr."""

from __future__ import annotations

import logging

import pytest
import torch
from typer.testing import CliRunner

from smiexlm.errors import ConfigError
from tests.unit.finetuning.test_moleculenet_finetune import _finetune_cli, _small_csv


def _invoke(*args: str):
    from smiexlm.cli.main import app

    return CliRunner().invoke(app, list(args))


def test_valid_from_train_without_a_split_column_is_refused(tmp_path):
    path, _ = _small_csv(tmp_path)
    done = _finetune_cli(path, tmp_path / "out", "--valid-from-train", "0.2")
    assert done.exit_code != 0 and isinstance(done.exception, ConfigError)
    assert (
        "'--valid-from-train' = 0.2: expected it only with --data and --split column:NAME"
        in str(done.exception)
    )
    assert not (tmp_path / "out").exists()  # refused before any compute
    bench = _invoke("baseline", "--tasks", "bbbp", "--valid-from-train", "0.2")
    assert bench.exit_code != 0 and "--valid-from-train" in str(bench.exception)


def test_a_forest_or_features_of_its_own_with_a_wide_ensemble_is_refused():
    from smiexlm.finetuning.config import finetune_config

    for key, value in (("forest", "ecfp4"), ("features", "rdkit2d")):
        with pytest.raises(ConfigError, match=f"'{key}' = '{value}': expected none with ensemble"):
            finetune_config("bbbp", ensemble="wide", **{key: value})
    assert finetune_config("bbbp", ensemble="wide", forest="auto").forest == "auto"


def test_a_max_length_that_cuts_most_molecules_is_said(tmp_path, caplog):
    torch.set_num_threads(1)
    path, _ = _small_csv(tmp_path)
    with caplog.at_level(logging.WARNING):
        done = _finetune_cli(path, tmp_path / "out", "--seeds", "0", "--set", "max_length=4")
    assert done.exit_code == 0, done.output
    said = [r.getMessage() for r in caplog.records if "max_length=4 cuts" in r.getMessage()]
    assert len(said) == 1 and "of 60 molecules" in said[0], said
    with caplog.at_level(logging.WARNING):
        caplog.clear()
        _finetune_cli(path, tmp_path / "whole", "--seeds", "0")
    assert not [r for r in caplog.records if "cuts" in r.getMessage()]


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("bbpp", "'bbpp' is no MoleculeNet set (did you mean 'bbbp'?)"),
        ("mycls", "'mycls' is no MoleculeNet set: these are the defaults a table of your own"),
        ("esol", "'esol' has no Table 8 row: these are the defaults it starts from"),
        ("bbbp", None),
    ],
)
def test_settings_of_a_name_without_a_table_8_row_says_so(name, said):
    import subprocess

    from tests.conftest import smiexlm_command

    done = subprocess.run([smiexlm_command(), "settings", "finetune", name], capture_output=True,
                          text=True, check=True)  # fmt: skip
    assert "lr = " in done.stdout
    assert (said in done.stderr) if said else done.stderr == ""
