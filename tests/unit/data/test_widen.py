"""The widening steps, the exclusion key and the coverage figures, on small molecules."""

from __future__ import annotations

import random

import pytest
from rdkit import Chem

from smiexlm.chemistry.coverage import CorpusRange, measure_coverage, molecule_facts
from smiexlm.data.widen.brics import FragmentPool, fragments, recombine
from smiexlm.data.widen.charges import (
    COUNTER_IONS,
    charge_states,
    net_charge,
    protonate_step,
    salt,
    salt_step,
)
from smiexlm.data.widen.chem import finish, heavy_atoms, step_rng, vocabulary_tokens
from smiexlm.data.widen.elements import element_step, vocabulary_elements
from smiexlm.data.widen.exclusion import evaluation_key
from smiexlm.data.widen.steps import STEPS, WidenConfig, Widener
from smiexlm.data.widen.variants import stereo_step, tautomer_step
from smiexlm.errors import ConfigError

# Drug-like molecules with BRICS bonds, halogens, sulfur, stereo centres and ionisable groups.
MOLECULES = [
    "CC(C)Cc1ccc(C(C)C(=O)O)cc1",  # ibuprofen: an acid
    "CN(C)CCCN1c2ccccc2CCc2ccc(Cl)cc21",  # clomipramine: a tertiary amine, a chloride
    "COc1ccc2[nH]cc(CCNC(C)=O)c2c1",  # melatonin
    "O=C(NCc1ccccc1)c1ccc(Br)s1",  # an amide, a thiophene, a bromide
    "CC(C)(C)c1ccc(S(=O)(=O)N2CCCC2)cc1",  # a sulfonamide, a quaternary carbon
    "CC(O)C(=O)Nc1ccc(OCC(C)O)cc1F",  # two stereo centres left open
    "Oc1ccc(C(=O)CC(=O)c2ccccc2)cc1",  # a 1,3-diketone: tautomers
    "CCOC(=O)c1ccncc1",  # a pyridine
]
TOKENS = vocabulary_tokens()


def _mols():
    return [Chem.MolFromSmiles(s) for s in MOLECULES]


def _pool(mols):
    pool = FragmentPool()
    own = [fragments(m) for m in mols]
    for pieces in own:
        for piece in pieces:
            pool.add(piece)
    return pool, own


def _run_all(step, n=3, seed=0):
    """{input SMILES: [product SMILES]} of ``step`` (a function of mol, rng, n)."""
    return {s: [Chem.MolToSmiles(p) for p in step(m, step_rng(seed, i, "t"), n).products]
            for i, (s, m) in enumerate(zip(MOLECULES, _mols(), strict=True))}  # fmt: skip


STEP_FUNCTIONS = [protonate_step, salt_step, tautomer_step, stereo_step, element_step]


@pytest.mark.parametrize("step", STEP_FUNCTIONS, ids=lambda f: f.__name__)
def test_every_product_parses_sanitises_and_tokenizes(step):
    products = [p for i, m in enumerate(_mols()) for p in step(m, random.Random(i), 3).products]
    assert products, f"{step.__name__} made nothing from the test molecules"
    for product in products:
        smiles, _, reason = finish(product, TOKENS)
        assert reason is None, (Chem.MolToSmiles(product), reason)
        assert Chem.MolFromSmiles(smiles) is not None


@pytest.mark.parametrize("step", STEP_FUNCTIONS, ids=lambda f: f.__name__)
def test_seeded_steps_repeat_and_seeds_matter(step):
    assert _run_all(step, seed=3) == _run_all(step, seed=3)


def test_brics_products_are_larger_valid_and_seeded():
    mols = _mols()
    pool, own = _pool(mols)

    def grow(seed):
        made = [recombine(own[i], pool, step_rng(seed, i, "brics"), 20, 60)
                for i in range(len(mols)) if own[i]]  # fmt: skip
        return [Chem.MolToSmiles(p) if p is not None else r for p, r in made]

    first = grow(0)
    assert first == grow(0)
    assert first != grow(1)
    products = [finish(Chem.MolFromSmiles(s), TOKENS)[1] for s in first
                if Chem.MolFromSmiles(s) is not None]  # fmt: skip
    assert len(products) >= len(mols) // 2
    mean_in = sum(heavy_atoms(m) for m in mols) / len(mols)
    mean_out = sum(heavy_atoms(p) for p in products) / len(products)
    assert mean_out > mean_in
    assert all(20 <= heavy_atoms(p) <= 60 for p in products)


