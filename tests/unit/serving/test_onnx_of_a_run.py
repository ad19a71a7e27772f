"""``smiexlm export RUN --onnx`` on a pretraining run: the exported encoder graph against
the torch fp32 path. Apart from the other ONNX tests because pretraining reads the precision
switch (tests/unit/conftest.py) and they do not."""

from __future__ import annotations

import numpy as np
import pytest

from smiexlm.embedding.featurizer import Featurizer
from tests.conftest import require_file
from tests.unit.serving.test_onnx import TOLERANCE
from tests.warm_cli import run_smiexlm

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.mark.data
@pytest.mark.slow
def test_cli_export_onnx_of_a_maelm_run(shared_data, tmp_path):
    """`smiexlm export RUN --out MODEL --onnx` on a micro MAE-LM run (the third layout)."""
    from smiexlm.pretraining.trainer import pretrain
    from tests.unit.pretraining.test_training import _config
    from tests.unit.pretraining.test_training_support import build_dataset

    source = require_file(shared_data, "pretrain/moses_test.smi.gz")
    dataset = build_dataset(source, tmp_path / "ds", n=300)
    pretrain(_config("model.objective=maelm"), dataset, tmp_path / "run", max_steps=2)
    model = tmp_path / "model"
    run = run_smiexlm("export", tmp_path / "run", "--out", model, "--onnx", timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("encoder.onnx")
    some = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(O)cc1", "CN1CCC(CC1)Oc1ccccc1"]
    expected = Featurizer.from_pretrained(model, device="cpu").featurize(some, pooling="cls")
    got = Featurizer.from_pretrained(model, backend="onnx").featurize(some, pooling="cls")
    assert np.abs(got - expected).max() <= TOLERANCE
