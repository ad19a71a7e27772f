"""A wide ensemble: fine-tuned networks and random forests of one split and seed, kept in one
folder and served blended (``smiexlm finetune --ensemble wide``).

The members (:data:`NETWORKS`, then :data:`FORESTS`): the network fine-tuned alone
(``model``), the same with RDKit 2D descriptors beside its head (``model_rdkit2d``), and the
campaign's random forests (balanced classes, the run's seed) on RDKit 2D, on RDKit 2D with
ECFP4 and on ECFP4 (``rf_rdkit2d``, ``rf_both``, ``rf_ecfp4``). Each member's scores are put on
one scale, their quantiles among the same member's scores of the validation molecules
(classification; regression values as they are), and averaged with equal weights
(:func:`~smiexlm.forests.blend.blend_members`). Only the training molecules fit a member;
the validation molecules choose each network's epoch and place every member's quantiles.

A forest's trees a label follow ``forest_trees`` and the budget of a kept forest
(:func:`~smiexlm.finetuning.config.resolve_forest`). Each network member is an ordinary
fine-tuning run of its own (``<run>/model/``, ``<run>/model_rdkit2d/``, each with its state
after every epoch), so a stopped ensemble goes on from where its members stopped; the forests
are fitted when both networks have finished.

An ensemble's folder (one per seed, ``--save-dir DIR`` writes ``DIR/seed<N>``) holds
``ensemble.json`` (the members, the blend, the task), a fine-tuned folder per network
(``model/``, ``model_rdkit2d/``), ``forest_<kind>.skops`` per forest
(:class:`~smiexlm.forests.forest.KeptForest`) and ``checksums.json``;
:func:`~smiexlm.serving.prediction.predict` serves it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.errors import DataError
from smiexlm.modelio.layout import FINETUNE_NAME

ENSEMBLE_NAME = "ensemble.json"
ENSEMBLE_FORMAT = "smiexlm-ensemble/1"
#: the network members: name -> the hybrid features beside the head (None: none)
NETWORKS = {"model": None, "model_rdkit2d": "rdkit2d"}
#: the forest members' features; each is the member ``rf_<kind>``
FORESTS = ("rdkit2d", "both", "ecfp4")
#: the members' blend (:data:`smiexlm.forests.blend.BLENDS`)
HOW = "quantile"


def member_names() -> list[str]:
    return [*NETWORKS, *(f"rf_{kind}" for kind in FORESTS)]


def is_ensemble(folder: Path | str) -> bool:
    """Whether ``folder`` is an ensemble's folder (it holds ``ensemble.json``)."""
    return (Path(folder) / ENSEMBLE_NAME).is_file()


def network_config(cfg, features: str | None):
    """The FinetuneConfig of a network member: ``cfg`` with its own ``features``, no forest
    and no ensemble."""
    return dataclasses.replace(cfg, features=features, forest=None, ensemble="none")


def _fit_forests(task, split, cfg, seed: int, inputs: list[str], valids: dict, tests: dict,
                 record: dict) -> dict:  # fmt: skip
    """Each forest of :data:`FORESTS` fitted on the seed's split: kind -> forest; its
    validation and test scores go into ``valids`` and ``tests``, its scores and CPU seconds
    into ``record``, under ``rf_<kind>``."""
    from smiexlm.finetuning.config import resolve_forest
    from smiexlm.forests.forest import KeptForest

    forests = {}
    for kind in FORESTS:
        forest_cfg = resolve_forest(dataclasses.replace(cfg, forest=kind, ensemble="none"),
                                    task.task_type, len(task.label_cols))  # fmt: skip
        c0 = time.process_time()
        forest, scores = KeptForest.fit(inputs, task.labels, split.train, split.valid,
                                        task.task_type, seed, forest_cfg)  # fmt: skip
        name = f"rf_{kind}"
        forests[kind] = forest
        valids[name], tests[name] = forest.valid_scores, scores[split.test]
        record[name] = {"valid": _score(task, split.valid, forest.valid_scores),
                        "test": _score(task, split.test, tests[name]),
                        "n_trees": forest.n_trees, "cpu_seconds": time.process_time() - c0}  # fmt: skip
    return forests