def test_protonation_charges_an_amine_and_an_acid_at_ph_7_4():
    amine = charge_states(Chem.MolFromSmiles("CCN(CC)CC"))[0]
    acid = charge_states(Chem.MolFromSmiles("CC(=O)O"))[0]
    assert Chem.MolToSmiles(amine) == "CC[NH+](CC)CC"
    assert Chem.MolToSmiles(acid) == "CC(=O)[O-]"
    # neutral groups stay neutral: an amide, a phenol, a pyridine
    for smiles in ("CC(=O)NC", "Oc1ccccc1", "c1ccncc1"):
        states = charge_states(Chem.MolFromSmiles(smiles))
        assert all(net_charge(s) == 0 for s in states), smiles
    # a piperazine takes one proton, not two (a charge within three bonds)
    assert Chem.MolToSmiles(charge_states(Chem.MolFromSmiles("CN1CCN(C)CC1"))[0]).count("+") == 1
    assert protonate_step(Chem.MolFromSmiles("CCCC"), random.Random(0), 1).skipped


def test_salts_are_charge_balanced():
    made = []
    for i, mol in enumerate(_mols()):
        made += salt_step(mol, random.Random(i), 4).products
    assert len(made) >= 8
    for product in made:
        assert net_charge(product) == 0
        assert len(Chem.GetMolFrags(product)) >= 2
    ions = {Chem.MolToSmiles(Chem.MolFromSmiles(s)): z for _, s, z, _ in COUNTER_IONS}
    assert len(ions) == len(COUNTER_IONS)
    divalent = salt(Chem.MolFromSmiles("CC(=O)[O-]"), ("calcium", "[Ca+2]", 2, 12.6))
    assert Chem.MolToSmiles(divalent) == "CC(=O)[O-].CC(=O)[O-].[Ca+2]"
    assert salt(Chem.MolFromSmiles("CC[NH3+]"), ("sodium", "[Na+]", 1, 14.0)) is None


def test_element_substitutions_bring_elements_the_corpus_lacks():
    found = set()
    for i, mol in enumerate(_mols()):
        for product in element_step(mol, random.Random(i), 10).products:
            smiles, _, reason = finish(product, TOKENS)
            assert reason is None
            found |= {a.GetSymbol() for a in Chem.MolFromSmiles(smiles).GetAtoms()}
    assert {"I", "Se", "Si", "B", "P"} <= found
    assert {"I", "Se", "Si", "B", "P", "Na", "K"} <= set(vocabulary_elements(TOKENS))


def test_exclusion_key_ignores_stereo_charge_salt_and_tautomer():
    key = evaluation_key(Chem.MolFromSmiles("CC(N)C(=O)O"))
    for variant in ("C[C@H]([NH3+])C(=O)[O-]", "CC(N)C(=O)[O-].[Na+]", "CC([NH3+])C(=O)O.[Cl-]"):
        assert evaluation_key(Chem.MolFromSmiles(variant)) == key, variant
    pyridone = evaluation_key(Chem.MolFromSmiles("O=c1cccc[nH]1"))
    assert pyridone == evaluation_key(Chem.MolFromSmiles("Oc1ccccn1"))
    assert evaluation_key(Chem.MolFromSmiles("CC(N)C(=O)OC")) != key


def test_widener_drops_products_in_the_exclusion_set():
    rows = list(enumerate(MOLECULES, start=1))
    config = WidenConfig(per_molecule=2)
    first = Widener(config, TOKENS, frozenset()).widen_block(rows)
    products = [s for s, name in first.lines if "." in name]
    assert products
    keys = frozenset(evaluation_key(Chem.MolFromSmiles(s)) for s in products)
    inputs = {evaluation_key(Chem.MolFromSmiles(s)) for s in MOLECULES}
    second = Widener(config, TOKENS, keys - inputs).widen_block(rows)
    written = {evaluation_key(Chem.MolFromSmiles(s)) for s, _ in second.lines}
    assert not written & (keys - inputs)
    assert sum(c.excluded for c in second.steps.values()) > 0
    assert {r[3] for r in second.rejects if r[1] != "input"} >= {"in_evaluation_set"}


