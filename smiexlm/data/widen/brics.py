"""Larger molecules from corpus fragments: BRICS cuts, seeded recombination at dummy labels.

Each molecule is cut at every BRICS bond (RDKit ``FindBRICSBonds`` / ``BreakBRICSBonds``);
a cut end is a dummy atom whose isotope is its BRICS label. A :class:`FragmentPool` holds the
distinct fragments of a block of molecules (one part of the input), by label.

:func:`recombine` grows one product: it starts from a fragment of the molecule at hand and
draws a heavy-atom target uniformly from ``[min_heavy, max_heavy]``; while the product has an
open cut end it joins a pool fragment whose label BRICS pairs with that end (its bond type is
the one the cut left), taking fragments with further cut ends while under the target and
single-ended caps after. A product that needs more than ``max_joins`` joins, finds no
compatible fragment, or ends outside ``[min_heavy, max_heavy]`` is a failure with that
reason. This is RDKit's ``BRICSBuild`` reorganised for a sampled, bounded output: BRICSBuild
enumerates every combination in a fixed order, which a stream cannot afford.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from smiexlm.data.widen.chem import StepResult

_CAP_ATOMS = 5  # about the heavy atoms of a cap fragment of a drug-like corpus
BRICS_REASONS = ("no_compatible_fragment", "join_cap", "size_out_of_range")


@lru_cache(maxsize=1)
def compatible_labels() -> dict[int, frozenset[int]]:
    """Which BRICS labels may join: ``{label: labels it pairs with}`` from RDKit's rules
    (``7a``/``7b`` are both written as isotope 7)."""
    from rdkit.Chem import BRICS

    pairs: dict[int, set[int]] = {}
    for group in BRICS.reactionDefs:
        for left, right, _bond in group:
            a, b = (int(re.sub(r"\D", "", label)) for label in (left, right))
            pairs.setdefault(a, set()).add(b)
            pairs.setdefault(b, set()).add(a)
    return {label: frozenset(others) for label, others in pairs.items()}


@dataclass(frozen=True)
class Fragment:
    """A BRICS fragment with its cut ends (atom indices), their labels and its heavy atoms."""

    mol: Any
    ends: tuple[int, ...]
    labels: tuple[int, ...]
    heavy: int


def fragments(mol: Any) -> list[Fragment]:
    """The BRICS fragments of ``mol``; ``[]`` when it has no BRICS bond."""
    from rdkit import Chem
    from rdkit.Chem import BRICS

    bonds = list(BRICS.FindBRICSBonds(mol))
    if not bonds:
        return []
    pieces = Chem.GetMolFrags(BRICS.BreakBRICSBonds(mol, bonds), asMols=True)
    return [_fragment(piece) for piece in pieces]


def _fragment(mol: Any) -> Fragment:
    atoms = [(a.GetIdx(), a.GetAtomicNum(), a.GetIsotope()) for a in mol.GetAtoms()]
    ends = tuple(i for i, number, _ in atoms if number == 0)
    labels = tuple(label for _, number, label in atoms if number == 0)
    return Fragment(mol, ends, labels, sum(number > 1 for _, number, _ in atoms))


@dataclass
class FragmentPool:
    """Distinct fragments by BRICS label, split into extenders (two or more cut ends) and
    caps (one). Bounded by ``max_per_label`` per label and kind (first come, first kept)."""

    max_per_label: int = 500
    extenders: dict[int, list[Fragment]] = field(default_factory=dict)
    caps: dict[int, list[Fragment]] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)
    _found: dict[tuple[frozenset[int], bool], list[Fragment]] = field(default_factory=dict)

    def add(self, fragment: Fragment) -> None:
        from rdkit import Chem

        key = Chem.MolToSmiles(fragment.mol)
        if key in self._seen:
            return
        self._seen.add(key)
        self._found.clear()
        kind = self.extenders if len(fragment.ends) > 1 else self.caps
        for label in set(fragment.labels):
            kept = kind.setdefault(label, [])
            if len(kept) < self.max_per_label:
                kept.append(fragment)

    def candidates(self, labels: frozenset[int], grow: bool) -> list[Fragment]:
        """Fragments holding one of ``labels``: extenders when ``grow`` (caps if none), caps
        otherwise (extenders if none)."""
        if (labels, grow) not in self._found:
            first, second = (self.extenders, self.caps) if grow else (self.caps, self.extenders)
            found: list[Fragment] = []
            for kind in (first, second):
                found = [f for label in sorted(labels) for f in kind.get(label, [])]
                if found:
                    break
            self._found[labels, grow] = found
        return self._found[labels, grow]


def _join(product: Fragment, end: int, fragment: Fragment, fragment_end: int) -> Fragment:
    """``product`` with its cut end ``end`` joined to ``fragment``'s ``fragment_end``."""
    from rdkit import Chem

    offset = product.mol.GetNumAtoms()
    both = Chem.RWMol(Chem.CombineMols(product.mol, fragment.mol))
    far = fragment_end + offset
    (bond,) = both.GetAtomWithIdx(end).GetBonds()
    left = bond.GetOtherAtomIdx(end)
    (right,) = [n.GetIdx() for n in both.GetAtomWithIdx(far).GetNeighbors()]
    both.AddBond(left, right, bond.GetBondType())
    both.RemoveAtom(far)
    both.RemoveAtom(end)  # end < far: removing far first keeps end's index
    ends = [(i, lab) for i, lab in zip(product.ends, product.labels, strict=True) if i != end]
    ends += [(i + offset, lab) for i, lab in zip(fragment.ends, fragment.labels, strict=True)
             if i != fragment_end]  # fmt: skip
    moved = [(i - (i > end) - (i > far), lab) for i, lab in ends]
    return Fragment(
        both.GetMol(),
        tuple(i for i, _ in moved),
        tuple(lab for _, lab in moved),
        product.heavy + fragment.heavy,
    )


