"""The newcomer's demo (``smiexlm demo``): a fixed panel of well-known drugs, embedded, and each
one's nearest neighbour by cosine similarity next to its nearest neighbour by ECFP4 Tanimoto
similarity.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from smiexlm.chemistry.fingerprints import tanimoto_matrix
from smiexlm.embedding.featurizer import Featurizer

# name, SMILES, family (members of a family share a scaffold or a mode of action)
DRUG_PANEL: list[tuple[str, str, str]] = [
    ("aspirin", "CC(=O)Oc1ccccc1C(=O)O", "salicylates"),
    ("salicylic acid", "OC(=O)c1ccccc1O", "salicylates"),
    ("caffeine", "Cn1cnc2c1c(=O)n(C)c(=O)n2C", "xanthines"),
    ("theophylline", "Cn1c2nc[nH]c2c(=O)n(C)c1=O", "xanthines"),
    ("ibuprofen", "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "profens"),
    ("naproxen", "COc1ccc2cc(ccc2c1)[C@H](C)C(=O)O", "profens"),
    ("diclofenac", "OC(=O)Cc1ccccc1Nc1c(Cl)cccc1Cl", "NSAID"),
    ("paracetamol", "CC(=O)Nc1ccc(O)cc1", "anilides"),
    ("lidocaine", "CCN(CC)CC(=O)Nc1c(C)cccc1C", "anilides"),
    ("penicillin G", "CC1(C)S[C@@H]2[C@H](NC(=O)Cc3ccccc3)C(=O)N2[C@H]1C(=O)O", "penicillins"),
    (
        "amoxicillin",
        "CC1(C)S[C@@H]2[C@H](NC(=O)[C@H](N)c3ccc(O)cc3)C(=O)N2[C@H]1C(=O)O",
        "penicillins",
    ),
    ("morphine", "CN1CC[C@]23c4c5ccc(O)c4O[C@H]2[C@@H](O)C=C[C@H]3[C@H]1C5", "opioids"),
    ("codeine", "CN1CC[C@]23c4c5ccc(OC)c4O[C@H]2[C@@H](O)C=C[C@H]3[C@H]1C5", "opioids"),
    ("diazepam", "CN1C(=O)CN=C(c2ccccc2)c2cc(Cl)ccc21", "benzodiazepines"),
    ("alprazolam", "Cc1nnc2n1-c1ccc(Cl)cc1C(c1ccccc1)=NC2", "benzodiazepines"),
    ("fluoxetine", "CNCCC(Oc1ccc(cc1)C(F)(F)F)c1ccccc1", "SSRIs"),
    ("sertraline", "CN[C@H]1CC[C@@H](c2ccc(Cl)c(Cl)c2)c2ccccc21", "SSRIs"),
    ("dopamine", "NCCc1ccc(O)c(O)c1", "monoamines"),
    ("serotonin", "NCCc1c[nH]c2ccc(O)cc12", "monoamines"),
    ("nicotine", "CN1CCC[C@H]1c1cccnc1", "alkaloids"),
    ("metformin", "CN(C)C(=N)NC(=N)N", "biguanides"),
]


@dataclass
class DemoResult:
    names: list[str]
    families: list[str]
    embeddings: np.ndarray  # (n, d)
    neighbours: list[int]  # nearest other molecule by cosine similarity of embeddings
    cosine: list[float]
    ecfp_neighbours: list[int]  # nearest other molecule by ECFP4 Tanimoto similarity
    tanimoto: list[float]
    source: str

    @property
    def family_hits(self) -> int:
        """Molecules whose embedding neighbour is from the same family."""
        return sum(self.families[i] == self.families[j] for i, j in enumerate(self.neighbours))

    @property
    def ecfp_family_hits(self) -> int:
        return sum(self.families[i] == self.families[j] for i, j in enumerate(self.ecfp_neighbours))


def cosine_matrix(x: np.ndarray) -> np.ndarray:
    """(n, d) -> (n, n) cosine similarities."""
    unit = x / np.linalg.norm(x, axis=1, keepdims=True).clip(min=1e-12)
    return unit @ unit.T


def nearest(sim: np.ndarray) -> tuple[list[int], list[float]]:
    """Each row's most similar other row of the (n, n) ``sim``, and that similarity."""
    sim = sim.copy()
    np.fill_diagonal(sim, -np.inf)
    best = sim.argmax(axis=1)
    return best.tolist(), sim[np.arange(len(sim)), best].tolist()


def run_demo(checkpoint: Path | None = None, device: str = "auto") -> DemoResult:
    """Embed :data:`DRUG_PANEL` and find each molecule's nearest neighbour."""
    feat = Featurizer.from_pretrained(checkpoint, device=device)
    names, smiles, families = (list(column) for column in zip(*DRUG_PANEL, strict=True))
    emb = feat.featurize(smiles)  # (n, d)
    nn, cos = nearest(cosine_matrix(emb))
    ecfp_nn, tan = nearest(tanimoto_matrix(smiles))
    source = "default model" if checkpoint is None else str(checkpoint)
    return DemoResult(names, families, emb, nn, cos, ecfp_nn, tan, source)


def format_demo(result: DemoResult) -> str:
    """The demo as text: each molecule's two nearest neighbours, then the family hits."""
    n, d = result.embeddings.shape
    width = max(map(len, result.names))
    col = max(width + 9, 27)
    lines = [
        f"Embedded {n} drug molecules with {result.source}: array of shape ({n}, {d})",
        "",
        f"{'molecule':<{width}}  {'nearest (embedding cosine)':<{col}}  nearest (ECFP4 Tanimoto)",
    ]
    for i, name in enumerate(result.names):
        emb = f"{result.names[result.neighbours[i]]} ({result.cosine[i]:.3f})"
        fp = f"{result.names[result.ecfp_neighbours[i]]} ({result.tanimoto[i]:.2f})"
        lines.append(f"{name:<{width}}  {emb:<{col}}  {fp}")
    lines += [
        "",
        f"Nearest neighbour from the same drug family: embeddings {result.family_hits}/{n}, "
        f"ECFP4 {result.ecfp_family_hits}/{n}",
    ]
    return "\n".join(lines)