def test_widener_rejects_bad_rows_and_evaluation_inputs():
    rows = [(1, MOLECULES[0]), (2, "C1CC"), (3, ""), (4, MOLECULES[1])]
    excluded = frozenset({evaluation_key(Chem.MolFromSmiles(MOLECULES[1]))})
    result = Widener(WidenConfig(), TOKENS, excluded).widen_block(rows)
    assert [(r[0], r[3]) for r in result.rejects if r[1] == "input"] == [
        (2, "invalid_smiles"), (3, "empty"), (4, "in_evaluation_set")]  # fmt: skip
    assert result.lines[0] == (Chem.MolToSmiles(Chem.MolFromSmiles(MOLECULES[0])), "1")


@pytest.mark.parametrize("field,value", [("steps", ("brics", "nope")), ("per_molecule", 0),
                                         ("steps", ("salts", "salts")), ("min_heavy", 70)])  # fmt: skip
def test_config_names_the_bad_field(field, value):
    with pytest.raises(ConfigError, match=field):
        WidenConfig(**{field: value})
    assert set(STEPS) == {"brics", "protonate", "salts", "tautomers", "stereo", "elements"}


def test_coverage_matches_a_count_by_hand():
    smiles = ["CCO", "CC[NH3+].[Cl-]", "c1ccccc1Br", "C" * 30, "O=P(O)(O)O", "not a smiles"]
    limits = CorpusRange(min_weight=40.0, max_weight=150.0, max_heavy_atoms=10)
    got = measure_coverage("x", smiles, limits, corpus_elements={"C", "O", "N"})
    # by hand: weights 46.07, 81.59, 157.01, 422.82, 98.00; heavy 3, 4, 7, 30, 5
    assert (got.n, got.n_invalid) == (5, 1)
    assert got.pct_charged == pytest.approx(20.0)
    assert got.pct_multi_component == pytest.approx(20.0)
    assert got.pct_outside_weight == pytest.approx(40.0)
    assert got.pct_over_heavy_atoms == pytest.approx(20.0)
    assert got.elements == ["C", "N", "O", "P", "Cl", "Br"]
    assert got.missing_elements == ["P", "Cl", "Br"]
    assert molecule_facts("CC[NH3+].[Cl-]").weight == pytest.approx(81.545, abs=0.01)


def test_coverage_of_clintox_matches_a_count_from_the_text():
    """Charged and several-component shares of a real set against a count on the text of
    RDKit's SMILES (a sign inside a bracket atom, a dot): two routes to the same figures.
    RDKit's text, not the file's: sanitisation charge-separates some hypervalent atoms
    (ClinTox's perchloric acid ``OCl(=O)(=O)=O`` becomes ``O=[Cl+3]([O-])([O-])O``)."""
    import os
    import re
    from pathlib import Path

    from smiexlm.data.readers import iter_smiles

    root = os.environ.get("SMIEXLM_DATA")
    if not root or not (Path(root) / "moleculenet" / "clintox.csv").is_file():
        pytest.fail(f"SMIEXLM_DATA={root!r}: this test needs moleculenet/clintox.csv")
    smiles = list(iter_smiles(Path(root) / "moleculenet" / "clintox.csv"))
    got = measure_coverage("clintox", smiles, CorpusRange(0, 1e9, 10**6))
    parsed = [Chem.MolToSmiles(m) for m in map(Chem.MolFromSmiles, smiles) if m is not None]
    signed = re.compile(r"\[[^\]]*[+-][^\]]*\]")
    assert got.n == len(parsed)
    assert got.pct_charged == pytest.approx(100 * sum(bool(signed.search(s)) for s in parsed)
                                            / len(parsed))  # fmt: skip
    assert got.pct_multi_component == pytest.approx(100 * sum("." in s for s in parsed)
                                                    / len(parsed))  # fmt: skip
    assert got.pct_outside_weight == 0.0 and got.pct_over_heavy_atoms == 0.0