def fit_seed(task, split, cfg, seed: int, backbone, save_dir: Path | None, inputs: list[str],
             features_of, progress: bool, run_dir: Path, fit_one, row_name: str):  # fmt: skip
    """One seed of ``cfg`` (``ensemble = "wide"``): each network member fine-tuned in
    ``run_dir/<member>/`` (read back when finished), the forests fitted, the blend scored and
    kept in ``run_dir`` (``predictions.npz``: the blend as ``valid``/``test``, each member as
    ``valid_<member>``/``test_<member>``), the folder written to ``save_dir`` when given. A
    :class:`~smiexlm.moleculenet.report.RunResult` of the blend, each member's scores and
    CPU seconds in its config (``members``), named ``row_name``. ``features_of(kind)``: the
    unscaled hybrid features of every row (``inputs`` are the model-side SMILES);
    ``fit_one``: :func:`~smiexlm.finetuning.adapter.finetune_once`, which fine-tunes a
    network member."""
    from smiexlm.forests.blend import blend_members
    from smiexlm.moleculenet import runs
    from smiexlm.trust.reference import Reference

    t0, cpu0 = time.perf_counter(), time.process_time()
    valids, tests, record, folders = {}, {}, {}, {}
    for name, features in NETWORKS.items():
        member_cfg = network_config(cfg, features)
        folder, where = run_dir / name / "folder", run_dir / name
        done = runs.finished(where)
        if done is not None and (folder / FINETUNE_NAME).is_file():
            expected = runs.identity(task, split, member_cfg, backbone)
            result = runs.check_finished(done, where, expected, type(member_cfg))
        else:
            result = fit_one(task, split, member_cfg, seed, backbone, folder, inputs,
                             features_of(features), progress, where)  # fmt: skip
        reference = Reference.load(folder)
        valids[name], tests[name] = reference.valid_scores, runs.read_predictions(where, task)["test"]  # fmt: skip
        folders[name] = folder
        record[name] = {"valid": result.valid, "test": result.test,
                        "cpu_seconds": result.config.get("train_cpu_seconds")}  # fmt: skip
    forests = _fit_forests(task, split, cfg, seed, inputs, valids, tests, record)
    names = member_names()
    valid = blend_members(task.task_type, [valids[n] for n in names], [valids[n] for n in names],
                          how=HOW)  # fmt: skip
    test = blend_members(task.task_type, [valids[n] for n in names], [tests[n] for n in names],
                         how=HOW)  # fmt: skip
    parts = {f"{p}_{n}": (valids if p == "valid" else tests)[n] for p in ("valid", "test") for n in names}  # fmt: skip
    runs.write_predictions(run_dir, split, valid, test, parts=parts)
    if save_dir is not None and runs.is_main():
        _save(Path(save_dir), task, split, seed, folders, forests)
    config = cfg.to_dict() | {"members": record, "processes": runs.processes(),
                              "train_cpu_seconds": sum(m["cpu_seconds"] or 0.0 for m in record.values()),
                              "ensemble_cpu_seconds": time.process_time() - cpu0}  # fmt: skip
    result = task.result(row_name, split, seed,
                         _scores(task, split.valid, valid).mean, _scores(task, split.test, test),
                         time.perf_counter() - t0, config, None, test)  # fmt: skip
    runs.finish(run_dir, result)
    return result


def _scores(task, rows, values: np.ndarray):
    """The TaskScores of ``values`` on ``rows`` (NaN when there are none, as hpopt's splits
    without test rows)."""
    from smiexlm.moleculenet.metrics import TaskScores, score

    if not len(rows):
        n = len(task.label_cols)
        return TaskScores(float("nan"), [float("nan")] * n, 0, list(range(n)))
    return score(task.task_type, task.labels[rows], values)


