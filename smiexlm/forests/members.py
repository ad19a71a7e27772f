"""Kernel members kept beside a fine-tuned model, and the weights a served blend gives every
member (``smiexlm finetune``, ``kernels`` and ``combine``).

A regression run keeps, beside the network and its forest, support-vector regressions on
kernels (:mod:`~smiexlm.forests.kernels`): ``tanimoto`` on ECFP4, ``rbf`` on the backbone's
frozen embedding (the pretrained model as it was before fine-tuning, served as
:class:`~smiexlm.Featurizer` serves it), ``both``. Each is fitted on the training molecules,
its ``C`` (and ``gamma``) chosen in scaffold-whole folds of them, which also give every
training molecule an out-of-fold prediction; the forest is refitted in the same folds for its
own (:func:`forest_oof`, at most :data:`OOF_TREES` trees: they only weigh the members, and
the served forest keeps its own). The network has none: fine-tuned once a fold, it costs
about four times its own fine-tuning and changed no served blend
(``benchmarks/results/potency/network_oof``).

How the members are weighted (:data:`COMBINES`, :func:`combine`), without the test rows:

- ``fixed``: the network ``forest_weight``, the forest the rest, the kernels nothing (the
  blend of a folder without kernels);
- ``oof-best``: the member of the lowest out-of-fold RMSE alone;
- ``oof-weights``: non-negative weights summing to 1, fitted by least squares on the
  out-of-fold predictions of the training molecules;
- ``gated``: ``oof-weights``, and the network joins at ``forest_weight`` (the others scaled
  to the rest) when its RMSE on the validation molecules is below theirs combined: one
  decision taken on the validation molecules, which chose the network's epoch already, in
  place of weights fitted on them;
- ``picked`` (the default): of ``fixed``, ``gated``, the forest alone and ``oof-best``, the
  one of the lowest RMSE on the validation molecules: four candidates, few enough for a
  small validation part to choose among without being fitted to it. Chosen on BACE's pIC50,
  ESOL and FreeSolv, checked on Lipophilicity (``benchmarks/results/potency``).

A fine-tuned folder keeps the kernels in ``kernels.safetensors`` (each member's support
molecules, dual coefficients and scaling, and its scores of the validation molecules), the
frozen embedding's model folder in ``embedder/``, both under ``checksums.json``, and the
record (each member's setting and out-of-fold RMSE, the weights, the rule) in
``finetune.json["members"]``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.errors import ConfigError, DataError, check_choice
from smiexlm.forests.kernels import KERNELS, KernelInputs, KernelMember, _folds, fit_kernel_member
from smiexlm.modelio.layout import EMBEDDER_DIR, FINETUNE_NAME, KERNELS_NAME
from smiexlm.paths import file_sha256

COMBINES = ("fixed", "oof-best", "oof-weights", "gated", "picked")
FOREST = "forest"  # the forest's name among the members
MIN_KERNEL_ROWS = 2  # labelled training molecules a label needs: the folds hold out one
#: trees of each forest refitted for out-of-fold predictions (ESOL: 11 CPU s for the five
#: folds against 60 at 500 trees, benchmarks/results/potency/members_cost.md)
OOF_TREES = 100
#: the frozen embedding of model-side SMILES, (N, D): a pretrained folder served as
#: ``Featurizer`` serves it, given by the layer that loads one (fine-tuning, serving)
Embed = Callable[[list[str]], np.ndarray]


def check_kernel_rows(train_labels: np.ndarray, label_cols: list[str]) -> None:
    """DataError unless every label holds :data:`MIN_KERNEL_ROWS` labelled training molecules
    ((n_train, T), NaN = missing): the members' folds need them."""
    counts = (~np.isnan(np.asarray(train_labels, np.float64))).sum(axis=0)
    for col, n in zip(label_cols, counts.tolist(), strict=True):
        if n < MIN_KERNEL_ROWS:
            raise DataError(f"label {col!r}: {n} labelled training molecule(s); expected at "
                            f"least {MIN_KERNEL_ROWS} for the kernel members' folds (use more "
                            "training data, or --set kernels=none)")  # fmt: skip