def _choose(
    pool: FragmentPool,
    labels: frozenset[int],
    product: Fragment,
    target: int,
    max_heavy: int,
    rng: random.Random,
) -> Fragment | None:
    """A fragment to join at one open end: one that leaves room for a cap on every other
    open end below ``target`` when there is one, else below ``max_heavy``."""
    others = _CAP_ATOMS * (len(product.ends) - 1)
    grow = product.heavy + others + _CAP_ATOMS < target
    found = pool.candidates(labels, grow)
    for limit in (target, max_heavy):
        room = limit - product.heavy - others
        fitting = [f for f in found if f.heavy + _CAP_ATOMS * (len(f.ends) - 1) <= room]
        if fitting:
            return rng.choice(fitting)
    return None


def recombine(
    own: list[Fragment],
    pool: FragmentPool,
    rng: random.Random,
    min_heavy: int = 20,
    max_heavy: int = 60,
    max_joins: int = 12,
) -> tuple[Any | None, str | None]:
    """One product grown from a fragment of ``own`` (see the module doc), or a reason."""
    pairs = compatible_labels()
    product = rng.choice(own)
    target = rng.randint(min_heavy, max_heavy)
    for _ in range(max_joins):
        if not product.ends:
            break
        pick = rng.randrange(len(product.ends))
        end, labels = product.ends[pick], pairs.get(product.labels[pick], frozenset())
        fragment = _choose(pool, labels, product, target, max_heavy, rng)
        if fragment is None:
            return None, "no_compatible_fragment"
        joinable = [i for i, lab in zip(fragment.ends, fragment.labels, strict=True)
                    if lab in labels]  # fmt: skip
        product = _join(product, end, fragment, rng.choice(joinable))
    if product.ends:
        return None, "join_cap"
    if not min_heavy <= product.heavy <= max_heavy:
        return None, "size_out_of_range"
    return product.mol, None


def brics_step(
    own: list[Fragment], pool: FragmentPool, rng: random.Random, n: int, **limits: int
) -> StepResult:
    """Up to ``n`` recombined products of a molecule whose fragments are ``own``."""
    if not own:
        return StepResult(skipped="no_brics_bond")
    result = StepResult()
    for _ in range(n):
        product, reason = recombine(own, pool, rng, **limits)
        if product is None:
            result.failures.append(reason or "failed")
        else:
            result.products.append(product)
    return result
