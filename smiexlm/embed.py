"""Embedding whole files (``smiexlm embed``) and the newcomer's demo (``smiexlm demo``).

``embed_file`` reads a CSV/TSV/Parquet table or a ``.smi`` file, embeds its SMILES column with
a :class:`~smiexlm.featurizer.Featurizer`, and writes either a Parquet table (the kept id
columns, the SMILES, then ``e0 … e{d-1}``) or a ``.npy`` matrix with the id columns beside it
in ``<name>.ids.csv``. Rows that fail are NaN and listed in the returned report.

``run_demo`` embeds a fixed panel of well-known drugs and finds each one's nearest neighbour
by cosine similarity, next to the nearest neighbour by ECFP4 Tanimoto similarity.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from smiexlm.errors import DataError
from smiexlm.featurizer import FeaturizeReport
from smiexlm.fingerprints import tanimoto_matrix

OUT_SUFFIXES = (".parquet", ".npy")

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


# ---------------------------------------------------------------------- embed a file
@dataclass
class EmbedResult:
    out: Path
    n_rows: int
    dim: int
    id_columns: list[str]
    report: FeaturizeReport
    ids_path: Path | None = None


def read_table(path: Path, smiles_col: str) -> Any:
    """A DataFrame from CSV/TSV/Parquet (optionally ``.gz``), or ``.smi`` (SMILES [name])."""
    import pandas as pd

    if not path.is_file():
        raise DataError(f"input {str(path)!r} does not exist")
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(".parquet"):
        frame = pd.read_parquet(path)
    elif name.endswith((".csv", ".tsv")):
        frame = pd.read_csv(path, sep="\t" if name.endswith(".tsv") else ",")
    elif name.endswith((".smi", ".txt")):
        rows = [line.split(None, 1) for line in _read_lines(path) if line.strip()]
        frame = pd.DataFrame(
            {
                smiles_col: [r[0] for r in rows],
                "name": [r[1].strip() if len(r) > 1 else "" for r in rows],
            }
        )
    else:
        raise DataError(
            f"input {str(path)!r}: expected a .csv, .tsv, .parquet or .smi file (optionally .gz)"
        )
    if smiles_col not in frame.columns:
        raise DataError(
            f"input {str(path)!r} has no column {smiles_col!r}: expected one of "
            f"{list(frame.columns)[:20]} (choose it with --smiles-col)"
        )
    return frame


def _read_lines(path: Path) -> list[str]:
    import gzip

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()


def embed_file(
    input_path: Path,
    out: Path,
    smiles_col: str = "smiles",
    id_cols: list[str] | None = None,
    checkpoint: Path | None = None,
    pooling: Literal["cls", "mean", "max"] = "cls",
    errors: Literal["raise", "nan"] = "nan",
    canonicalize: bool = True,
    max_tokens: int = 16384,
    device: str = "auto",
    progress: bool = True,
) -> EmbedResult:
    """Embed the SMILES column of ``input_path`` and write ``out`` (.parquet or .npy).

    ``id_cols`` (default: every column but the SMILES one) are kept beside the embeddings.
    """
    import pandas as pd

    from smiexlm.featurizer import Featurizer

    out = Path(out)
    if out.suffix not in OUT_SUFFIXES:
        raise DataError(f"--out {str(out)!r}: expected a file ending in {OUT_SUFFIXES}")
    frame = read_table(Path(input_path), smiles_col)
    if id_cols is None:
        id_cols = [c for c in frame.columns if c != smiles_col]
    missing = [c for c in id_cols if c not in frame.columns]
    if missing:
        raise DataError(
            f"id columns {missing} are not in the input: expected some of {list(frame.columns)}"
        )
    feat = Featurizer.from_pretrained(checkpoint, device=device)
    emb = feat.featurize(
        frame[smiles_col],
        pooling=pooling,
        errors=errors,
        canonicalize=canonicalize,
        max_tokens=max_tokens,
        progress=progress,
    )  # (n, d)
    out.parent.mkdir(parents=True, exist_ok=True)
    ids_path = None
    kept = frame[[*id_cols, smiles_col]].reset_index(drop=True)
    if out.suffix == ".npy":
        np.save(out, emb)
        if id_cols:
            ids_path = out.with_suffix(".ids.csv")
            kept.to_csv(ids_path, index=False)
    else:
        columns = pd.DataFrame(emb, columns=[f"e{i}" for i in range(emb.shape[1])])
        pd.concat([kept, columns], axis=1).to_parquet(out, index=False)
    return EmbedResult(out, len(frame), emb.shape[1], list(id_cols), feat.last_report, ids_path)


# ---------------------------------------------------------------------- demo
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


def _nearest(sim: np.ndarray) -> tuple[list[int], list[float]]:
    sim = sim.copy()
    np.fill_diagonal(sim, -np.inf)
    best = sim.argmax(axis=1)
    return best.tolist(), sim[np.arange(len(sim)), best].tolist()


def run_demo(checkpoint: Path | None = None, device: str = "auto") -> DemoResult:
    """Embed :data:`DRUG_PANEL` and find each molecule's nearest neighbour."""
    from smiexlm.featurizer import Featurizer

    feat = Featurizer.from_pretrained(checkpoint, device=device)
    names, smiles, families = (list(column) for column in zip(*DRUG_PANEL, strict=True))
    emb = feat.featurize(smiles)  # (n, d)
    nn, cos = _nearest(cosine_matrix(emb))
    ecfp_nn, tan = _nearest(tanimoto_matrix(smiles))
    source = "default model" if checkpoint is None else str(checkpoint)
    return DemoResult(names, families, emb, nn, cos, ecfp_nn, tan, source)


def format_demo(result: DemoResult) -> str:
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
