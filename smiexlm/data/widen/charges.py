"""Charged forms at a given pH, and salts with common pharmaceutical counter-ions.

**Protonation.** :data:`SITES` is a fixed table of ionisable groups with a typical pKa
(textbook values for the group, not per molecule). At ``ph`` an acid site is charged when
its pKa is below the pH and a base site when its pKa is above; a site within ``window`` pH
units of its pKa is taken both ways, and the forms are enumerated (dominant form first).
Sites are charged strongest first, and a site is left neutral when a charge of the same sign
already sits within three bonds (a second amine of a piperazine, a second OH of a phosphate).
Groups whose pKa lies far from physiological pH on the neutral side (phenols, anilines,
pyridines, amides) have no entry: they stay neutral.

This table, rather than dimorphite-dl, is the package's choice: dimorphite-dl 2.1 takes about
15-20 ms a molecule on one core (about 9 hours for the 1.6M MOSES molecules), this about
0.3 ms, and the groups that matter for a corpus's charged vocabulary (carboxylates, sulfonates,
phosphates, tetrazoles, ammonium, amidinium, imidazolium) are all here.

**Salts.** :data:`COUNTER_IONS` lists common pharmaceutical counter-ions. A salt is the charged
molecule (its dominant form when it comes in neutral) and counter-ions of the opposite sign in
the smallest whole numbers that balance the charge (two cations and one sulfate; two
carboxylates and one calcium), at most :data:`MAX_COMPONENTS` components.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from smiexlm.data.widen.chem import StepResult


@dataclass(frozen=True)
class Site:
    """An ionisable group: its SMARTS (the first atom is the one charged) and typical pKa."""

    name: str
    smarts: str
    pka: float
    kind: Literal["acid", "base"]


_AMINE = "[NX3;+0;!$(N~[!#6]);!$(N~[#6;!X4])"  # N bound only to sp3 carbons
# Specific entries come before general ones: an atom keeps the first entry that matches it.
SITES: tuple[Site, ...] = (
    Site("sulfonic_acid", "[OX2H1][SX4](=O)=O", -1.0, "acid"),
    Site("phosphonic_acid", "[OX2H1][PX4]=O", 2.0, "acid"),
    Site("carboxylic_acid", "[OX2H1][CX3]=O", 4.0, "acid"),
    Site("acyl_sulfonamide", "[NX3H1]([CX3]=O)[SX4](=O)=O", 4.5, "acid"),
    Site("tetrazole", "[nH1;r5;$([nH1]1nnnc1),$([nH1]1nncn1)]", 4.9, "acid"),
    Site("imide", "[NX3H1]([CX3]=O)[CX3]=O", 9.5, "acid"),
    Site("phenol", "[OX2H1]c", 10.0, "acid"),
    Site("sulfonamide", "[NX3;H1,H2;!$(N[CX3]=O)][SX4](=O)=O", 10.0, "acid"),
    Site(
        "amidine_guanidine",
        "[NX2;+0;!a;!$(N~[!#6;!#1]);!$(N[CX3]=[O,S])]=[CX3;!a][NX3;+0;!a;!$(N[CX3]=[O,S]);!$(NS=O)]",
        12.0,
        "base",
    ),
    Site("morpholine", _AMINE + ";$(N1CCOCC1)]", 7.4, "base"),
    Site("aliphatic_amine", _AMINE + "]", 9.5, "base"),
    Site("imidazole", "[nX2;+0;$([nX2]1:[c;!R2]:[nX3]:[c;!R2]:[c;!R2]:1)]", 7.0, "base"),
    Site("benzimidazole", "[nX2;+0;r5;!$(n:n);!$(n:c:n:n);$(n:c:[nX3])]", 5.5, "base"),
    Site(
        "pyridine",
        "[nX2;+0;r6;!$(n:n);!$(n:c:n);!$(n:c:c:n);!$(n:c-[F,Cl,Br,I,$(C=O),$(C#N)])]",
        5.2,
        "base",
    ),  # fmt: skip
    Site("aniline", "[NX3;H1,H2;+0;$(Nc);!$(N(c)[a,$([#6]=*),!#6])]", 4.6, "base"),
)
# Salt formation needs the acid's pKa at least this far below the base's (the "delta pKa"
# rule of salt screening); a weak base (pKa >= 4) still forms a hydrochloride, a weak acid
# (pKa <= 10) a sodium salt, though neither is charged at pH 7.4.
SALT_DELTA_PKA = 2.0

# name, SMILES, charge, pKa of the acid the anion comes from (of the cation's conjugate acid:
# water for metal ions). Hydrochlorides, sodium salts and the rest of the usual list.
COUNTER_IONS: tuple[tuple[str, str, int, float], ...] = (
    ("chloride", "[Cl-]", -1, -6.0),
    ("bromide", "[Br-]", -1, -9.0),
    ("sulfate", "O=S(=O)([O-])[O-]", -2, 2.0),
    ("hydrogen sulfate", "O=S(=O)([O-])O", -1, -3.0),
    ("mesylate", "CS(=O)(=O)[O-]", -1, -1.9),
    ("tosylate", "Cc1ccc(S(=O)(=O)[O-])cc1", -1, -2.8),
    ("besylate", "O=S(=O)([O-])c1ccccc1", -1, -2.8),
    ("hydrogen maleate", "O=C([O-])/C=C\\C(=O)O", -1, 1.9),
    ("hydrogen fumarate", "O=C([O-])/C=C/C(=O)O", -1, 3.0),
    ("hydrogen succinate", "O=C([O-])CCC(=O)O", -1, 4.2),
    ("hydrogen L-tartrate", "O=C([O-])[C@H](O)[C@@H](O)C(=O)O", -1, 3.0),
    ("dihydrogen citrate", "O=C([O-])CC(O)(CC(=O)O)C(=O)O", -1, 3.1),
    ("dihydrogen phosphate", "O=P([O-])(O)O", -1, 2.1),
    ("acetate", "CC(=O)[O-]", -1, 4.8),
    ("nitrate", "O=[N+]([O-])[O-]", -1, -1.4),
    ("sodium", "[Na+]", 1, 14.0),
    ("potassium", "[K+]", 1, 14.0),
    ("calcium", "[Ca+2]", 2, 12.6),
    ("magnesium", "[Mg+2]", 2, 11.4),
    ("ammonium", "[NH4+]", 1, 9.2),
    ("tromethamine", "[NH3+]C(CO)(CO)CO", 1, 8.1),
)
MAX_COMPONENTS = 4  # molecule copies plus counter-ions in one salt


@lru_cache(maxsize=1)
def _patterns() -> list[tuple[Site, Any]]:
    from rdkit import Chem

    return [(site, Chem.MolFromSmarts(site.smarts)) for site in SITES]


def find_sites(mol: Any) -> list[tuple[int, Site]]:
    """``(atom index, site)`` of every ionisable atom, strongest first (acids by rising pKa,
    then bases by falling pKa); an atom matched by two entries keeps the first."""
    found: dict[int, Site] = {}
    for site, pattern in _patterns():
        for match in mol.GetSubstructMatches(pattern):
            found.setdefault(match[0], site)
    return sorted(found.items(), key=lambda item: (item[1].kind == "base",
                  item[1].pka if item[1].kind == "acid" else -item[1].pka, item[0]))  # fmt: skip


def _neutral(mol: Any) -> Any:
    from rdkit.Chem.MolStandardize import rdMolStandardize

    return rdMolStandardize.Uncharger().uncharge(mol)


def _apply(mol: Any, sites: list[tuple[int, Site]], charged: set[int]) -> Any:
    """``mol`` with the atoms of ``charged`` ionised, skipping one that has a charge of the
    same sign within three bonds of a site ionised before it."""
    from rdkit import Chem

    out = Chem.RWMol(mol)
    distances = Chem.GetDistanceMatrix(mol)
    done: list[tuple[int, int]] = []
    for index, site in sites:
        sign = -1 if site.kind == "acid" else 1
        if index not in charged or any(s == sign and distances[index][i] <= 3 for i, s in done):
            continue
        atom = out.GetAtomWithIdx(index)
        hydrogens = atom.GetTotalNumHs()
        atom.SetFormalCharge(sign)
        atom.SetNumExplicitHs(hydrogens + sign)
        atom.SetNoImplicit(True)
        done.append((index, sign))
    return out.GetMol()


def charge_states(mol: Any, ph: float = 7.4, window: float = 1.0, limit: int = 8) -> list[Any]:
    """Up to ``limit`` protonation states of ``mol`` (neutralised first) at ``ph``, the
    dominant one first; ``[]`` when it has no ionisable site."""
    mol = _neutral(mol)
    sites = find_sites(mol)
    if not sites:
        return []
    dominant = {i for i, s in sites if (s.pka < ph) == (s.kind == "acid")}
    unsure = [i for i, s in sites if abs(s.pka - ph) < window]
    states = []
    for flips in itertools.islice(_subsets(unsure), limit):
        states.append(_apply(mol, sites, dominant ^ set(flips)))
    return states


def _subsets(items: list[int]):
    """Subsets of ``items`` by size: the empty one first, then singles, pairs, ..."""
    for size in range(len(items) + 1):
        yield from itertools.combinations(items, size)


def net_charge(mol: Any) -> int:
    from rdkit import Chem

    return Chem.GetFormalCharge(mol)


def protonate_step(mol: Any, rng: random.Random, n: int, ph: float = 7.4) -> StepResult:
    """Up to ``n`` charged forms of ``mol`` at ``ph`` (the dominant one first when charged)."""
    states = charge_states(mol, ph)
    if not states:
        return StepResult(skipped="no_ionisable_site")
    states = [s for s in states if any(a.GetFormalCharge() for a in s.GetAtoms())]
    if not states:
        return StepResult(skipped="neutral_at_ph")
    return StepResult(products=[states[0], *rng.sample(states[1:], min(n, len(states)) - 1)])


def salt(mol: Any, counter_ion: tuple[str, str, int, float]) -> Any | None:
    """``mol`` (charged, net charge q) with the counter-ion of charge z in the smallest
    balancing numbers; None when the signs do not pair or that needs more than
    :data:`MAX_COMPONENTS` components."""
    from rdkit import Chem

    q, z = net_charge(mol), counter_ion[2]
    if q == 0 or (q > 0) == (z > 0):
        return None
    common = math.gcd(abs(q), abs(z))
    copies, ions = abs(z) // common, abs(q) // common
    if copies + ions > MAX_COMPONENTS:
        return None
    ion = Chem.MolFromSmiles(counter_ion[1])
    out = mol
    for part in [mol] * (copies - 1) + [ion] * ions:
        out = Chem.CombineMols(out, part)
    return out


def salt_forms(mol: Any, ph: float = 7.4) -> list[tuple[Any, float]]:
    """Charged forms of ``mol`` a salt can be made of, each with the pKa that bounds its
    counter-ion (the weakest charged site): its dominant form at ``ph`` when that is
    charged, else its strongest base (pKa >= 4) protonated and its strongest acid
    (pKa <= 10) deprotonated, one site each."""
    mol = _neutral(mol)
    sites = find_sites(mol)
    dominant = {i for i, s in sites if (s.pka < ph) == (s.kind == "acid")}
    choices = [dominant] if dominant else []
    if not dominant:
        bases = [i for i, s in sites if s.kind == "base" and s.pka >= 4.0]
        acids = [i for i, s in sites if s.kind == "acid" and s.pka <= 10.0]
        choices = [{group[0]} for group in (bases, acids) if group]
    forms = []
    pkas = dict(sites)
    for chosen in choices:
        form = _apply(mol, sites, chosen)
        q = net_charge(form)
        charged = [pkas[a.GetIdx()].pka for a in form.GetAtoms()
                   if a.GetFormalCharge() * q > 0 and a.GetIdx() in pkas]  # fmt: skip
        if q and charged:
            forms.append((form, min(charged) if q > 0 else max(charged)))
    return forms


def pairs_with(charge: int, pka: float, counter_ion: tuple[str, str, int, float]) -> bool:
    """Whether a molecule of net ``charge`` whose weakest charged site has ``pka`` forms a
    salt with ``counter_ion``: opposite signs and :data:`SALT_DELTA_PKA` between them."""
    _, _, z, ion_pka = counter_ion
    if charge * z >= 0:
        return False
    delta = pka - ion_pka if charge > 0 else ion_pka - pka
    return delta >= SALT_DELTA_PKA


def salt_step(mol: Any, rng: random.Random, n: int, ph: float = 7.4) -> StepResult:
    """Up to ``n`` salts of ``mol``: a charged form (:func:`salt_forms`) with a counter-ion
    that pairs with it (:func:`pairs_with`), drawn from the table; a molecule already
    charged keeps its charges."""
    forms = [(mol, _charged_pka(mol))] if net_charge(mol) else salt_forms(mol, ph)
    if not forms:
        return StepResult(skipped="no_salt_forming_site")
    result = StepResult()
    for _ in range(n):
        form, pka = rng.choice(forms)
        ions = [c for c in COUNTER_IONS if pairs_with(net_charge(form), pka, c)]
        made = salt(form, rng.choice(ions)) if ions else None
        if made is None:
            result.failures.append("no_pairing_counter_ion" if not ions else "too_many_components")
        else:
            result.products.append(made)
    return result


def _charged_pka(mol: Any) -> float:
    """The pKa bounding the counter-ion of a molecule that comes in charged: that of its
    weakest matched site of the net charge's sign, else a strong one (a quaternary
    ammonium, a sulfonate)."""
    q = net_charge(mol)
    sites = dict(find_sites(_neutral(mol)))
    charged = [sites[a.GetIdx()].pka for a in mol.GetAtoms()
               if a.GetFormalCharge() * q > 0 and a.GetIdx() in sites]  # fmt: skip
    if not charged:
        return 14.0 if q > 0 else 0.0
    return min(charged) if q > 0 else max(charged)
