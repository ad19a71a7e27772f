"""A molecule's prediction and embedding do not depend on what else is in the file.

Served inference runs in fp32 on every CPU (bf16 autocast is for training only) under
``batch_invariant``: a prediction (1,000 MoleculeNet molecules) and an embedding, raw or
whitened (300 of them and the cases that once broke it), are bitwise the same alone or in any
batch, as the README says.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from smiexlm.modelio.layout import DEFAULT_MODEL_DIR

N_ROWS = 1000
# Molecules that once came out differently alone: three tokens (BOS, atom, EOS), whose
# matrix products of 3 rows took another kernel than a batch's, and a MOSES molecule whose
# whitened row, computed in one (n, d) product with others, sat on the edge of a float32
# rounding step.
EDGE_CASES = ["C", "O", "N", "CCl", "CC(=O)Nc1ccc(NC(=O)c2ccc(Br)cc2)cc1"]


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
    from smiexlm.finetuning.folder import save_finetuned
    from smiexlm.model.heads import ExLMForSequencePrediction
    from smiexlm.model.model import ExLMModel
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
    from smiexlm.modelio.pretrained import load_finetuned
    from smiexlm.serving.prediction import predict

    whole = predict(finetuned_folder, molecules)["logS"].to_numpy()
    assert np.isfinite(whole).all()
    order = np.random.default_rng(1).permutation(N_ROWS)
    shuffled = predict(finetuned_folder, [molecules[i] for i in order], batch_size=7)
    np.testing.assert_array_equal(shuffled["logS"].to_numpy(), whole[order])
    # a few molecules alone in their file, through the whole command path
    for i in range(0, N_ROWS, 100):
        alone = predict(finetuned_folder, [molecules[i]])["logS"].to_numpy()
        np.testing.assert_array_equal(alone, whole[i : i + 1])
    # every molecule alone in its batch, on the loaded model
    model, inputs, _ = load_finetuned(finetuned_folder, device="cpu")
    rows, _ = inputs.rows(inputs.texts(molecules), 256)
    one_by_one = np.concatenate([engine_predict(model, Examples([r]), 1) for r in rows])
    together = engine_predict(model, Examples(rows), 256)
    np.testing.assert_array_equal(one_by_one, together)


def test_the_default_embedding_is_bitwise_the_same_alone_or_in_any_batch(molecules):
    """The shipped model's own embedding (cls+mean+max of the last three blocks, whitened
    jointly) and its raw parts: the whole set in one call against batches of other sizes and paddings, other
    neighbours and order, and each molecule alone or beside the longest molecule."""
    from smiexlm import Featurizer

    feat = Featurizer.from_pretrained(device="cpu")
    assert (feat.pooling, feat.whiten, feat.layers, feat.dim) == ("cls+mean+max", True, 3, 1152)
    mols = EDGE_CASES + molecules[:300]
    longest = max(molecules, key=len)
    order = np.random.default_rng(2).permutation(len(mols))
    for whiten in (True, False):
        whole = feat.featurize(mols, whiten=whiten)  # (n, 1152)
        small = feat.featurize(mols, whiten=whiten, batch_size=3, batch_tokens=64, chunk_size=50)
        np.testing.assert_array_equal(small, whole)
        shuffled = feat.featurize([mols[i] for i in order], whiten=whiten, chunk_size=7)
        np.testing.assert_array_equal(shuffled, whole[order])
        for i in [*range(len(EDGE_CASES)), *range(len(EDGE_CASES), len(mols), 10)]:
            alone = feat.featurize([mols[i]], whiten=whiten)
            np.testing.assert_array_equal(alone, whole[i : i + 1], err_msg=mols[i])
            padded = feat.featurize([mols[i], longest], whiten=whiten)[:1]
            np.testing.assert_array_equal(padded, whole[i : i + 1], err_msg=mols[i])


def test_int8_products_are_exact_integer_sums_rescaled():
    """``int8_linear`` against a brute force in float64: each row and each weight row rounded
    to int8 on its own scale, the integer products summed exactly, then rescaled; an output
    row is the same computed alone."""
    from smiexlm.model.encoder import int8_linear

    g = torch.Generator().manual_seed(0)
    x, w, b = (
        torch.randn(37, 24, generator=g),
        torch.randn(11, 24, generator=g),
        torch.randn(11, generator=g),
    )
    x[3] = 0.0  # a row of zeros keeps its scale 1 and gives the bias
    got = int8_linear(x, w, b)

    def rows(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        peak = a.abs().amax(1, keepdim=True)
        peak = torch.where(peak > 0, peak, torch.full_like(peak, 127.0))
        return torch.round(a * (127.0 / peak)), peak / 127.0

    (xq, xs), (wq, ws) = rows(x), rows(w)
    sums = xq.double() @ wq.double().T  # exact: integers far below 2**53
    expected = sums * xs.double() * ws.double().T + b.double()
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(got[3], b)
    for i in (0, 3, 36):
        assert torch.equal(int8_linear(x[i : i + 1], w, b), got[i : i + 1])
    assert torch.equal(int8_linear(x.reshape(37, 1, 24), w, b).reshape(37, 11), got)


def test_int8_embeddings_are_bitwise_the_same_alone_or_in_any_batch_and_near_fp32(molecules):
    """``Featurizer(int8=True)``: each molecule's embedding is the same alone, beside the
    longest molecule or in the whole set; it is close to, not equal to, the fp32 one."""
    from smiexlm import Featurizer
    from smiexlm.errors import ConfigError

    feat, int8 = Featurizer.from_pretrained(device="cpu"), Featurizer.from_pretrained(int8=True)
    mols = EDGE_CASES + molecules[:120]
    longest = max(molecules, key=len)
    whole = int8.featurize(mols)
    np.testing.assert_array_equal(int8.featurize(mols, batch_size=3, chunk_size=17), whole)
    for i in range(0, len(mols), 9):
        np.testing.assert_array_equal(int8.featurize([mols[i]]), whole[i : i + 1], err_msg=mols[i])
        np.testing.assert_array_equal(int8.featurize([mols[i], longest])[:1], whole[i : i + 1])
    fp32 = feat.featurize(mols)
    cosine = (whole * fp32).sum(1) / np.linalg.norm(whole, axis=1) / np.linalg.norm(fp32, axis=1)
    assert cosine.min() > 0.98 and np.median(cosine) > 0.995  # measured 0.990 and 0.998 on BBBP
    assert not np.array_equal(whole, fp32)
    for bad in ({"int8": 1}, {"int8": True, "backend": "onnx"}, {"int8": True, "device": "cuda"}):
        with pytest.raises(ConfigError, match="'int8'"):
            Featurizer.from_pretrained(**bad)
