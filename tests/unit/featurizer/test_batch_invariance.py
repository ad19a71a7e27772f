"""A molecule's prediction and embedding do not depend on what else is in the file.

Served inference runs in fp32 on every CPU (bf16 autocast is for training only), so the
padding that a batch's longest neighbour brings, the batch size and the row order move an
output by float rounding only: these tests hold it to 1e-6 on 1,000 MoleculeNet molecules.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from smiexlm.featurizer import DEFAULT_MODEL_DIR

N_ROWS = 1000
ATOL = 1e-6


@pytest.fixture(scope="module")
def molecules(shared_data) -> list[str]:
    from tests.conftest import require_file

    esol = pd.read_csv(require_file(shared_data, "moleculenet/esol.csv"))["smiles"].str.strip()
    bbbp = pd.read_csv(require_file(shared_data, "moleculenet/bbbp.csv"))["smiles"]
    pool = pd.concat([esol, bbbp]).drop_duplicates().tolist()
    rng = np.random.default_rng(0)
    return [pool[i] for i in rng.choice(len(pool), N_ROWS, replace=False)]


@pytest.fixture(scope="module")
def finetuned_folder(tmp_path_factory):
    """A regression head (seeded, untrained) on the shipped default model, saved the way
    ``smiexlm finetune --save-dir`` saves one."""
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel
    from smiexlm.moleculenet.finetune import save_finetuned
    from smiexlm.tokenizer import SmilesTokenizer

    torch.manual_seed(0)
    model = ExLMForSequencePrediction(
        ExLMModel.from_pretrained(DEFAULT_MODEL_DIR), 1, "regression", 0.0, "cls"
    )
    meta = {
        "task_type": "regression", "n_outputs": 1, "pooling": "cls", "label_cols": ["logS"],
        "target_mean": [-3.0], "target_std": [2.0],
        "config": {"canonicalize": True, "max_length": 256},
    }  # fmt: skip
    folder = tmp_path_factory.mktemp("finetuned") / "seed0"
    save_finetuned(model, SmilesTokenizer.load(DEFAULT_MODEL_DIR / "vocab.json"), folder, meta)
    return folder


def test_predict_gives_each_molecule_its_value_whatever_the_file(molecules, finetuned_folder):
    from smiexlm.finetuning import Examples
    from smiexlm.finetuning import predict as engine_predict
    from smiexlm.moleculenet.finetune import load_finetuned, predict

    whole = predict(finetuned_folder, molecules)["logS"].to_numpy()
    assert np.isfinite(whole).all()
    order = np.random.default_rng(1).permutation(N_ROWS)
    shuffled = predict(finetuned_folder, [molecules[i] for i in order], batch_size=7)
    np.testing.assert_allclose(shuffled["logS"].to_numpy(), whole[order], atol=ATOL, rtol=0)
    # a few molecules alone in their file, through the whole command path
    for i in range(0, N_ROWS, 100):
        alone = predict(finetuned_folder, [molecules[i]])["logS"].to_numpy()
        np.testing.assert_allclose(alone, whole[i : i + 1], atol=ATOL, rtol=0)
    # every molecule alone in its batch, on the loaded model
    model, inputs, _ = load_finetuned(finetuned_folder, device="cpu")
    rows, _ = inputs.rows(inputs.texts(molecules), 256)
    one_by_one = np.concatenate([engine_predict(model, Examples([r]), 1) for r in rows])
    together = engine_predict(model, Examples(rows), 256)
    np.testing.assert_allclose(one_by_one, together, atol=ATOL, rtol=0)


def test_featurizer_gives_each_molecule_its_embedding_whatever_the_batch(molecules):
    from smiexlm import Featurizer

    feat = Featurizer.from_pretrained(device="cpu")
    whole = feat.featurize(molecules, pooling="cls")
    small_batches = feat.featurize(molecules, pooling="cls", batch_size=3, batch_tokens=64)
    np.testing.assert_allclose(small_batches, whole, atol=ATOL, rtol=0)
    for i in range(0, N_ROWS, 50):
        alone = feat.featurize([molecules[i]], pooling="cls")
        np.testing.assert_allclose(alone, whole[i : i + 1], atol=ATOL, rtol=0)
