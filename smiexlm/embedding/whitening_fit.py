"""``smiexlm whiten``: fit a model folder's corpus whitening and store it with the model.

Embeds a corpus with every pooling in one pass, fits the whitening of each pooling (and of a
combined one, jointly) with :func:`smiexlm.whitening.fit_whitening`, and writes
``whitening.safetensors`` and ``embedding.json`` into the folder, or into a full copy of it
(``--out``). The maths is :mod:`smiexlm.whitening`; the file is
:mod:`smiexlm.modelio.whitening_file`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from smiexlm.atomic import atomic_dir
from smiexlm.data.pipeline import read_smiles
from smiexlm.embedding.featurizer import Featurizer
from smiexlm.errors import ConfigError, DataError
from smiexlm.model.pooling import POOLINGS, last_blocks, pooling_parts
from smiexlm.modelio.folder import ModelFolder
from smiexlm.modelio.layout import is_shipped
from smiexlm.modelio.records import write_embedding
from smiexlm.modelio.whitening_file import save_whitening
from smiexlm.paths import check_output, file_sha256
from smiexlm.whitening import DEFAULT_REL_TOL, fit_whitening, whitening_key

DEFAULT_CORPUS_ROWS = 20_000


def _fit_each(feat: Featurizer, smiles: list[str], corpus: Path, specs: list[tuple[str, int]],
              rel_tol: float, progress: bool) -> dict[str, Any]:  # fmt: skip
    """The whitening of each (pooling, last n blocks) of ``specs``, from one pass of the
    corpus through every pooling of the last blocks any of them needs."""
    n_blocks = max(n for _, n in specs)
    every = feat.featurize(smiles, pooling="+".join(POOLINGS), layer=last_blocks(n_blocks),
                           whiten=False, errors="nan", progress=progress)  # fmt: skip
    d = feat.model.config.d_model
    raw = {(p, b): every[:, (b * len(POOLINGS) + i) * d : (b * len(POOLINGS) + i + 1) * d]
           for b in range(n_blocks) for i, p in enumerate(POOLINGS)}  # block 0: the last  # fmt: skip
    whitenings = {}
    for spec, n in specs:
        columns = [raw[(p, b)] for b in range(n) for p in pooling_parts(spec)]
        try:
            whitenings[whitening_key(spec, n)] = fit_whitening(np.hstack(columns), rel_tol)
        except DataError as err:
            raise DataError(f"--corpus {str(corpus)!r}, pooling {whitening_key(spec, n)!r}: "
                            f"{str(err).removeprefix('fit_whitening: ')}") from None  # fmt: skip
    return whitenings


def whiten_model(
    model: str | Path,
    corpus: str | Path,
    rows: int = DEFAULT_CORPUS_ROWS,
    default: bool = True,
    rel_tol: float = DEFAULT_REL_TOL,
    device: str = "auto",
    progress: bool = True,
    pooling: str | None = None,
    out: str | Path | None = None,
    layers: int | None = None,
) -> dict[str, Any]:
    """Fit the whitening of every pooling of ``model`` (a model folder) on the first ``rows``
    SMILES of ``corpus`` (any file ``smiexlm preprocess`` reads), store it, and make it the
    featurizer's default when ``default``. ``pooling`` (such as ``cls+mean+max``) also fits
    that combination jointly and, with ``default``, makes it the folder's pooling; a combined
    pooling already in ``embedding.json`` is fitted jointly too. ``layers`` = n > 1 also fits
    the chosen pooling of the last n blocks side by side, jointly (``{pooling}@{n}``), and,
    with ``default``, serves those n blocks; None keeps the folder's own (``embedding.json``).

    Without ``out`` the whitening is stored in ``model`` itself, which a shipped model refuses
    (they are read-only); with ``out`` (a new or empty folder) a full copy of the folder is
    written there with the new whitening and its checksums, and ``model`` is left untouched.
    Returns what was recorded."""
    if not isinstance(rows, int) or rows < 1:
        raise ConfigError("rows", rows, "a positive number of corpus molecules")
    folder = ModelFolder(model)
    target = _whitening_target(folder.path, out)  # before the corpus is embedded
    own, own_layers = folder.embedding.pooling, folder.embedding.layers
    chosen = own if pooling is None else pooling
    chosen_layers = own_layers if layers is None else layers
    whitening_key(chosen, chosen_layers)  # a bad name or count fails before the corpus is read
    if chosen_layers > folder.config.n_layers:
        raise ConfigError("layers", chosen_layers, f"at most the model's {folder.config.n_layers} "
                          "blocks")  # fmt: skip
    smiles = read_smiles(Path(corpus), rows)
    feat = Featurizer.from_pretrained(folder.path, device=device)
    specs = [(p, 1) for p in POOLINGS] + [(own, own_layers), (chosen, chosen_layers), (own, 1)]
    whitenings = _fit_each(feat, smiles, Path(corpus), list(dict.fromkeys(specs)), rel_tol,
                           progress)  # fmt: skip
    n_used = len(smiles) - feat.last_report.n_failed
    source = {"corpus": Path(corpus).name, "corpus_sha256": file_sha256(Path(corpus)),
              "rows": n_used, "rel_tol": rel_tol,
              "rank": {spec: w.rank for spec, w in whitenings.items()}}  # fmt: skip
    settings = (chosen, default, chosen_layers) if default else (own, False, own_layers)
    if target is None:
        _store(folder.path, whitenings, source, *settings)
    else:
        _store_copy(folder.path, target, whitenings, source, *settings)
    return source | {"folder": str(target or folder.path), "default": default, "pooling": chosen,
                     "layers": chosen_layers}  # fmt: skip


def _whitening_target(folder: Path, out: str | Path | None) -> Path | None:
    """Where ``smiexlm whiten`` may write: ``out`` (a new or empty folder outside the package),
    or None for ``folder`` itself, unless it is a shipped model."""
    if out is None:
        if is_shipped(folder):
            raise DataError(f"model {str(folder)!r} is shipped with smiexlm and is read-only: "
                            "pass --out DIR to write a whitened copy of it there")  # fmt: skip
        return None
    target = check_output(out, "--out", kind="folder")
    if is_shipped(target):
        raise DataError(f"--out {str(target)!r} is inside the package's shipped models, which "
                        "are read-only: expected a folder of your own")  # fmt: skip
    if target.is_dir() and any(target.iterdir()):
        raise DataError(f"--out {str(target)!r} is a folder with files in it: expected a new "
                        f"or empty folder for the whitened copy of {str(folder)!r}")  # fmt: skip
    return target


def _store(folder: Path, whitenings, source, pooling: str, default: bool, layers: int) -> None:
    save_whitening(folder, whitenings, source)
    write_embedding(folder, pooling, whiten=default, layers=layers)


def _store_copy(folder: Path, target: Path, whitenings, source, *settings) -> None:
    """A full copy of ``folder`` in ``target`` with the new whitening; it appears complete
    or not at all."""
    with atomic_dir(target) as tmp:
        shutil.copytree(folder, tmp, dirs_exist_ok=True)
        _store(tmp, whitenings, source, *settings)
