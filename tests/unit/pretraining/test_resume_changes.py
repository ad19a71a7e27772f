"""Settings a ``--resume`` changes: recorded when the run reads them afresh, refused otherwise;
the batch is compared as ``update_freq × processes``, so a resume on another number of CPU
processes (each with its share of the micro-batches) changes nothing."""

from __future__ import annotations

import json

import pytest

from smiexlm.pretraining.config import load_config
from smiexlm.pretraining.resume import CHANGES_FILE, config_changes, record_config_changes
from smiexlm.training.run_state import CONFIG_FILE, ResumeMismatchError, TrainerState


def _checkpoint(tmp_path, world_size, *overrides):
    folder = tmp_path / "checkpoints" / "step_000004"
    folder.mkdir(parents=True)
    config = load_config("mol_tiny_exlm", list(overrides))
    (folder / CONFIG_FILE).write_text(json.dumps(config.to_dict()))
    return folder, TrainerState(step=4, world_size=world_size)


def test_the_global_batch_is_what_must_stay(tmp_path):
    folder, state = _checkpoint(tmp_path, 2, "update_freq=1")  # 2 processes of 1 micro-batch
    assert config_changes(folder, state, load_config("mol_tiny_exlm", []), 1) == {}
    assert state.world_size == 1  # what the next checkpoint records
    with pytest.raises(ResumeMismatchError, match="update_freq x processes = 2 .* = 4"):
        config_changes(folder, TrainerState(world_size=2), load_config("mol_tiny_exlm", []), 2)


def test_unset_total_steps_is_compared_as_the_decay_horizon(tmp_path):
    # a floor under the rate: updates past the horizon still learn (at end_lr)
    folder, state = _checkpoint(tmp_path, 1, "max_steps=100", "end_lr=1e-5")
    config = load_config("mol_tiny_exlm", ["max_steps=200", "total_steps=100", "end_lr=1e-5"])
    assert config_changes(folder, state, config, 1) == {"max_steps": (100, 200)}


def test_max_steps_past_a_horizon_where_the_rate_is_zero_is_refused():
    """Updates past the schedule's horizon at end_lr = 0 change nothing: --max-steps there
    (a run raised past its config's max_steps) is refused, naming total_steps."""
    from smiexlm.errors import ConfigError

    config = load_config("mol_tiny_exlm", ["max_steps=6"])  # its horizon: 6
    with pytest.raises(ConfigError, match="'max_steps' = 9: .*set total_steps=9 too"):
        config.check_horizon(9)
    config.check_horizon(6)
    load_config("mol_tiny_exlm", ["total_steps=9"]).check_horizon(9)
    load_config("mol_tiny_exlm", ["max_steps=6", "end_lr=1e-5"]).check_horizon(9)  # a floor


def test_changes_are_appended_to_the_history(tmp_path):
    folder, _ = _checkpoint(tmp_path, 1)
    record_config_changes(tmp_path, folder, 4, {"lr": (0.001, 0.002)})
    record_config_changes(tmp_path, folder, 4, {})
    record_config_changes(tmp_path, folder, 8, {"log_every": (20, 5)})
    doc = json.loads((tmp_path / CHANGES_FILE).read_text())
    assert [(e["from_step"], e["settings"]) for e in doc["changes"]] == [
        (4, {"lr": {"old": 0.001, "new": 0.002}}),
        (8, {"log_every": {"old": 20, "new": 5}}),
    ]


def test_checkpoints_past_a_million_updates_are_ordered_by_their_step(tmp_path):
    """As text, step_1000000 sorts before step_999999: the newest would be pruned at once and
    a resume would go back. By the number, it is the newest kept and found."""
    from smiexlm.training.run_state import STATE_FILE, latest_checkpoint, prune_checkpoints

    for step in (999_998, 999_999, 1_000_000):
        folder = tmp_path / "checkpoints" / f"step_{step}"
        folder.mkdir(parents=True)
        (folder / STATE_FILE).write_text("{}")
    assert latest_checkpoint(tmp_path).name == "step_1000000"
    doomed = prune_checkpoints(tmp_path, keep_last=2)
    assert [p.name for p in doomed] == ["step_999998"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_1000000", "step_999999"]  # fmt: skip
