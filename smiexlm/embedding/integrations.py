"""smiexlm embeddings inside DeepChem and scikit-learn.

- :class:`ExLMTransformer`: a scikit-learn transformer (SMILES column -> embeddings) for
  ``Pipeline``\\ s, ``cross_val_score`` and grid searches. It stores only its parameters (the
  checkpoint *path*); the model is loaded on first use and is left out when pickled, so a
  pickled pipeline holds no weights and reloads them from the path.
- ``ExLMFeaturizer``: a DeepChem ``MolecularFeaturizer`` for ``dc.data`` loaders and
  ``dc.molnet`` pipelines. It embeds a whole list at once (batched by token budget) instead of
  one molecule at a time; molecules that fail give DeepChem's empty array, which DeepChem's
  loaders then drop. DeepChem is imported only when ``ExLMFeaturizer`` is first used (it takes
  seconds to import).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

from smiexlm.embedding.inputs import table_smiles

__all__ = ["ExLMFeaturizer", "ExLMTransformer"]  # noqa: F822 (ExLMFeaturizer is built lazily)

#: (path, device) -> (the weights' sha256 when loaded, Featurizer), shared per process
_LOADED: dict[tuple[str, str], tuple[str | None, Any]] = {}


def load_featurizer(path: str | Path | None, device: str = "auto") -> Any:
    """A cached :class:`~smiexlm.embedding.featurizer.Featurizer` for ``path`` (None = default
    model), loaded again when the folder's weights have changed since (a folder exported
    anew under the same path)."""
    return _loaded(path, device)[1]


def _loaded(path: str | Path | None, device: str) -> tuple[str | None, Any]:
    """(the sha256 of the weights loaded, the Featurizer) for ``path`` on ``device``."""
    from smiexlm.embedding.featurizer import Featurizer

    key = (str(path) if path is not None else "", device)
    kept = _LOADED.get(key)
    if kept is None or _weights_sha256(kept[1].source) != kept[0]:
        featurizer = Featurizer.from_pretrained(path, device=device)
        _LOADED[key] = kept = (_weights_sha256(featurizer.source), featurizer)
    return kept


def _weights_sha256(folder: Path | None) -> str | None:
    """The sha256 of the weights a model folder holds now (None for a model in memory)."""
    from smiexlm.modelio.integrity import weights_sha256

    return None if folder is None else weights_sha256(folder)


class ExLMTransformer(TransformerMixin, BaseEstimator):
    """SMILES -> (n, d) embeddings, for scikit-learn pipelines.

    >>> from sklearn.pipeline import make_pipeline
    >>> from sklearn.linear_model import LogisticRegression
    >>> model = make_pipeline(ExLMTransformer("path/to/ckpt"), LogisticRegression())
    >>> model.fit(smiles_train, y_train).predict_proba(smiles_test)

    ``errors="nan"`` leaves NaN rows for invalid SMILES (follow with an imputer);
    ``errors="raise"`` (default) stops at the first one. ``whiten``: the model's corpus
    whitening (None: as its folder says; see :mod:`smiexlm.whitening`).
    """

    def __init__(
        self,
        checkpoint: str | Path | None = None,
        pooling: str | None = None,
        layer: int | tuple[int, ...] | None = None,
        errors: Literal["raise", "nan"] = "raise",
        canonicalize: bool = True,
        batch_tokens: int = 16384,
        device: str = "auto",
        whiten: bool | None = None,
    ):
        self.checkpoint = checkpoint
        self.pooling = pooling
        self.layer = layer
        self.errors = errors
        self.canonicalize = canonicalize
        self.batch_tokens = batch_tokens
        self.device = device
        self.whiten = whiten

    @property
    def featurizer_(self) -> Any:
        """The model of ``checkpoint`` on ``device``, loaded again when either was set anew
        (``set_params``); a pipeline read back from a pickle checks that the folder still
        holds the weights it was pickled with."""
        key = (str(self.checkpoint), self.device)
        loaded = self.__dict__.get("_featurizer")
        if loaded is None or loaded[0] != key:
            sha, featurizer = _loaded(self.checkpoint, self.device)
            pickled = self.__dict__.pop("_weights_sha256", None)  # (checkpoint, sha256)
            if isinstance(pickled, str):  # pickled before the checkpoint was kept beside it
                pickled = (str(self.checkpoint), pickled)
            if pickled is not None and pickled[0] == str(self.checkpoint) and pickled[1] != sha:
                from smiexlm.errors import DataError

                raise DataError(
                    f"ExLMTransformer: the model folder {str(self.checkpoint)!r} no longer holds "
                    "the weights this estimator was pickled with (their sha256 differs); "
                    "expected the same model (a pickle keeps the path, not the weights)"
                )
            self.__dict__["_featurizer"] = loaded = (key, featurizer, sha)
        return loaded[1]

    def fit(self, X: Any, y: Any = None) -> ExLMTransformer:
        """Nothing to learn: loads the model and records the embedding width."""
        self.n_features_out_ = self.featurizer_.width(self.pooling, self.layer)
        return self

    def transform(self, X: Any) -> np.ndarray:
        return self.featurizer_.featurize(
            table_smiles(X),
            pooling=self.pooling,
            layer=self.layer,
            errors=self.errors,
            canonicalize=self.canonicalize,
            batch_tokens=self.batch_tokens,
            whiten=self.whiten,
        )

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        width = self.featurizer_.width(self.pooling, self.layer)
        return np.asarray([f"exlm{i}" for i in range(width)], dtype=object)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())
        loaded = state.pop("_featurizer", None)  # pickles by path: the weights stay on disk
        if loaded is not None:  # and the digest of those it served, checked when read back
            state["_weights_sha256"] = (str(self.checkpoint), loaded[2])
        return state

    def __sklearn_tags__(self):  # scikit-learn >= 1.6
        tags = super().__sklearn_tags__()
        tags.input_tags.string = True
        tags.input_tags.two_d_array = False
        tags.requires_fit = False
        return tags


_FEATURIZER_CLASS: type | None = None


def _deepchem_rows(feat, datapoints: Any, pooling: str | None, layer, canonicalize: bool) -> np.ndarray:  # fmt: skip
    """Embeddings of SMILES or RDKit ``Mol`` objects, as DeepChem expects them: a float
    matrix, or an object array with an empty array for each molecule that failed."""
    from rdkit import Chem

    if isinstance(datapoints, (str, Chem.Mol)):
        datapoints = [datapoints]
    smiles = [Chem.MolToSmiles(m) if isinstance(m, Chem.Mol) else m for m in list(datapoints)]
    emb = feat.featurize(smiles, pooling=pooling, layer=layer, errors="nan",
                         canonicalize=canonicalize)  # fmt: skip
    failed = np.isnan(emb).any(axis=1)
    if not failed.any():
        return emb
    out = np.empty(len(smiles), dtype=object)
    for i, row in enumerate(emb):
        out[i] = np.array([]) if failed[i] else row
    return out


def _featurizer_class() -> type:
    """Build ``ExLMFeaturizer`` on first use, so that importing this module stays light."""
    global _FEATURIZER_CLASS
    if _FEATURIZER_CLASS is not None:
        return _FEATURIZER_CLASS
    from deepchem.feat import MolecularFeaturizer

    class ExLMFeaturizer(MolecularFeaturizer):
        """DeepChem featurizer: each molecule -> its smiexlm embedding (d floats).

        Accepts SMILES or RDKit ``Mol`` objects (written out as SMILES). Failed molecules
        become empty arrays, DeepChem's convention, so ``dc.data`` loaders drop them.
        """

        def __init__(
            self,
            checkpoint: str | Path | None = None,
            pooling: str | None = None,
            layer: int | tuple[int, ...] | None = None,
            canonicalize: bool = True,
            device: str = "auto",
        ):
            super().__init__()
            self.checkpoint = checkpoint
            self.pooling = pooling
            self.layer = layer
            self.canonicalize = canonicalize
            self.device = device

        @property
        def featurizer(self) -> Any:
            return load_featurizer(self.checkpoint, self.device)

        def featurize(self, datapoints: Any, log_every_n: int = 1000, **kwargs: Any) -> np.ndarray:
            return _deepchem_rows(self.featurizer, datapoints, self.pooling, self.layer,
                                  self.canonicalize)  # fmt: skip

        def _featurize(self, datapoint: Any, **kwargs: Any) -> np.ndarray:
            row = self.featurize([datapoint])[0]
            if row.size == 0:
                from smiexlm.errors import InvalidSmilesError

                raise InvalidSmilesError(str(datapoint), None, "could not be embedded")
            return row

    ExLMFeaturizer.__module__ = __name__
    ExLMFeaturizer.__qualname__ = "ExLMFeaturizer"
    _FEATURIZER_CLASS = ExLMFeaturizer
    return ExLMFeaturizer


def __getattr__(name: str) -> Any:
    if name == "ExLMFeaturizer":
        return _featurizer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