def rmse(y: np.ndarray, p: np.ndarray) -> float:
    """RMSE over the labelled cells of ``y`` (NaN = missing) that ``p`` scores (an
    out-of-fold prediction of a sparse label may be NaN)."""
    y, p = np.asarray(y, np.float64), np.asarray(p, np.float64).reshape(np.shape(y))
    keep = ~np.isnan(y) & ~np.isnan(p)
    return float(np.sqrt(np.mean((y[keep] - p[keep]) ** 2)))


def least_squares_weights(columns: list[np.ndarray], y: np.ndarray) -> np.ndarray:
    """Non-negative weights summing to 1 of least squares of ``y`` on ``columns`` (the
    labelled cells every column scores); equal weights when every weight is 0."""
    from scipy.optimize import nnls

    a = np.stack([np.asarray(c, np.float64).reshape(-1) for c in columns], axis=1)
    keep = ~np.isnan(np.asarray(y, np.float64).reshape(-1)) & ~np.isnan(a).any(axis=1)
    w, _ = nnls(a[keep], np.asarray(y, np.float64).reshape(-1)[keep])
    return w / w.sum() if w.sum() > 0 else np.full(len(columns), 1 / len(columns))


def combine(rule: str, oof: dict[str, np.ndarray], y_train: np.ndarray,
            valid: dict[str, np.ndarray], y_valid: np.ndarray,
            network_weight: float) -> dict[str, float]:  # fmt: skip
    """Each member's weight under ``rule`` (see the module docstring). ``oof``: the
    out-of-fold predictions of the training molecules of the members that have them (the
    forest first, then the kernels); ``valid``: every member's scores of the validation
    molecules, the network's as ``"model"``."""
    check_choice("combine", rule, COMBINES)
    if rule == "picked":
        candidates = [combine(r, oof, y_train, valid, y_valid, network_weight)
                      for r in ("fixed", "gated")]  # fmt: skip
        if FOREST in oof:
            candidates.append({n: float(n == FOREST) for n in ["model", *oof]})
        if oof:
            candidates.append(combine("oof-best", oof, y_train, valid, y_valid, network_weight))
        return min(candidates, key=lambda w: rmse(y_valid, blended(w, valid)))  # first of ties
    names = list(oof)
    weights = dict.fromkeys(["model", *names], 0.0)
    if rule == "fixed" or not names:  # the network and its forest; the kernels nothing
        has_forest = FOREST in names
        weights["model"] = network_weight if has_forest else 1.0
        if has_forest:
            weights[FOREST] = 1.0 - network_weight
        return weights
    if rule == "oof-best":
        weights[min(names, key=lambda n: rmse(y_train, oof[n]))] = 1.0
        return weights
    fitted = least_squares_weights([oof[n] for n in names], y_train)
    weights |= dict(zip(names, map(float, fitted), strict=True))
    if rule == "gated":
        others = sum(weights[n] * np.asarray(valid[n], np.float64) for n in names)
        if rmse(y_valid, valid["model"]) < rmse(y_valid, others):
            weights = {n: w * (1.0 - network_weight) for n, w in weights.items()}
            weights["model"] = network_weight
    return weights


def blended(weights: dict[str, float], scores: dict[str, np.ndarray]) -> np.ndarray:
    """(N, T) float64 the weighted mean of the members' scores (regression values)."""
    return sum(w * np.asarray(scores[n], np.float64) for n, w in weights.items())  # type: ignore[return-value]


def forest_oof(texts: list[str], labels: np.ndarray, train: np.ndarray, groups: np.ndarray,
               seed: int, features: str, n_trees: int) -> np.ndarray:  # fmt: skip
    """(n_train, T) out-of-fold predictions of the training molecules by the regression
    forest of ``features`` (``n_trees``, ``seed``), refitted in the kernels' folds."""
    from smiexlm.forests.baseline import BaselineConfig, ForestFeatures, fit_forests, forest_scores

    train = np.asarray(train)
    cfg = BaselineConfig(features, n_trees=n_trees)
    table = ForestFeatures(texts, features, cache=True)
    oof = np.full((len(train), labels.shape[1]), np.nan)
    for fit_rows, held in _folds(groups, len(train)):
        x = table.matrix(table.scaler(train[fit_rows]))
        fitted = fit_forests(x[train[fit_rows]], labels[train[fit_rows]], "regression", seed, cfg)
        oof[held] = forest_scores(fitted, x[train[held]], "regression")
    return oof


