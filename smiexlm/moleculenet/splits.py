"""Train/valid/test splits: deterministic scaffold (DeepChem-equal), random, balanced scaffold.

``scaffold_split`` reproduces DeepChem's ``ScaffoldSplitter`` assignment exactly: molecules are
grouped by Bemis–Murcko scaffold SMILES (without chirality unless ``chiral=True``), groups are
ordered by (size, smallest member index) descending, and each group goes to train while it
fits under ``frac_train * n``, else to valid while it fits under ``(frac_train + frac_valid) *
n``, else to test. ``n`` counts every input, parsable or not; unparsable SMILES get no split.
It takes no seed because it has none; ``balanced_scaffold_split`` and ``random_split`` do.

A user's table may carry its own split (a time split, a cluster split, a project's fixed
test set): ``column:NAME`` reads it from the table's column NAME, whose cells say ``train``,
``valid`` or ``test`` (:func:`column_split`, :meth:`MoleculeTask.split`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from smiexlm.errors import ConfigError, DataError, check_fraction
from smiexlm.paths import cache_dir, keep_in_cache

SplitKind = Literal["scaffold", "scaffold_chiral", "balanced_scaffold", "random"]
SPLIT_KINDS: tuple[str, ...] = ("scaffold", "scaffold_chiral", "balanced_scaffold", "random")
COLUMN = "column:"  # "column:fold": the table's own split, in its column "fold"
PARTS = ("train", "valid", "test")


def check_split_kind(kind: object, field: str = "split") -> str:
    """``kind`` when it names a split (one of :data:`SPLIT_KINDS`, or ``column:NAME``)."""
    if isinstance(kind, str) and (kind in SPLIT_KINDS or (kind.startswith(COLUMN) and kind[len(COLUMN):])):  # fmt: skip
        return kind
    raise ConfigError(field, kind, f"one of {', '.join(SPLIT_KINDS)}, or column:NAME (the "
                      "table's own split, in its column NAME)")  # fmt: skip


def split_column(kind: str) -> str | None:
    """The column a ``column:NAME`` split reads, or None for the computed kinds."""
    return kind[len(COLUMN) :] if kind.startswith(COLUMN) else None


Indices = list[int]


@dataclass(frozen=True)
class Split:
    """A named split; ``seed`` is None for the deterministic kinds."""

    kind: str
    seed: int | None
    train: Indices
    valid: Indices
    test: Indices

    @property
    def sizes(self) -> tuple[int, int, int]:
        return len(self.train), len(self.valid), len(self.test)

    @property
    def label(self) -> str:
        return self.kind if self.seed is None else f"{self.kind}(seed={self.seed})"


def _check_fracs(frac_train: float, frac_valid: float) -> None:
    if not (0 < frac_train < 1 and 0 <= frac_valid < 1 and frac_train + frac_valid <= 1):
        raise ConfigError(
            "frac_train/frac_valid",
            (frac_train, frac_valid),
            "0 < frac_train < 1, 0 <= frac_valid, frac_train + frac_valid <= 1",
        )


def murcko_scaffolds(
    smiles_list: Sequence[str], chiral: bool = False, use_cache: bool = True
) -> list[str | None]:
    """Bemis–Murcko scaffold SMILES per molecule (None where RDKit cannot parse it).

    Results are cached on disk under ``cache_dir()/scaffolds/`` keyed by the SMILES list, the
    chirality flag and the RDKit version, because large sets (MUV: 93k molecules) take ~40 s.
    """
    from rdkit import Chem, RDLogger, rdBase
    from rdkit.Chem.Scaffolds.MurckoScaffold import MurckoScaffoldSmiles

    key = hashlib.sha256(
        "\n".join([rdBase.rdkitVersion, str(chiral), *smiles_list]).encode()
    ).hexdigest()[:32]
    path = cache_dir() / "scaffolds" / f"{key}.json"
    if use_cache and path.is_file():
        cached = json.loads(path.read_text())
        if len(cached) == len(smiles_list):
            return cached
    RDLogger.DisableLog("rdApp.*")
    scaffolds: list[str | None] = []
    for smiles in smiles_list:
        mol = Chem.MolFromSmiles(smiles)
        scaffolds.append(
            None if mol is None else MurckoScaffoldSmiles(mol=mol, includeChirality=chiral)
        )
    if use_cache and len(smiles_list) >= 5000:
        keep_in_cache(path, lambda tmp: tmp.write_text(json.dumps(scaffolds)))
    return scaffolds


def scaffold_sets(scaffolds: Sequence[str | None]) -> list[Indices]:
    """Indices grouped by scaffold, largest group first (ties: later first member first)."""
    groups: dict[str, Indices] = {}
    for index, scaffold in enumerate(scaffolds):
        if scaffold is not None:
            groups.setdefault(scaffold, []).append(index)
    return sorted(groups.values(), key=lambda g: (len(g), g[0]), reverse=True)


def scaffold_split(
    smiles_list: Sequence[str],
    frac_train: float = 0.8,
    frac_valid: float = 0.1,
    chiral: bool = False,
) -> tuple[Indices, Indices, Indices]:
    """Deterministic Bemis–Murcko scaffold split, equal to DeepChem's ``ScaffoldSplitter``."""
    _check_fracs(frac_train, frac_valid)
    n = len(smiles_list)
    train_cut, valid_cut = frac_train * n, (frac_train + frac_valid) * n
    train: Indices = []
    valid: Indices = []
    test: Indices = []
    for group in scaffold_sets(murcko_scaffolds(smiles_list, chiral)):
        if len(train) + len(group) <= train_cut:
            train += group
        elif len(train) + len(valid) + len(group) <= valid_cut:
            valid += group
        else:
            test += group
    return train, valid, test


