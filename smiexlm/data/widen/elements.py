"""Elements the shipped vocabulary holds and a corpus lacks, by one chemically sensible
substitution per product.

:data:`SUBSTITUTIONS` (the first atom of each SMARTS is the one changed):

- ``iodo``: a halogen on carbon becomes iodine (I);
- ``selenium``: a thioether or thiophene sulfur (bound to two carbons) becomes selenium (Se);
- ``silicon``: an sp3 carbon bound to four carbons (or three and one hydrogen) becomes
  silicon (Si, [SiH]);
- ``boronic_acid``: a halogen on an aromatic carbon becomes a boronic acid, B(OH)2 (B);
- ``phosphorus``: a sulfonyl sulfur becomes a phosphoryl with one OH, P(=O)(OH) (P): a
  sulfonamide becomes a phosphonamidic acid, a sulfone a phosphinic acid.

Other elements of the vocabulary (Na, K, Ca, Mg) come in as counter-ions of the salts step;
metals and metalloids that have no such route (Sn, Hg, As, Pt, ...) are left alone.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import Any

from smiexlm.data.widen.chem import StepResult

_ORGANIC = {"B", "C", "N", "O", "P", "S", "F", "Cl", "Br", "I", "b", "c", "n", "o", "p", "s"}
_BRACKET = re.compile(r"^\[\d*([A-Za-z][a-z]?)")


def vocabulary_elements(tokens: Iterable[str]) -> list[str]:
    """The element symbols spelled by ``tokens`` (organic-subset atoms, bracket atoms of any
    isotope or charge, aromatic ones capitalised), in atomic-number order."""
    from rdkit import Chem

    table = Chem.GetPeriodicTable()
    found = set()
    for token in tokens:
        match = _BRACKET.match(token)
        symbol = match.group(1) if match else token if token in _ORGANIC else None
        if symbol is None:
            continue
        symbol = symbol[0].upper() + symbol[1:]
        try:
            if table.GetAtomicNumber(symbol) > 0:
                found.add(symbol)
        except RuntimeError:  # not an element ("[*]")
            continue
    return sorted(found, key=table.GetAtomicNumber)


def _set_element(number: int, hydrogens: int | None = None) -> Callable[[Any, int], None]:
    def change(mol: Any, index: int) -> None:
        atom = mol.GetAtomWithIdx(index)
        atom.SetAtomicNum(number)
        if hydrogens is not None:
            atom.SetNumExplicitHs(hydrogens)
            atom.SetNoImplicit(True)

    return change


def _boronic_acid(mol: Any, index: int) -> None:
    from rdkit import Chem

    mol.GetAtomWithIdx(index).SetAtomicNum(5)
    for _ in range(2):
        oxygen = mol.AddAtom(Chem.Atom(8))
        mol.AddBond(index, oxygen, Chem.BondType.SINGLE)


def _phosphoryl(mol: Any, index: int) -> None:
    from rdkit import Chem

    atom = mol.GetAtomWithIdx(index)
    atom.SetAtomicNum(15)
    double = [b for b in atom.GetBonds() if b.GetBondType() == Chem.BondType.DOUBLE]
    double[0].SetBondType(Chem.BondType.SINGLE)  # one S=O becomes P-OH


SUBSTITUTIONS: dict[str, tuple[str, Callable[[Any, int], None]]] = {
    "iodo": ("[F,Cl,Br;X1]-[#6]", _set_element(53)),
    "selenium": ("[#16;D2;+0;!$([#16]~[!#6])]", _set_element(34)),
    "silicon": ("[CX4;D4;+0]([#6])([#6])([#6])[#6]", _set_element(14, 0)),
    "silicon_h": ("[CX4;D3;H1;+0]([#6])([#6])[#6]", _set_element(14, 1)),
    "boronic_acid": ("[Cl,Br,I;X1]-c", _boronic_acid),
    "phosphorus": ("[SX4;+0](=O)(=O)([#6])[#6,#7]", _phosphoryl),
}


@lru_cache(maxsize=1)
def _patterns() -> dict[str, Any]:
    from rdkit import Chem

    return {name: Chem.MolFromSmarts(smarts) for name, (smarts, _) in SUBSTITUTIONS.items()}


def element_sites(mol: Any) -> list[tuple[str, int]]:
    """``(substitution, atom index)`` of every place one of :data:`SUBSTITUTIONS` applies."""
    return [
        (name, match[0])
        for name, pattern in _patterns().items()
        for match in mol.GetSubstructMatches(pattern)
    ]


def substitute(mol: Any, name: str, index: int) -> Any:
    """``mol`` with substitution ``name`` made at atom ``index`` (not sanitised)."""
    from rdkit import Chem

    out = Chem.RWMol(mol)
    SUBSTITUTIONS[name][1](out, index)
    return out.GetMol()


def element_step(mol: Any, rng: random.Random, n: int) -> StepResult:
    """Up to ``n`` products of ``mol``, each with one substitution at a distinct site."""
    sites = element_sites(mol)
    if not sites:
        return StepResult(skipped="no_substitution_site")
    chosen = rng.sample(sites, min(n, len(sites)))
    return StepResult(products=[substitute(mol, name, index) for name, index in chosen])
