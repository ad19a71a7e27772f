"""Hyper-parameter search: the space, pruning, resuming, the budget, and the test split that
the search never reads (poisoned test rows leave every trial as it was)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from smiexlm.errors import ConfigError, DataError

HEADS = ("C", "c1ccccc1", "CC(C)", "c1ccncc1", "C1CC1", "c1ccoc1", "OCC", "NC(=O)")
TAILS = ("", "O", "N", "Cl", "C(=O)O", "F")


def toy_frame() -> pd.DataFrame:
    """About 140 distinct small molecules; the label (a parity of the canonical SMILES) is
    learnable only in part, so trials score differently."""
    from rdkit import Chem

    seen, rows = set(), []
    for n in range(1, 4):
        for head in HEADS:
            for tail in TAILS:
                canonical = Chem.CanonSmiles(f"{head}{'C' * n}{tail}")
                if canonical not in seen:
                    seen.add(canonical)
                    rows.append((canonical, (len(canonical) + canonical.count("O")) % 2))
    return pd.DataFrame(rows, columns=["smi", "y"])


def toy_task(frame: pd.DataFrame | None = None):
    from smiexlm.moleculenet.task import MoleculeTask

    frame = toy_frame() if frame is None else frame
    return MoleculeTask("toy", frame["smi"].tolist(), frame[["y"]].to_numpy(float), ["y"])


def toy_base(**overrides):
    from smiexlm.finetuning.config import finetune_config

    values = dict(split="random", epochs=3, batch_size=32, device="cpu", precision="fp32",
                  layers=1, forest="none")  # the last block alone, the head these toy searches were written for; the network alone, as trials score it  # fmt: skip
    return finetune_config(None, **values | overrides)


def search(out, trials: int, task=None, base=None, **hp):
    from smiexlm.hpopt.config import HpoptConfig
    from smiexlm.hpopt.run import run_hpopt

    torch.set_num_threads(1)
    settings = dict(trials=trials, startup_trials=2, prune_after=2, warmup_epochs=1) | hp
    return run_hpopt(task or toy_task(), base or toy_base(), out, HpoptConfig(**settings))


def trials_of(out):
    import optuna

    return optuna.load_study(study_name="hpopt", storage=f"sqlite:///{out / 'study.sqlite'}").trials


def test_space_is_around_the_table_8_row_and_holds_it():
    from smiexlm.finetuning.config import finetune_config
    from smiexlm.hpopt.search import SearchSpace

    base = finetune_config("clintox", layers=3)  # lr 5e-5, 100 epochs, pooler dropout 0.5
    space = SearchSpace.around(base, n_layers=4)
    assert space.lr == pytest.approx((5e-6, 5e-4)) and space.epochs == (25, 100)
    assert space.pooler_dropout == (0.0, 0.5) and space.freeze_layers == (0, 4)
    assert space.layers == (1, 4)
    assert space.pooling == ("cls", "mean", "max")
    assert space.features == ("none", "ecfp4", "rdkit2d", "both")
    zero = space.params_of(base)
    assert zero == {"lr": 5e-5, "epochs": 100, "dropout": 0.1, "pooler_dropout": 0.5,
                    "pooling": "cls", "features": "none", "freeze_layers": 0, "layers": 3}  # fmt: skip
    frozen = SearchSpace.around(finetune_config("bbbp", freeze=True), n_layers=4)
    assert frozen.freeze_layers == (0, 0)  # head only: every block is frozen already


def test_the_search_never_reads_the_test_rows(tmp_path):
    """Test labels flipped and test SMILES replaced by other molecules: every trial's params
    and value are the same. A poisoned validation label (the control) changes them."""
    from smiexlm.hpopt.search import Search
    from smiexlm.moleculenet.splits import make_split

    frame = toy_frame()
    split = make_split(frame["smi"].tolist(), "random", 0)  # depends on the row count only
    poisoned = frame.copy()
    poisoned.loc[split.test, "y"] = 1 - poisoned.loc[split.test, "y"]
    poisoned.loc[split.test, "smi"] = [f"CCCCCC{'C' * k}S" for k in range(len(split.test))]
    built = Search.build(toy_task(poisoned), toy_base(layers=None), _backbone(), 0)
    assert built.base.layers == _backbone().layers == 3  # trial 0: the backbone's own blocks
    assert len(built.task) == len(split.train) + len(split.valid) and built.split.test == []
    assert not set(built.task.smiles) & set(poisoned.loc[split.test, "smi"])

    search(tmp_path / "clean", 2, toy_task(frame))
    search(tmp_path / "dirty", 2, toy_task(poisoned))
    a, b = trials_of(tmp_path / "clean"), trials_of(tmp_path / "dirty")
    assert [(t.params, t.value, t.state) for t in a] == [(t.params, t.value, t.state) for t in b]
    assert len({t.value for t in a}) > 1  # the trials differ: the comparison means something

    control = frame.copy()
    control.loc[split.valid[:3], "y"] = 1 - control.loc[split.valid[:3], "y"]
    search(tmp_path / "control", 1, toy_task(control))
    assert trials_of(tmp_path / "control")[0].value != a[0].value


def test_a_trial_is_the_run_finetune_makes_on_the_same_split_and_seed(tmp_path):
    """Trial 0 (the base config) on the train and validation rows alone scores on validation
    exactly what ``finetune`` scores with the whole table: the test rows change nothing."""
    from smiexlm.finetuning.adapter import run_finetune

    search(tmp_path, 1)
    (whole,) = run_finetune(toy_task(), toy_base(), _backbone(), seeds=[0], progress=False)
    assert trials_of(tmp_path)[0].value == whole.valid


def _backbone():
    from smiexlm.finetuning.backbone import Backbone

    return Backbone()


def test_a_pruning_hook_ends_a_trial_after_the_epoch_it_prunes(tmp_path):
    import optuna

    calls = []

    class PruneFromTrialOne(optuna.pruners.BasePruner):
        def prune(self, study, trial) -> bool:
            calls.append((trial.number, trial.last_step))
            return trial.number >= 1

    from smiexlm.hpopt.config import HpoptConfig
    from smiexlm.hpopt.run import run_hpopt

    torch.set_num_threads(1)
    hp = HpoptConfig(trials=3, startup_trials=2)
    result = run_hpopt(toy_task(), toy_base(epochs=8), tmp_path, hp, pruner=PruneFromTrialOne())
    trials = trials_of(tmp_path)
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "PRUNED"]
    assert calls[:4] == [(0, 1), (0, 2), (0, 3), (0, 4)] and calls[-2:] == [(1, 1), (2, 1)]
    for trial in trials[1:]:  # cut after epoch 1 of at least 2, valued at its one epoch
        assert list(trial.intermediate_values) == [1] and trial.params["epochs"] >= 2
        assert trial.value == trial.intermediate_values[1]
    assert result.counted == 3 and result.best_number == 0  # pruned trials count, never best
    rows = pd.read_csv(tmp_path / "trials.csv")
    assert rows["state"].tolist() == ["complete", "pruned", "pruned"]
    assert rows["note"].tolist()[1:] == ["pruned after epoch 1"] * 2


def test_the_default_pruner_is_the_median_one_after_warm_up(tmp_path):
    import optuna

    from smiexlm.hpopt.config import HpoptConfig
    from smiexlm.hpopt.search import Search
    from smiexlm.hpopt.study import open_study

    hp = HpoptConfig(trials=1, prune_after=5, warmup_epochs=2)
    study = open_study(tmp_path, Search.build(toy_task(), toy_base(), _backbone(), 0), hp)
    assert isinstance(study.pruner, optuna.pruners.MedianPruner)
    assert (study.pruner._n_startup_trials, study.pruner._n_warmup_steps) == (5, 2)


def test_resumed_in_steps_the_study_ends_as_a_straight_one(tmp_path):
    """2 trials, then the same search to 4: the numbers go on and the trials (params and
    values) are those of one run of 4; the outputs are there and best.toml is the best."""
    import tomllib

    straight = search(tmp_path / "straight", 4)
    first = search(tmp_path / "steps", 2)
    assert first.counted == 2 and first.stopped_by == "trials"
    again = search(tmp_path / "steps", 4)
    a, b = trials_of(tmp_path / "straight"), trials_of(tmp_path / "steps")
    assert [t.number for t in b] == [0, 1, 2, 3]
    assert [(t.params, t.value) for t in a] == [(t.params, t.value) for t in b]
    assert again.best_number == straight.best_number and again.counted == 4
    best = tomllib.loads((tmp_path / "steps" / "best.toml").read_text())
    chosen = b[again.best_number].params
    assert best["lr"] == chosen["lr"] and best["pooling"] == chosen["pooling"]
    assert best.get("features") == (None if chosen["features"] == "none" else chosen["features"])
    for name in ("trials.csv", "history.png", "report.md"):
        assert (tmp_path / "steps" / name).is_file()
    assert "never read" in (tmp_path / "steps" / "report.md").read_text()


def test_a_regression_search_runs_blind_to_its_empty_test_part(tmp_path):
    """A regression table with the served default's forest and kernel members: the trials fit
    the network alone (the search's test part is empty), and best.toml keeps both members for
    the final fit; with neither, the search runs too."""
    import tomllib

    from smiexlm.moleculenet.task import MoleculeTask

    frame = toy_frame()
    task = MoleculeTask("toy", frame["smi"].tolist(), frame[["smi"]].map(len).to_numpy(float) / 4,
                        ["y"], "regression")  # fmt: skip
    result = search(tmp_path / "served", 1, task, toy_base(forest="auto", kernels="auto"))
    assert result.counted == 1 and result.best_value is not None
    best = tomllib.loads((tmp_path / "served" / "best.toml").read_text())
    assert (best["forest"], best["kernels"]) == ("auto", "auto")
    assert search(tmp_path / "alone", 1, task, toy_base(kernels="none")).counted == 1


def test_a_trial_left_running_is_marked_failed_and_not_counted(tmp_path):
    """A study whose last trial was left RUNNING (its process killed) is resumed: that trial
    fails, the next one draws the same point, and the budget counts the others only."""
    import optuna

    from smiexlm.hpopt.config import HpoptConfig
    from smiexlm.hpopt.search import Search
    from smiexlm.hpopt.study import open_study, sampler_for

    search(tmp_path, 1)
    hp = HpoptConfig(trials=2, startup_trials=2, prune_after=2, warmup_epochs=1)
    built = Search.build(toy_task(), toy_base(), _backbone(), 0)
    study = open_study(tmp_path, built, hp)
    study.sampler = sampler_for(0, 1, 2)
    cut = study.ask()
    built.space.suggest(cut)  # its point drawn, then the process "dies"
    del study
    result = search(tmp_path, 2)
    trials = trials_of(tmp_path)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE,
                                         optuna.trial.TrialState.FAIL,
                                         optuna.trial.TrialState.COMPLETE]  # fmt: skip
    assert trials[2].params == trials[1].params and result.counted == 2 and result.failed == 1
    note = pd.read_csv(tmp_path / "trials.csv")["note"][1]
    assert "stopped mid-trial" in note


def test_cpu_budget_counts_finished_trials_across_resumes(tmp_path):
    result = search(tmp_path, None, cpu_minutes=0.001)  # 0.06 s: spent by the first trial
    assert result.counted == 1 and result.stopped_by == "cpu-minutes"
    cpu = trials_of(tmp_path)[0].user_attrs["cpu_seconds"]
    assert cpu > 0.06 and result.cpu_seconds == pytest.approx(cpu)
    assert search(tmp_path, None, cpu_minutes=0.001).counted == 1  # spent: no new trial
    assert search(tmp_path, 2, cpu_minutes=10).counted == 2


def test_bad_budgets_and_another_search_in_the_folder_are_refused(tmp_path):
    from smiexlm.hpopt.config import HpoptConfig

    for bad, field in (({}, "--trials"), ({"trials": 0}, "--trials"),
                       ({"trials": 2.5}, "--trials"), ({"cpu_minutes": 0}, "--cpu-minutes"),
                       ({"cpu_minutes": float("nan")}, "--cpu-minutes"),
                       ({"trials": 1, "seed": -1}, "--seed")):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            HpoptConfig(**bad)
        assert err.value.field == field
    search(tmp_path, 1)
    with pytest.raises(
        DataError, match=r"search with split = 'random\(seed=0\)', not 'random\(seed=1\)'"
    ):
        search(tmp_path, 2, seed=1)
    with pytest.raises(DataError, match=r"base\.batch_size = 32, not 16"):
        search(tmp_path, 2, base=toy_base(batch_size=16))


def test_a_validation_part_of_one_class_is_refused_before_any_trial(tmp_path):
    from smiexlm.moleculenet.splits import make_split

    frame = toy_frame()
    split = make_split(frame["smi"].tolist(), "random", 0)
    frame.loc[split.valid, "y"] = 0
    with pytest.raises(DataError, match="validation part holds a single class"):
        search(tmp_path, 1, toy_task(frame))
    assert not (tmp_path / "study.sqlite").exists()


def test_a_study_knows_its_backbone_by_its_weights_and_older_studies_still_resume(tmp_path):
    import optuna

    def set_saved(change):
        study = optuna.load_study(study_name="hpopt", storage=f"sqlite:///{tmp_path / 'study.sqlite'}")  # fmt: skip
        identity = study.user_attrs["identity"]
        change(identity)
        study.set_user_attr("identity", identity)

    search(tmp_path, 1)
    set_saved(lambda identity: identity.update(backbone_sha256="0" * 64))  # re-exported weights
    with pytest.raises(DataError, match=r"backbone_sha256 = '0{64}', not '[0-9a-f]{64}'"):
        search(tmp_path, 2)
    set_saved(lambda identity: identity.pop("backbone_sha256"))  # kept before the key existed
    assert search(tmp_path, 2).counted == 2


def test_storage_none_is_the_embedded_study_and_a_url_is_shown_without_its_secrets():
    from smiexlm.hpopt.config import HpoptConfig
    from smiexlm.hpopt.storage import shown

    assert HpoptConfig(trials=1, storage="none").storage is None  # as the help spells it
    assert (
        shown("postgresql://al:S3c@ret@db.lan:5999/study?sslmode=x")
        == "postgresql://db.lan:5999/study"
    )
    assert shown("journal:/runs/j.log") == "journal:/runs/j.log"
    assert (shown("me:secret"), shown("plain")) == ("me:...", "plain")


def test_a_journal_path_holding_another_file_is_refused_and_left_as_it_was(tmp_path):
    from smiexlm.errors import DataError
    from smiexlm.hpopt.storage import open_storage

    table = tmp_path / "data.csv"
    table.write_text("smiles,y\nCCO,1\n")
    for path, words in ((table, "is not an Optuna journal"), (tmp_path, "is a folder")):
        with pytest.raises(DataError, match=words):
            open_storage(f"journal:{path}", tmp_path)
    assert table.read_text() == "smiles,y\nCCO,1\n"
    journal = tmp_path / "study.journal"
    open_storage(f"journal:{journal}", tmp_path)  # a new file, then an empty one
    journal.touch()
    open_storage(f"journal:{journal}", tmp_path)


def _memory_study():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(study_name="hpopt", storage=optuna.storages.InMemoryStorage())


def test_a_silent_trial_is_judged_from_its_start_and_by_its_own_heartbeat(monkeypatch):
    """A worker that died between drawing its trial and its first beat leaves a trial with
    no heartbeat: judged from its start. A worker beating every 60 s is not taken for dead by
    one that beats every second."""
    import time

    from smiexlm.hpopt import storage

    study = _memory_study()
    silent, slow = study.ask(), study.ask()
    slow.set_user_attr(storage.INTERVAL_KEY, 60.0)
    slow.set_user_attr(storage.HEARTBEAT_KEY, time.time())
    assert storage.fail_stale_trials(study, 1.0) == []  # both are fresh
    later = time.time() + 100
    monkeypatch.setattr(storage.time, "time", lambda: later)
    assert storage.fail_stale_trials(study, 1.0) == [silent.number]
    states = {t.number: t.state.name for t in study.trials}
    assert states[silent.number] == "FAIL" and states[slow.number] == "RUNNING"
    assert study.trials[-1].state.name == "WAITING"  # the silent trial's point, queued again


def test_the_base_point_queued_by_two_workers_at_once_runs_once():
    from smiexlm.hpopt.storage import BASE_KEY, surplus

    study = _memory_study()
    for _ in range(2):  # two workers saw an empty study in the same instant
        study.enqueue_trial({"lr": 1e-4}, user_attrs={BASE_KEY: True})
    first, second = study.ask(), study.ask()
    assert surplus(study, first, 4) is None
    assert surplus(study, second, 4) == f"surplus: trial {first.number} runs the same base point"


def test_the_recorded_command_holds_no_credentials():
    from smiexlm.cli.hpopt import _recorded_command

    for argv in (["bace", "--storage", "postgresql://me:pw@db:5432/hp", "--trials", "4"],
                 ["bace", "--storage=postgresql://me:p@w@db:5432/hp?sslmode=pw"]):  # fmt: skip
        recorded = _recorded_command(argv)
        assert "pw" not in recorded and "postgresql://db:5432/hp" in recorded, recorded
    assert _recorded_command(["bace", "--storage", "journal:/j"]).endswith("journal:/j")


def test_a_shared_study_already_over_writes_its_best_toml_where_it_is_missing(tmp_path):
    """The finisher may stop before writing best.toml (a time limit): the same command once
    the study is over runs no trial and writes it into its own folder."""
    journal = f"journal:{tmp_path / 'study.journal'}"
    first = search(tmp_path / "a", 2, storage=journal)
    assert (tmp_path / "a" / "best.toml").is_file()
    again = search(tmp_path / "b", 2, storage=journal)
    assert again.counted == 2 and again.best_number == first.best_number
    assert (tmp_path / "b" / "best.toml").read_text() == (
        (tmp_path / "a" / "best.toml").read_text().replace(str(tmp_path / "a"), str(tmp_path / "b"))
    )