def balanced_scaffold_split(
    smiles_list: Sequence[str],
    seed: int,
    frac_train: float = 0.8,
    frac_valid: float = 0.1,
) -> tuple[Indices, Indices, Indices]:
    """Seeded scaffold split: whole scaffold groups, in a random order per seed.

    Groups bigger than half the valid/test size are placed first (in shuffled order) so that
    they land in train, then the small groups in shuffled order fill train, valid and test up
    to their target sizes. Scores on this split run higher than on ``scaffold``; never compare
    the two.
    """
    _check_fracs(frac_train, frac_valid)
    n = len(smiles_list)
    n_train, n_valid = frac_train * n, frac_valid * n
    half_eval = min(n_valid, n - n_train - n_valid) / 2
    groups = scaffold_sets(murcko_scaffolds(smiles_list))
    rng = np.random.default_rng(seed)
    big = [g for g in groups if len(g) > half_eval]
    small = [g for g in groups if len(g) <= half_eval]
    order = [big[i] for i in rng.permutation(len(big))] + [
        small[i] for i in rng.permutation(len(small))
    ]
    train: Indices = []
    valid: Indices = []
    test: Indices = []
    for group in order:
        if len(train) + len(group) <= n_train:
            train += group
        elif len(valid) + len(group) <= n_valid:
            valid += group
        else:
            test += group
    return sorted(train), sorted(valid), sorted(test)


def random_split(
    n: int, seed: int, frac_train: float = 0.8, frac_valid: float = 0.1
) -> tuple[Indices, Indices, Indices]:
    """Uniformly random split of ``range(n)`` (sizes floor(frac * n), rest to test)."""
    _check_fracs(frac_train, frac_valid)
    order = np.random.default_rng(seed).permutation(n)
    a, b = int(frac_train * n), int((frac_train + frac_valid) * n)
    return sorted(order[:a].tolist()), sorted(order[a:b].tolist()), sorted(order[b:].tolist())


def make_split(
    smiles_list: Sequence[str],
    kind: str = "scaffold",
    seed: int = 0,
    frac_train: float = 0.8,
    frac_valid: float = 0.1,
) -> Split:
    """One of ``SPLIT_KINDS`` by name; the seed is used (and recorded) only where it matters."""
    if kind == "scaffold":
        return Split(kind, None, *scaffold_split(smiles_list, frac_train, frac_valid))
    if kind == "scaffold_chiral":
        return Split(kind, None, *scaffold_split(smiles_list, frac_train, frac_valid, True))
    if kind == "balanced_scaffold":
        parts = balanced_scaffold_split(smiles_list, seed, frac_train, frac_valid)
        return Split(kind, seed, *parts)
    if kind == "random":
        return Split(kind, seed, *random_split(len(smiles_list), seed, frac_train, frac_valid))
    if split_column(check_split_kind(kind)):
        raise ConfigError("split", kind, "a table read with its split column (read_task(..., "
                          "split_col=...), or --data with --split column:NAME)")  # fmt: skip
    raise AssertionError(kind)  # every kind is handled above


def column_split(kind: str, parts: Sequence[str]) -> Split:
    """The ``column:NAME`` split whose molecules' parts are ``parts`` (one of :data:`PARTS`
    each, as :func:`read_parts` checked them)."""
    part_of = np.asarray(parts, dtype=object)
    return Split(kind, None, *(np.flatnonzero(part_of == p).tolist() for p in PARTS))


VALID_FROM_TRAIN = 0.1  # the share of train carved as valid where a split column has none


def carve_valid(smiles: Sequence[str], parts: Sequence[str], fraction: float = VALID_FROM_TRAIN,
                seed: int = 0) -> tuple[list[str], str]:  # fmt: skip
    """``parts`` with about ``fraction`` of its ``train`` molecules made ``valid``, and how
    they were drawn: whole scaffold groups in a seeded order (:func:`balanced_scaffold_split`
    of the train molecules), so the validation molecules are new scaffolds to the model as the
    test molecules are; at random (seeded) where the train molecules share too few scaffolds
    for any group to fit. ``test`` rows are left alone."""
    check_fraction("--valid-from-train", fraction)
    train = [i for i, p in enumerate(parts) if p == "train"]
    train_smiles = [smiles[i] for i in train]
    _, valid, _ = balanced_scaffold_split(train_smiles, seed, 1.0 - fraction, fraction)
    how = f"by scaffold, seed {seed}"
    if not valid:
        _, valid, _ = random_split(len(train), seed, 1.0 - fraction, fraction)
        how = f"at random, seed {seed}: too few scaffolds for a group to fit"
    carved = list(parts)
    for j in valid:
        carved[train[j]] = "valid"
    return carved, how


def row_name(row: int, first_line: int | None) -> str:
    """How an error names data row ``row`` (from 0): its line in a text file whose first data
    row is line ``first_line``; its row (from 0) where there are no lines (Parquet)."""
    return f"row {row}" if first_line is None else f"line {int(row) + first_line}"


def read_parts(
    column: Sequence[object], name: str, where: str, first_line: int | None = 2
) -> list[str]:
    """The cells of a split column as ``train``/``valid``/``test`` (any case, spaces around
    them ignored); DataError naming the first other cell, the column and its line in the file
    (the first data row being ``first_line``; its row from 0 where None: Parquet)."""
    parts = []
    for row, cell in enumerate(column):
        part = cell.strip().lower() if isinstance(cell, str) else None
        if part not in PARTS:
            raise DataError(f"{where}: split column {name!r}, {row_name(row, first_line)}, holds {cell!r}: "
                            f"expected one of {', '.join(PARTS)}")  # fmt: skip
        parts.append(part)
    return parts
