"""Build a SMILES vocabulary from corpus files (``smiexlm vocab build``)."""

from __future__ import annotations

import csv
import gzip
import io
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tqdm import tqdm

from smiexlm.errors import DataError, InvalidSmilesError
from smiexlm.tokenizer.smiles import SmilesTokenizer, split_smiles
from smiexlm.tokenizer.special import SPECIAL_TOKENS

SMILES_COLUMN_NAMES = ("smiles", "SMILES", "Smiles", "mol", "canonical_smiles")


def _open_text(path: Path) -> io.TextIOBase:
    if not path.is_file():
        raise DataError(f"input file {str(path)!r} does not exist")
    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115
    return io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")


def iter_corpus_smiles(path: Path, smiles_col: str | None = None) -> Iterator[str]:
    """SMILES of a .smi/.txt (first field per line) or .csv/.tsv file (named column)."""
    path = Path(path)
    kind = path.name.removesuffix(".gz").rsplit(".", 1)[-1].lower()
    with _open_text(path) as handle:
        if kind in ("csv", "tsv"):
            reader = csv.DictReader(handle, delimiter="\t" if kind == "tsv" else ",")
            columns = reader.fieldnames or []
            col = smiles_col or next((c for c in SMILES_COLUMN_NAMES if c in columns), None)
            if col not in columns:
                raise DataError(
                    f"{path.name}: SMILES column {col or smiles_col!r} not found; "
                    f"expected one of the columns {columns[:10]!r} (use --smiles-col)"
                )
            for row in reader:
                yield row[col].strip()
        else:
            for line in handle:
                fields = line.split()
                if fields:
                    yield fields[0]


def build_vocabulary(
    inputs: list[Path],
    smiles_col: str | None = None,
    min_freq: int = 1,
    max_size: int | None = None,
    with_canonical: bool = False,
) -> tuple[SmilesTokenizer, str]:
    """Count tokens over ``inputs`` and return the tokenizer plus a readable report.

    SMILES that do not tokenize are counted and left out (never silently)."""
    counts: Counter[str] = Counter()
    n_in = n_bad = n_uncanonical = 0
    canonical = _canonicalizer() if with_canonical else None
    for path in inputs:
        for s in tqdm(iter_corpus_smiles(path, smiles_col), desc=Path(path).name, unit=" mol"):
            n_in += 1
            try:
                counts.update(split_smiles(s))
            except InvalidSmilesError:
                n_bad += 1
                continue
            if canonical is not None:
                c = canonical(s)
                if c is None:
                    n_uncanonical += 1
                elif c != s:
                    counts.update(split_smiles(c))
    tok = SmilesTokenizer.from_counts(counts, min_freq, max_size)
    kept = tok.tokens[len(SPECIAL_TOKENS) :]
    total = sum(counts.values())
    covered = sum(counts[t] for t in kept)
    report = (
        f"{n_in:,} SMILES read, {n_bad:,} not tokenizable (left out)"
        + (f", {n_uncanonical:,} rejected by RDKit" if with_canonical else "")
        + f"\n{len(counts):,} distinct tokens, {tok.vocab_size:,} in the vocabulary "
        f"(incl. {len(SPECIAL_TOKENS)} special); token coverage {covered / max(total, 1):.4%}"
    )
    return tok, report


def _canonicalizer():
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")

    def canonical(smiles: str) -> str | None:
        mol = Chem.MolFromSmiles(smiles)
        return Chem.MolToSmiles(mol) if mol is not None else None

    return canonical
