"""ExLMTransformer inside scikit-learn, ExLMFeaturizer inside DeepChem pipelines."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.base import clone
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline

from smiexlm import Featurizer
from smiexlm.embedding.integrations import ExLMTransformer
from tests.unit.featurizer.test_featurizer import PANEL, make_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.set_num_threads(1)
    return make_checkpoint(tmp_path_factory.mktemp("integ"))


@pytest.fixture(scope="module")
def bbbp(shared_data):
    frame = pd.read_csv(shared_data / "moleculenet" / "bbbp.csv")
    # a fixed, class-balanced subset keeps the test quick
    return pd.concat([frame[frame.p_np == c].head(40) for c in (0, 1)]).reset_index(drop=True)


def test_transformer_matches_featurizer(checkpoint):
    tr = ExLMTransformer(str(checkpoint), pooling="mean", device="cpu")
    x = tr.fit_transform(PANEL)
    ref = Featurizer.from_pretrained(checkpoint, device="cpu").featurize(PANEL, pooling="mean")
    np.testing.assert_allclose(x, ref, atol=1e-6)
    assert tr.n_features_out_ == ref.shape[1] == len(tr.get_feature_names_out())
    frame = pd.DataFrame({"smiles": PANEL})
    np.testing.assert_allclose(tr.transform(frame), x, atol=1e-6)
    np.testing.assert_allclose(tr.transform(np.array(PANEL)[:, None]), x, atol=1e-6)


def test_clone_and_pickle_by_path(checkpoint):
    tr = ExLMTransformer(str(checkpoint), layer=0, device="cpu").fit(PANEL)
    twin = clone(tr)
    assert twin.get_params() == tr.get_params() and "_featurizer" not in twin.__dict__
    blob = pickle.dumps(tr)
    assert len(blob) < 2000  # parameters only, no weights (the tiny model alone is ~1 MB)
    restored = pickle.loads(blob)
    assert "_featurizer" not in restored.__dict__
    np.testing.assert_allclose(restored.transform(PANEL), tr.transform(PANEL), atol=1e-6)


def test_set_params_loads_the_new_model_and_a_pickle_refuses_other_weights(checkpoint, tmp_path):
    import shutil

    from smiexlm.errors import DataError

    tr = ExLMTransformer(str(checkpoint), device="cpu")
    first = tr.fit_transform(PANEL)
    tr.set_params(checkpoint=None)  # the shipped default: another width
    assert tr.fit_transform(PANEL).shape[1] != first.shape[1]
    copy = tmp_path / "model"
    shutil.copytree(checkpoint, copy)
    fitted = ExLMTransformer(str(copy), device="cpu").fit(PANEL)
    blob = pickle.dumps(fitted)
    shutil.rmtree(copy)
    shutil.copytree(Featurizer.from_pretrained(None).source, copy)  # other weights, same path
    with pytest.raises(DataError, match="no longer holds the weights"):
        pickle.loads(blob).transform(PANEL)
    # the pickle of one read back: another checkpoint set on it loads that one
    restored = pickle.loads(pickle.dumps(ExLMTransformer(str(checkpoint), device="cpu").fit(PANEL)))
    assert restored.set_params(checkpoint=str(copy)).transform(PANEL).shape[1] != first.shape[1]


def test_a_folder_exported_anew_is_loaded_anew_and_a_pickle_names_the_weights_it_served(
    checkpoint, tmp_path
):
    import shutil

    from smiexlm.errors import DataError

    folder = tmp_path / "model"
    shutil.copytree(checkpoint, folder)
    served = ExLMTransformer(str(folder), device="cpu").fit(PANEL)
    before = served.transform(PANEL)
    shutil.rmtree(folder)
    shutil.copytree(Featurizer.from_pretrained(None).source, folder)  # re-exported, same path
    after = ExLMTransformer(str(folder), device="cpu").fit_transform(PANEL)
    assert after.shape[1] != before.shape[1]  # the new weights, not the cached old ones
    with pytest.raises(DataError, match="no longer holds the weights"):  # it served the old
        pickle.loads(pickle.dumps(served)).transform(PANEL)
    with pytest.raises(DataError, match="array of 2 columns"):
        ExLMTransformer(str(folder), device="cpu").fit_transform(np.array([PANEL[:2], PANEL[2:4]]))


def test_pipeline_cross_val_score(checkpoint, bbbp):
    pipe = make_pipeline(
        ExLMTransformer(str(checkpoint), device="cpu"), LogisticRegression(max_iter=500)
    )
    scores = cross_val_score(pipe, bbbp.smiles, bbbp.p_np, cv=3, scoring="roc_auc")
    assert scores.shape == (3,) and np.isfinite(scores).all()
    assert ((scores >= 0) & (scores <= 1)).all()
    fitted = pickle.loads(pickle.dumps(pipe.fit(bbbp.smiles, bbbp.p_np)))
    proba = fitted.predict_proba(bbbp.smiles.head(5))
    assert proba.shape == (5, 2)
    np.testing.assert_allclose(proba.sum(1), 1.0)


def test_transformer_nan_policy(checkpoint):
    tr = ExLMTransformer(str(checkpoint), errors="nan", device="cpu")
    x = tr.fit_transform(["CCO", "C1CC"])
    assert np.isfinite(x[0]).all() and np.isnan(x[1]).all()


def test_deepchem_is_imported_lazily():
    code = (
        "import sys, smiexlm.embedding.integrations as m; assert 'deepchem' not in sys.modules; "
        "m.ExLMTransformer(); assert 'deepchem' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_deepchem_csvloader_and_dataset(checkpoint, bbbp, tmp_path):
    import deepchem as dc

    from smiexlm.embedding.integrations import ExLMFeaturizer

    featurizer = ExLMFeaturizer(str(checkpoint), device="cpu")
    assert isinstance(featurizer, dc.feat.MolecularFeaturizer)
    frame = bbbp.head(30).copy()
    frame.loc[3, "smiles"] = "C1CC"  # unparsable: DeepChem's loader must drop it
    csv = tmp_path / "mini.csv"
    frame.to_csv(csv, index=False)
    loader = dc.data.CSVLoader(tasks=["p_np"], feature_field="smiles", featurizer=featurizer)
    dataset = loader.create_dataset(str(csv))
    assert dataset.X.shape == (29, 128)
    good = frame.drop(index=3)
    ref = Featurizer.from_pretrained(checkpoint, device="cpu").featurize(good.smiles)
    np.testing.assert_allclose(dataset.X, ref, atol=1e-5)
    np.testing.assert_array_equal(dataset.y[:, 0], good.p_np.to_numpy())
    # RDKit molecules work too, and one datapoint at a time through _featurize
    from rdkit import Chem

    mols = [Chem.MolFromSmiles(s) for s in PANEL[:4]]
    np.testing.assert_allclose(
        featurizer.featurize(mols), featurizer.featurize(PANEL[:4]), atol=1e-5
    )
    # a splitter and a model from DeepChem on top of the features
    train, test = dc.splits.ScaffoldSplitter().train_test_split(
        dc.data.NumpyDataset(dataset.X, dataset.y, ids=good.smiles.to_numpy()), frac_train=0.7
    )
    assert len(train) + len(test) == 29
