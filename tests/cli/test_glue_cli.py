"""``smiexlm glue RTE`` end to end: a random-init tiny text model, a few updates."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from smiexlm.cli.main import app


def make_tiny_text_model(folder):
    """A random-init one-block text ExLM with a 14-word vocabulary, saved in ``folder``."""
    from smiexlm import ExLMConfig, ExLMModel
    from smiexlm.tokenizer import TextTokenizer

    words = "the a fox dog man woman sleeps runs is not entailment cancer died widow"
    tok = TextTokenizer.build(
        [" ".join(words.split()[i:] + words.split()[:i]) for i in range(14)] * 5,
        vocab_size=200,
        min_freq=1,
    )
    config = ExLMConfig.tiny(
        vocab_size=tok.vocab_size, objective="exlm", k=2, n_layers=1, n_heads=2, d_model=32, d_ff=64
    )
    ExLMModel(config).save_pretrained(folder, tokenizer=tok)
    return folder


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    return make_tiny_text_model(tmp_path_factory.mktemp("tiny_text"))


def test_glue_rte_cli_runs_and_writes_a_result(shared_data, tiny_checkpoint, tmp_path):
    args = ["glue", "RTE", "--checkpoint", str(tiny_checkpoint), "--seeds", "1,2,3",
            "--epochs", "2", "--max-steps", "3", "--max-train-rows", "24", "--max-eval-rows", "20",
            "--max-length", "48", "--out", str(tmp_path), "--threads", "1"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "RTE: accuracy" in result.output and "majority" in result.output
    report = json.loads((tmp_path / "RTE.json").read_text())
    assert [r["seed"] for r in report["runs"]] == [1, 2, 3]
    assert all(r["steps"] == 3 for r in report["runs"])  # capped by --max-steps
    accs = sorted(r["metrics"]["accuracy"] for r in report["runs"])
    assert report["median"]["accuracy"] == accs[1]
    assert report["n_eval"] == 20 and report["extra"]["objective"] == "exlm"
    assert report["spread"]["accuracy"] == [accs[0], accs[2]]  # the range over seeds
    assert f"[{100 * accs[0]:.1f}, {100 * accs[2]:.1f}]" in result.output
    from smiexlm.paths import file_sha256

    rte = shared_data / "glue" / "RTE"
    assert report["extra"]["train_sha256"] == file_sha256(rte / "train.tsv")
    assert report["extra"]["eval_sha256"] == file_sha256(rte / "dev.tsv")


def test_glue_sts_b_regression(shared_data, tiny_checkpoint):
    from smiexlm.glue.finetune import GlueConfig, run_glue

    config = GlueConfig(
        "sts-b",
        seeds=(1,),
        epochs=1,
        max_steps=2,
        max_train_rows=16,
        max_eval_rows=16,
        max_length=48,
    )
    result = run_glue(tiny_checkpoint, config, progress=False)
    assert set(result.median) == {"spearman", "pearson"} and result.runs[0].steps == 1


def test_glue_bad_task_is_a_clear_error(tiny_checkpoint):
    result = CliRunner().invoke(app, ["glue", "SQuAD", "--checkpoint", str(tiny_checkpoint)])
    assert result.exit_code != 0
    assert "SQuAD" in str(result.exception) or "SQuAD" in result.output


def test_seeds_threads_a_smiles_model_and_a_file_as_out_are_refused_before_training(
    shared_data, tmp_path
):
    from smiexlm.errors import ConfigError, DataError
    from smiexlm.glue.finetune import GlueConfig, run_glue, run_tasks

    with pytest.raises(ConfigError, match="distinct seeds"):
        GlueConfig("rte", seeds=(1, 1))
    with pytest.raises(ConfigError, match="threads"):
        GlueConfig("rte", threads=0)
    with pytest.raises(ConfigError, match="a text model"):
        run_glue("exlm", GlueConfig("rte", seeds=(1,), max_steps=1, max_train_rows=8))
    (tmp_path / "out").write_text("")
    with pytest.raises(DataError, match="expected a folder"):
        next(run_tasks("rte", "exlm", {"seeds": (1,)}, out=tmp_path / "out"))


def test_table11_grid_ships_as_the_papers_config():
    from smiexlm.glue.finetune import CONFIG_PATH, GlueConfig, grid_points

    assert CONFIG_PATH.name == "glue.toml" and CONFIG_PATH.is_file()
    # Table 11 of the ExLM paper, read off the paper
    large = {"lr": {1e-5, 2e-5, 3e-5, 4e-5}, "batch_size": {32}, "epochs": {2, 3, 5},
             "warmup_ratio": {0.06}}  # fmt: skip
    small = {"lr": {2e-5, 3e-5, 4e-5, 5e-5}, "batch_size": {16, 32}, "epochs": {2, 3, 5, 10},
             "warmup_ratio": {0.06, 0.10}}  # fmt: skip
    for tasks, grid, n in ((("MNLI", "QNLI", "QQP", "SST-2"), large, 12),
                           (("RTE", "MRPC", "CoLA", "STS-B"), small, 64)):  # fmt: skip
        for task in tasks:
            points = grid_points(task)
            assert len(points) == n
            assert {k: {p[k] for p in points} for k in grid} == grid
    config = GlueConfig("rte")
    assert config.seeds == (1, 2, 3, 4, 5) and config.weight_decay == 0.1
    assert config.adam_betas == (0.9, 0.98) and config.adam_eps == 1e-6


def test_device_values_are_checked_early():
    import torch

    from smiexlm.device import resolve_device
    from smiexlm.errors import ConfigError
    from smiexlm.glue.finetune import GlueConfig

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="device"):
        resolve_device("tpu")
    with pytest.raises(ConfigError, match="device"):
        GlueConfig("rte", device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            GlueConfig("rte", device="cuda")


def test_a_text_model_is_refused_where_smiles_are_read(tiny_checkpoint):
    """Its vocabulary would cut SMILES into word pieces it never learned: fine-tuning,
    embedding and the analyses refuse it, naming the folder, before any work."""
    from smiexlm import Featurizer
    from smiexlm.analysis.inputs import check_models
    from smiexlm.errors import ConfigError
    from smiexlm.finetuning.backbone import Backbone

    for load in (Backbone, Featurizer.from_pretrained, lambda path: check_models([path])):
        with pytest.raises(ConfigError, match="expected a SMILES model; this one reads text"):
            load(tiny_checkpoint)
    Backbone()  # the shipped default reads SMILES