def _score(task, rows, values: np.ndarray) -> float:
    return _scores(task, rows, values).mean * task.scale


def _save(folder: Path, task, split, seed: int, networks: dict[str, Path], forests: dict) -> None:
    """Write the ensemble's folder (see the module docstring) atomically."""
    from smiexlm.atomic import atomic_dir
    from smiexlm.modelio.integrity import record_checksums

    with atomic_dir(folder) as tmp:
        members: list[dict[str, Any]] = []
        for name, source in networks.items():
            shutil.copytree(source, tmp / name)
            members.append({"name": name, "folder": name})
        files = []
        for kind, forest in forests.items():
            name = f"forest_{kind}.skops"
            files.append(forest.save(tmp, name).name)
            members.append({"name": f"rf_{kind}", "forest": forest.record(name)})
        meta = {"format": ENSEMBLE_FORMAT, "kind": "wide", "blend": HOW, "dataset": task.name,
                "task_type": task.task_type, "label_cols": list(task.label_cols), "seed": seed,
                "split": split.label, "members": members}  # fmt: skip
        (tmp / ENSEMBLE_NAME).write_text(json.dumps(meta, indent=1), encoding="utf-8")
        record_checksums(tmp, ENSEMBLE_NAME, *files)


@dataclasses.dataclass
class EnsembleFolder:
    """An ensemble's folder read back, every record and checksum checked: its
    ``ensemble.json``, the fine-tuned folder of each network member and each forest (loaded)."""

    folder: Path
    meta: dict[str, Any]
    networks: dict[str, Path]
    forests: dict[str, Any]  # member name -> KeptForest

    @classmethod
    def read(cls, folder: Path | str, forests: bool = True) -> EnsembleFolder:
        """The folder read, its forests loaded unless ``forests`` is False."""
        from smiexlm.forests.forest import KeptForest
        from smiexlm.modelio.integrity import verify_checksum

        folder = Path(folder)
        path = folder / ENSEMBLE_NAME
        verify_checksum(path, required=True)
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DataError(f"{str(path)!r}: not a readable JSON file ({exc})") from None
        members = meta.get("members") if isinstance(meta, dict) else None
        names = [m.get("name") for m in members or [] if isinstance(m, dict)]
        if (meta.get("format") if isinstance(meta, dict) else None) != ENSEMBLE_FORMAT or not names \
                or len(set(names)) != len(names) or len(names) != len(members):  # fmt: skip
            raise DataError(f"{str(path)!r}: expected a {ENSEMBLE_FORMAT} record with members "
                            "named once each")  # fmt: skip
        networks, kept, n_outputs = {}, {}, len(meta.get("label_cols") or [])
        for member in members:
            name = member["name"]
            if "folder" in member:
                sub = member["folder"]
                if not isinstance(sub, str) or Path(sub).name != sub or not (folder / sub / FINETUNE_NAME).is_file():  # fmt: skip
                    raise DataError(f"{str(path)!r}: member {name!r} names the folder {sub!r}: "
                                    f"expected a fine-tuned folder inside {str(folder)!r}")  # fmt: skip
                networks[name] = folder / sub
            elif not isinstance(member.get("forest"), dict):
                raise DataError(f"{str(path)!r}: member {name!r} is neither a folder nor a forest")
            elif forests:
                kept[name] = KeptForest.load(folder, {"n_outputs": n_outputs}, member["forest"],
                                             ENSEMBLE_NAME)  # fmt: skip
        if not networks:
            raise DataError(f"{str(path)!r}: expected at least one fine-tuned network member")
        return cls(folder, meta, networks, kept)


def network_folders(folder: Path | str) -> list[Path]:
    """The fine-tuned folders of an ensemble's network members; none when ``folder`` is not an
    ensemble's."""
    if not is_ensemble(folder):
        return []
    return list(EnsembleFolder.read(folder, forests=False).networks.values())
