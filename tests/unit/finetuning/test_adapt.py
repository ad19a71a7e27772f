"""Task-adaptive descriptor regression before fine-tuning (``--adapt-steps``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smiexlm.errors import ConfigError


def _encoder():
    from smiexlm.modelio.layout import DEFAULT_MODEL_DIR
    from smiexlm.modelio.pretrained import load_pretrained

    return load_pretrained(DEFAULT_MODEL_DIR)


def test_adaptation_lowers_the_descriptor_loss_of_the_training_molecules():
    from smiexlm.finetuning.adapt import adapt_descriptors

    pre = _encoder()
    smiles = [f"c1ccc(cc1){'C' * n}N" for n in range(1, 9)] + [
        f"O=C(O){'C' * n}Cl" for n in range(1, 9)
    ]
    inputs = pre.inputs()
    rows, _ = inputs.rows(inputs.texts(smiles, True), 256)
    before = {k: v.clone() for k, v in pre.model.state_dict().items()}
    got = adapt_descriptors(pre.model, rows, inputs.texts(smiles, True), 40, 1e-3, 8, seed=0)
    assert got["adapt_loss_last"] < 0.7 * got["adapt_loss_first"]
    changed = [k for k, v in pre.model.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith("descriptor_head") for k in changed) and len(changed) > 10
    again = _encoder()  # the same seed gives the same weights
    adapt_descriptors(again.model, rows, inputs.texts(smiles, True), 40, 1e-3, 8, seed=0)
    for k, v in again.model.state_dict().items():
        torch.testing.assert_close(v, pre.model.state_dict()[k], rtol=0, atol=0)


def test_a_backbone_without_a_descriptor_head_is_refused():
    from smiexlm.finetuning.adapt import adapt_descriptors
    from smiexlm.model.model import ExLMModel

    pre = _encoder()
    config = pre.model.config
    plain = ExLMModel(type(config)(**{**config.to_dict(), "objective": "mlm"}))
    with pytest.raises(ConfigError, match="adapt_steps"):
        adapt_descriptors(plain, [[1, 2]], ["C"], 2, 1e-4, 2, 0)


@pytest.mark.parametrize("values", [{"adapt_steps": -1}, {"adapt_lr": 0.0}, {"adapt_steps": 1.5}])
def test_bad_adapt_settings_name_the_field(values):
    from smiexlm.finetuning.config import finetune_config

    with pytest.raises(ConfigError, match=next(iter(values))):
        finetune_config("bace", **values)


def test_cli_finetune_with_adaptation_records_it(tmp_path):
    from tests.unit.finetuning.test_moleculenet_finetune import _finetune

    rows = _finetune(tmp_path, "--adapt-steps", "5", "--adapt-lr", "3e-4")
    assert rows["model"][0].endswith("+ adapt 5")
    import json

    config = json.loads(rows["config"][0])
    assert config["adapt_steps"] == 5 and config["adapt_lr"] == 3e-4
    assert np.isfinite(config["adapt_loss_first"]) and config["adapt_cpu_s"] > 0
