"""Each setting is declared once, on its config dataclass: the command line, the TOML readers
and every identity take a new one with no other edit, and ``--help`` stays short."""

from __future__ import annotations

import dataclasses
import re

import pytest
import typer
from typer.testing import CliRunner

from smiexlm.cli.main import app
from smiexlm.finetuning import config as configs
from smiexlm.finetuning.config import FinetuneConfig, finetune_config
from smiexlm.moleculenet import runs
from smiexlm.settings import setting, settings_of


def _options(command: str) -> list[str]:
    result = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return re.findall(r"^│ (--[a-z-]+) ", result.output, flags=re.M)


@pytest.mark.parametrize("command", ["finetune", "benchmark", "hpopt", "pretrain"])
def test_help_lists_at_most_twenty_options(command):
    options = _options(command)
    assert 5 <= len(options) <= 20, options


def test_every_fine_tuning_setting_has_a_help_and_a_way_in():
    specs = FinetuneConfig.settings()
    assert [s.key for s in specs] == list(FinetuneConfig().to_dict())
    assert all(len(s.help) > 10 for s in specs)


class _Stop(Exception):
    pass


@pytest.fixture()
def captured(monkeypatch):
    """Run ``finetune`` up to the fine-tuning and keep the config it would run with."""
    seen = {}

    def run_finetune(task, cfg, *args, **kwargs):
        seen["cfg"] = cfg
        raise _Stop

    monkeypatch.setattr("smiexlm.finetuning.adapter.run_finetune", run_finetune)
    return seen


def _finetune(command_app, tmp_path, *args: str):
    return CliRunner().invoke(command_app, ["finetune", "bbbp", "--out", str(tmp_path / "o"),
                                            *args])  # fmt: skip


def test_set_and_the_flags_reach_the_config(captured, tmp_path):
    result = _finetune(app, tmp_path, "--set", "lr=3e-5", "--set", "forest=none", "--epochs",
                       "2", "--ema-half-life", "1.5", "--no-canonicalize")  # fmt: skip
    assert isinstance(result.exception, _Stop), result.output
    cfg = captured["cfg"]
    assert (cfg.loop.lr, cfg.forest, cfg.loop.epochs, cfg.loop.ema_half_life) == (
        3e-5,
        None,
        2,
        1.5,
    )
    assert cfg.canonicalize is False
    assert cfg.pooling == finetune_config("bbbp").pooling  # the rest: the Table 8 row


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--set", "lrr=1"], "'lrr=1': expected a known setting"),
        (["--set", "lr"], "KEY=VALUE"),
        (["--set", "lr=1e-4", "--lr", "1e-4"], "given twice"),
        (["--set", "layers=zero"], "layers"),
    ],
)
def test_a_bad_setting_is_one_clear_line(captured, tmp_path, monkeypatch, capsys, args, words):
    from smiexlm.cli.main import main

    monkeypatch.setattr("sys.argv", ["smiexlm", "finetune", "bbbp", "--out", str(tmp_path), *args])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 2
    said = capsys.readouterr().err
    assert words in said, said
    assert "cfg" not in captured


def test_the_settings_command_prints_a_config_that_reads_back(tmp_path):
    result = CliRunner().invoke(app, ["settings", "finetune", "muv"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "muv.toml"
    path.write_text(result.output)
    assert finetune_config("muv", config_file=path) == finetune_config("muv")
    assert "# Peak learning rate" in result.output and 'class_weight = "balanced"' in result.output
    hpopt = CliRunner().invoke(app, ["settings", "hpopt"])
    assert hpopt.exit_code == 0 and "startup_trials = 8" in hpopt.output


@dataclasses.dataclass
class _WithKnob(FinetuneConfig):
    knob: int = setting(0, "A setting added after runs were recorded.", since=0)


def test_a_new_field_is_taken_by_the_cli_the_toml_reader_and_identities(
    monkeypatch, captured, tmp_path
):
    monkeypatch.setattr(configs, "FinetuneConfig", _WithKnob)
    fresh = typer.Typer()
    import smiexlm.cli.moleculenet as commands

    commands.register(fresh)
    for args in (["--set", "knob=3"], ["--knob", "3"]):
        result = _finetune(fresh, tmp_path, *args)
        assert isinstance(result.exception, _Stop), result.output
        assert captured["cfg"].knob == 3
    toml = tmp_path / "knob.toml"
    toml.write_text("knob = 4\n")
    assert finetune_config("bbbp", config_file=toml).knob == 4
    # a state or result saved before the field existed is the same run as one at its ``since``
    before = runs.settings(FinetuneConfig())
    assert runs.settings(_WithKnob()) == before
    assert runs.settings(_WithKnob(knob=3)) == before | {"knob": 3}


def test_a_new_field_of_a_pretraining_config_needs_no_other_edit(monkeypatch, tmp_path):
    from smiexlm.pretraining import config as pretraining

    @dataclasses.dataclass
    class WithKnob(pretraining.TrainConfig):
        knob: int = 0

    monkeypatch.setattr(pretraining, "TrainConfig", WithKnob)
    path = tmp_path / "run.toml"
    path.write_text('max_steps = 5\nknob = 2\n[model]\npreset = "tiny"\n')
    cfg = pretraining.load_config(path, ["knob=7"])
    assert (cfg.knob, cfg.max_steps) == (7, 5)
    assert "knob" in pretraining.valid_keys()


def test_a_new_field_of_the_search_config_keeps_old_studies(monkeypatch):
    from smiexlm.hpopt.config import HpoptConfig

    @dataclasses.dataclass
    class WithKnob(HpoptConfig):
        knob: int = setting(0, "A sampler setting added later.", since=0)

    assert "knob" in {s.key for s in settings_of(WithKnob)}
    assert WithKnob(trials=2).identity() == HpoptConfig(trials=2).identity()
    assert WithKnob(trials=2, knob=1).identity()["knob"] == 1
    assert WithKnob(trials=9).identity() == HpoptConfig(trials=2).identity()  # a bigger budget


def test_the_settings_of_a_pretraining_config_read_back(tmp_path):
    from smiexlm.pretraining.config import load_config

    result = CliRunner().invoke(app, ["settings", "pretrain", "mol_small_mlm"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "run.toml"
    path.write_text(result.output)
    assert load_config(path).to_dict() == load_config("mol_small_mlm").to_dict()
    assert "# Peak learning rate." in result.output and "[model]" in result.output
