"""How much of a set of molecules a pretraining corpus covers: elements, charges, salts, size.

For one SMILES source (a corpus sample, a MoleculeNet set) :func:`measure_coverage` counts

- the elements present (every atom RDKit keeps, hydrogen only when written as an atom),
- the share charged (any atom with a formal charge, zwitterions included),
- the share with several components (salts, mixtures: a ``.`` in the molecule),
- the share whose molecular weight (average, all components, implicit hydrogens included)
  lies outside the corpus's range, and the share with more heavy atoms (all components)
  than the corpus's maximum,

against a :class:`CorpusRange` measured on a corpus sample (:func:`corpus_range`) or given.
Molecules RDKit cannot parse are counted (``n_invalid``) and left out of every share.
Shares are percentages of the parsed molecules.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from smiexlm.errors import DataError


@dataclass(frozen=True)
class MoleculeFacts:
    """What coverage needs of one molecule."""

    elements: frozenset[str]
    charged: bool
    components: int
    weight: float  # average molecular weight, all components
    heavy_atoms: int  # all components


@dataclass(frozen=True)
class CorpusRange:
    """The size range of a corpus: molecular weight ``[min_weight, max_weight]`` and the
    largest heavy-atom count. Molecules outside it are what the corpus never showed."""

    min_weight: float
    max_weight: float
    max_heavy_atoms: int

    def __post_init__(self) -> None:
        if not 0 <= self.min_weight <= self.max_weight:
            raise DataError(
                f"corpus weight range [{self.min_weight}, {self.max_weight}]: expected "
                "0 <= min_weight <= max_weight"
            )
        if self.max_heavy_atoms < 1:
            raise DataError(f"max_heavy_atoms {self.max_heavy_atoms}: expected at least 1")


@dataclass
class Coverage:
    """Coverage figures of one SMILES source (percentages of its parsed molecules)."""

    name: str
    n: int  # parsed molecules
    n_invalid: int
    elements: list[str]
    pct_charged: float
    pct_multi_component: float
    pct_outside_weight: float
    pct_over_heavy_atoms: float
    missing_elements: list[str] = field(default_factory=list)  # not in the corpus


def molecule_facts(smiles: str) -> MoleculeFacts | None:
    """The :class:`MoleculeFacts` of ``smiles``, or None when RDKit cannot parse it."""
    from rdkit import Chem, RDLogger
    from rdkit.Chem import Descriptors

    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    if mol is None:
        return None
    atoms = list(mol.GetAtoms())
    return MoleculeFacts(
        elements=frozenset(a.GetSymbol() for a in atoms),
        charged=any(a.GetFormalCharge() != 0 for a in atoms),
        components=len(Chem.GetMolFrags(mol)),
        weight=Descriptors.MolWt(mol),
        heavy_atoms=sum(a.GetAtomicNum() > 1 for a in atoms),
    )


def corpus_range(facts: Iterable[MoleculeFacts]) -> CorpusRange:
    """The weight range and the largest heavy-atom count of ``facts`` (at least one)."""
    facts = list(facts)
    if not facts:
        raise DataError("corpus sample has no parsable molecule: expected at least one")
    weights = [f.weight for f in facts]
    return CorpusRange(min(weights), max(weights), max(f.heavy_atoms for f in facts))


def summarize(
    name: str,
    facts: Sequence[MoleculeFacts],
    n_invalid: int,
    limits: CorpusRange,
    corpus_elements: Iterable[str] = (),
) -> Coverage:
    """The :class:`Coverage` of parsed ``facts`` against ``limits`` and ``corpus_elements``."""
    n = len(facts)

    def pct(count: int) -> float:
        return 100.0 * count / n if n else float("nan")

    elements = set().union(*(f.elements for f in facts)) if facts else set()
    outside = sum(not limits.min_weight <= f.weight <= limits.max_weight for f in facts)
    return Coverage(
        name=name,
        n=n,
        n_invalid=n_invalid,
        elements=sorted(elements, key=_element_order),
        pct_charged=pct(sum(f.charged for f in facts)),
        pct_multi_component=pct(sum(f.components > 1 for f in facts)),
        pct_outside_weight=pct(outside),
        pct_over_heavy_atoms=pct(sum(f.heavy_atoms > limits.max_heavy_atoms for f in facts)),
        missing_elements=sorted(elements - set(corpus_elements), key=_element_order),
    )


def collect_facts(smiles: Iterable[str]) -> tuple[list[MoleculeFacts], int]:
    """``(facts of the parsable molecules, number that did not parse)``."""
    facts, invalid = [], 0
    for text in smiles:
        fact = molecule_facts(text)
        if fact is None:
            invalid += 1
        else:
            facts.append(fact)
    return facts, invalid


def measure_coverage(
    name: str,
    smiles: Iterable[str],
    limits: CorpusRange,
    corpus_elements: Iterable[str] = (),
) -> Coverage:
    """Coverage of the molecules ``smiles`` against a corpus's ``limits`` and elements."""
    facts, invalid = collect_facts(smiles)
    return summarize(name, facts, invalid, limits, corpus_elements)


def _element_order(symbol: str) -> tuple[int, str]:
    """Organic elements first (C, H, N, O, ...), then by atomic number."""
    from rdkit import Chem

    return Chem.GetPeriodicTable().GetAtomicNumber(symbol), symbol


def corpus_table(rows: Sequence[tuple[Coverage, CorpusRange]]) -> str:
    """A Markdown table of corpora: size, elements, charged and salt shares, size range."""
    lines = [
        "| corpus | molecules | unparsed | elements | charged % | several components % | "
        "weight range | max heavy atoms |",
        "|---|---:|---:|---|---:|---:|---|---:|",
    ]
    for cov, lim in rows:
        lines.append(
            f"| {cov.name} | {cov.n:,} | {cov.n_invalid} | {' '.join(cov.elements)} | "
            f"{cov.pct_charged:.1f} | {cov.pct_multi_component:.1f} | "
            f"{lim.min_weight:.0f}-{lim.max_weight:.0f} | {lim.max_heavy_atoms} |"
        )
    return "\n".join(lines) + "\n"


def comparison_table(before: Sequence[Coverage], after: Sequence[Coverage]) -> str:
    """A Markdown table of evaluation sets against a corpus ``before`` and ``after`` widening
    (the same sets in the same order, measured against each corpus)."""
    lines = [
        "| set | molecules | charged % | several components % | weight outside range % "
        "(before → after) | heavy atoms > max % (before → after) | elements the corpus lacks "
        "(before) | (after) |",
        "|---|---:|---:|---:|---|---|---|---|",
    ]
    for old, new in zip(before, after, strict=True):
        lines.append(
            f"| {old.name} | {old.n:,} | {old.pct_charged:.1f} | {old.pct_multi_component:.1f} | "
            f"{old.pct_outside_weight:.1f} → {new.pct_outside_weight:.1f} | "
            f"{old.pct_over_heavy_atoms:.1f} → {new.pct_over_heavy_atoms:.1f} | "
            f"{len(old.missing_elements)}: {' '.join(old.missing_elements) or '-'} | "
            f"{len(new.missing_elements)}: {' '.join(new.missing_elements) or '-'} |"
        )
    return "\n".join(lines) + "\n"