@dataclass
class KernelMembers:
    """The kernel members of one fine-tuned run: each member, its scores of the validation
    molecules, and the model folder of the frozen embedding (None when no member reads one)."""

    members: dict[str, KernelMember]  # "svr_tanimoto", "svr_rbf", "svr_both"
    valid_scores: dict[str, np.ndarray]  # (n_valid, T) each
    embedder: Path | None

    @staticmethod
    def inputs(texts: list[str], kinds: list[str], embed: Embed | None) -> KernelInputs:
        """What ``kinds`` read of ``texts``: ECFP4 bits, and the frozen embedding (``embed``)."""
        from smiexlm.chemistry.fingerprints import morgan_fingerprints

        bits = morgan_fingerprints(texts) if set(kinds) - {"rbf"} else None
        vectors = None
        if set(kinds) - {"tanimoto"}:
            if embed is None:
                raise ConfigError("kernels", ",".join(kinds), "tanimoto alone without a "
                                  "pretrained model folder (rbf and both read its embedding)")  # fmt: skip
            vectors = np.asarray(embed(texts), np.float32)
        return KernelInputs(bits, vectors)

    @classmethod
    def fit(cls, kinds: list[str], texts: list[str], labels: np.ndarray, train: np.ndarray,
            valid: np.ndarray, groups: np.ndarray, embedder: Path | None,
            embed: Embed | None) -> tuple[KernelMembers, dict[str, np.ndarray], dict]:  # fmt: skip
        """The members of ``kinds`` fitted on the ``train`` rows, ``embed`` the embedding of
        the model folder ``embedder``; with each one's (N, T) scores of every row and
        (n_train, T) out-of-fold predictions."""
        for kind in kinds:
            check_choice("kernels", kind, KERNELS)
        inputs = cls.inputs(texts, kinds, embed)
        train, valid = np.asarray(train), np.asarray(valid)
        members, scores, oof = {}, {}, {}
        for kind in kinds:
            name = f"svr_{kind}"
            members[name], oof[name] = fit_kernel_member(kind, inputs.take(train), labels[train],
                                                      groups)  # fmt: skip
            scores[name] = members[name].predict(inputs)
        kept = cls(members, {n: s[valid] for n, s in scores.items()},
                   embedder if inputs.vectors is not None else None)  # fmt: skip
        return kept, scores, oof

    def scores(self, texts: list[str], embed: Embed | None) -> dict[str, np.ndarray]:
        """Each member's (N, T) float32 values of ``texts`` (model-side SMILES), ``embed``
        the embedding of :attr:`embedder`."""
        if not texts:
            return {n: np.zeros((0, m.coef.shape[1]), np.float32) for n, m in self.members.items()}
        inputs = self.inputs(texts, [m.kernel for m in self.members.values()], embed)
        return {n: m.predict(inputs).astype(np.float32) for n, m in self.members.items()}

    def record(self) -> dict[str, Any]:
        """What ``finetune.json["members"]`` keeps of the kernels (the weights are added)."""
        doc: dict[str, Any] = {"file": KERNELS_NAME,
                               "kernels": {n: m.record() for n, m in self.members.items()}}  # fmt: skip
        if self.embedder is not None:
            doc["embedder"] = EMBEDDER_DIR
            from smiexlm.modelio.integrity import weights_file  # imports torch

            doc["embedder_sha256"] = file_sha256(weights_file(Path(self.embedder)))
        return doc

    def save(self, folder: Path) -> list[str]:
        """Write ``kernels.safetensors`` (and ``embedder/``) into ``folder``; the names the
        caller records the sha256 of."""
        from safetensors.numpy import save_file

        arrays = {f"{n}.{k}": v for n, m in self.members.items() for k, v in m.tensors().items()}
        arrays |= {f"{n}.valid": np.ascontiguousarray(v, np.float32)
                   for n, v in self.valid_scores.items()}  # fmt: skip
        save_file(
            arrays, str(Path(folder) / KERNELS_NAME), metadata={"format": "smiexlm-kernels/1"}
        )
        if self.embedder is not None:
            copy_model_folder(Path(self.embedder), Path(folder) / EMBEDDER_DIR)
        return [KERNELS_NAME]

    @classmethod
    def load(cls, folder: Path | str, meta: dict[str, Any]) -> KernelMembers | None:
        """The kernels of the fine-tuned folder whose ``finetune.json`` is ``meta``; None
        without. DataError naming the file for a sha256 that differs, a member that is not
        one, or an embedder that is not the one fitted on."""
        from safetensors.numpy import load_file

        from smiexlm.modelio.integrity import verify_checksum

        folder = Path(folder)
        members_record = meta.get("members") or {}
        _check_record(folder, "members", members_record, dict, "a table")
        record = members_record.get("kernels")
        if not record:
            return None
        _check_record(folder, "members.kernels", record, dict, "a table of members")
        for name, rec in record.items():
            _check_record(folder, f"members.kernels.{name}", rec, dict, "a table")
        for key, own in (("file", KERNELS_NAME), ("embedder", EMBEDDER_DIR)):
            if members_record.get(key, own) != own:  # the folder's own, never a path elsewhere
                raise _record_error(folder, f"members.{key}", members_record[key], repr(own))
        path = folder / KERNELS_NAME
        if not path.is_file():
            raise DataError(f"{str(path)!r}: no such file, which finetune.json's 'members' names")
        verify_checksum(path, required=True)
        arrays = load_file(str(path))
        members, valid = {}, {}
        for name, rec in record.items():
            own = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.split(".", 1)[0] == name}
            if "valid" not in own:
                raise DataError(f"{str(path)!r}: no validation scores of member {name!r}")
            valid[name] = own.pop("valid")
            members[name] = KernelMember.from_stored(rec, own, f"{str(path)!r} member {name!r}")
        embedder = _checked_embedder(folder, meta["members"])
        return cls(members, valid, embedder)


def member_weights(
    record: dict[str, Any], names: list[str], folder: Path | str
) -> dict[str, float]:
    """The weights of ``finetune.json["members"]`` (``record``), checked: one a member of
    ``names``, each at least 0, summing to 1; DataError naming the folder's file otherwise."""
    weights = record.get("weights")
    ok = (isinstance(weights, dict) and sorted(weights) == sorted(names)
          and all(type(w) in (int, float) and w >= 0 for w in weights.values())
          and abs(sum(weights.values()) - 1.0) < 1e-6)  # fmt: skip
    if not ok:
        raise DataError(f"{str(Path(folder) / FINETUNE_NAME)!r}: 'members.weights' is "
                        f"{weights!r}: expected one weight of at least 0 for each of "
                        f"{', '.join(names)}, summing to 1")  # fmt: skip
    total = float(sum(weights.values()))  # exactly 1 for the blend, whatever JSON rounded
    return {n: float(w) / total for n, w in weights.items()}


def _record_error(folder: Path, field: str, value: Any, expected: str) -> DataError:
    return DataError(f"{str(folder / FINETUNE_NAME)!r}: {field!r} = {str(value)[:60]!r}: "
                     f"expected {expected}")  # fmt: skip


def _check_record(folder: Path, field: str, value: Any, kind: type, expected: str) -> None:
    """DataError naming the folder's ``finetune.json`` and ``field`` unless ``value`` is a
    ``kind``."""
    if not isinstance(value, kind):
        raise _record_error(folder, field, value, expected)


def _checked_embedder(folder: Path, record: dict[str, Any]) -> Path | None:
    """The folder's ``embedder/``, its weights checked against the record; None without."""
    if "embedder" not in record:
        return None
    from smiexlm.modelio.integrity import weights_file  # imports torch

    path = folder / EMBEDDER_DIR
    weights = weights_file(path)
    if not weights.is_file() or file_sha256(weights) != record.get("embedder_sha256"):
        raise DataError(f"{str(weights)!r}: missing, or not the frozen embedding the kernel "
                        "members were fitted on (its sha256 differs from finetune.json's "
                        "'members.embedder_sha256')")  # fmt: skip
    return path


def copy_model_folder(source: Path, target: Path) -> None:
    """Copy the files of the model folder ``source`` (not its sub-folders) into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(Path(source).iterdir()):
        if path.is_file() and path.suffix in (".json", ".safetensors"):
            shutil.copyfile(path, target / path.name)
