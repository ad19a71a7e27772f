"""Per-molecule normalisation and the chunk transform that worker processes run.

A chunk goes through: UTF-8 decoding -> field extraction -> RDKit (length check, parse,
sanitize, optional largest-fragment choice, heavy-atom limit, canonical SMILES with stereo
kept) -> token ids -> 64-bit hash of the final SMILES. Every row either comes out as a
candidate molecule or as a reject with a reason; deduplication happens later, in input order,
in the main process.

With ``canonicalize=False`` and no salt stripping or heavy-atom limit, RDKit is skipped
entirely: the SMILES is kept as written and only the tokenizer validates it (the fast path).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np

from smiexlm.data.readers import split_smiles_line
from smiexlm.errors import ConfigError
from smiexlm.tokenizer.fast import ChunkEncoder

# Whitespace other than the line break: its chunks take the per-line path, which strips.
_NON_NEWLINE_SPACE = re.compile(r"[^\S\n]")

# RDKit's canonical ranking recurses along chains and overflows the C stack (a segfault,
# not an exception, after minutes) near 20,000 atoms, so no SMILES longer than this reaches
# RDKit anywhere in the package. 16 characters for each of 512 model positions: far above
# any real molecule (a featurizer lowers it to 16 x its model's max_positions).
MAX_SMILES_CHARS = 8192

REJECT_REASONS = (
    "empty",
    "non_utf8",
    "too_many_characters",
    "invalid_smiles",
    "untokenizable",
    "too_many_heavy_atoms",
    "too_many_tokens",
)


@dataclass(frozen=True)
class NormalizeConfig:
    """How SMILES are normalised, the one record of it: preprocessing writes a corpus with it
    (:class:`~smiexlm.data.pipeline.PreprocessConfig` extends it), an exported checkpoint
    keeps the steps that rewrite a SMILES (``canonicalize``, ``strip_salts``,
    ``strip_stereo``) in ``normalization.json``, and the featurizer applies the same steps."""

    canonicalize: bool = True  # RDKit canonical SMILES, stereo kept unless strip_stereo
    strip_salts: bool = False  # keep the largest fragment (by heavy atoms)
    strip_stereo: bool = False  # drop tetrahedral and double-bond stereo (isotopes kept)
    max_heavy_atoms: int | None = None  # reject larger molecules; None = no limit
    max_length: int | None = 512  # reject longer molecules (tokens, BOS and EOS included)

    def __post_init__(self) -> None:
        for name in REWRITES:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, getattr(self, name), "true or false")
        if self.max_length is not None and not 3 <= self.max_length <= 65535:
            raise ConfigError("max_length", self.max_length, "an integer in [3, 65535] or None")
        if self.max_heavy_atoms is not None and self.max_heavy_atoms < 1:
            raise ConfigError("max_heavy_atoms", self.max_heavy_atoms, "a positive integer or None")

    @property
    def rewrites(self) -> bool:
        """Whether any step rewrites a SMILES (what serving applies; the limits are not)."""
        return any(getattr(self, name) for name in REWRITES)

    @property
    def needs_rdkit(self) -> bool:
        return self.rewrites or self.max_heavy_atoms is not None


REWRITES = ("canonicalize", "strip_salts", "strip_stereo")  # the steps a model folder records


def text_cells(column):
    """A table column's cells as text (a pandas Series of str): a missing cell (NaN, None,
    NA) is "", a blank, where ``astype(str)`` keeps it missing (pandas 3) or spells it."""
    return column.astype(object).where(column.notna(), "").astype(str)


def kept_names(columns: list, written: set[str]) -> dict[str, str]:
    """Each of an input's ``columns`` with its name in an output that also has the ``written``
    columns: its own, or ``input_<name>`` (again while that is taken), so that no input column
    is overwritten by one a job writes."""
    names: dict[str, str] = {}
    for column in columns:
        name = str(column)
        while name in written or name in names.values() or (name != column and name in columns):
            name = f"input_{name}"
        names[column] = name
    return names


def too_long(smiles: str, limit: int = MAX_SMILES_CHARS) -> str | None:
    """The reason "longer than N characters" when ``smiles`` must not reach RDKit, or None."""
    return f"longer than {limit:,} characters" if len(smiles) > limit else None


def text_problem(smiles: str, limit: int = MAX_SMILES_CHARS) -> str | None:
    """Why ``smiles`` must not reach RDKit or the tokenizer (too long, or holding a character
    beyond ASCII, which no SMILES has and RDKit drops unsaid at the end of one: ``CCÖ`` reads
    as ``CC``), or None."""
    if reason := too_long(smiles, limit):
        return reason
    if not smiles.isascii():
        place, char = next((i, c) for i, c in enumerate(smiles) if not c.isascii())
        try:
            char.encode("utf-8")
        except UnicodeEncodeError:
            return "not valid Unicode text (lone surrogate)"
        return f"a character beyond ASCII, {char!r} at position {place} (a SMILES is ASCII)"
    return None


def smiles_problem(smiles: str) -> str | None:
    """Why RDKit cannot read ``smiles`` (empty, too long, whitespace inside, unparsable), or
    None when it can. RDKit reads ``c1ccccc1 Cl`` as benzene: a space inside is refused here,
    not left to it."""
    from rdkit import Chem, rdBase

    if not smiles:
        return "empty"
    if reason := text_problem(smiles):
        return reason
    if any(c.isspace() for c in smiles.strip()):
        return "whitespace inside the SMILES"
    with rdBase.BlockLogs():  # the reason goes to the caller's report, not to stderr
        return None if Chem.MolFromSmiles(smiles) is not None else "RDKit cannot parse it"


def normalize_smiles(smiles: str, config: NormalizeConfig) -> tuple[str | None, str | None]:
    """``(smiles, None)`` after RDKit normalisation, or ``(None, reason)``."""
    from rdkit import Chem

    if too_long(smiles):
        return None, "too_many_characters"
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return None, "invalid_smiles"
    if config.strip_salts and "." in smiles:
        fragments = Chem.GetMolFrags(mol, asMols=True, sanitizeFrags=False)
        # Largest by heavy atoms; the first one wins ties, so the choice is deterministic.
        mol = max(fragments, key=lambda frag: frag.GetNumHeavyAtoms())
    if config.max_heavy_atoms is not None and mol.GetNumHeavyAtoms() > config.max_heavy_atoms:
        return None, "too_many_heavy_atoms"
    if config.strip_stereo:
        Chem.RemoveStereochemistry(mol)
    if not config.canonicalize:
        rewritten = config.strip_salts or config.strip_stereo
        return (Chem.MolToSmiles(mol, canonical=False) if rewritten else smiles), None
    return Chem.MolToSmiles(mol, isomericSmiles=True), None


_CANONICAL = NormalizeConfig(max_length=None)


def canonical_smiles(smiles: str) -> str | None:
    """RDKit canonical SMILES with stereo kept, as preprocessing writes it; None when RDKit
    cannot parse ``smiles``. RDKit's own parse warnings are silenced."""
    from rdkit import RDLogger

    RDLogger.DisableLog("rdApp.*")
    return normalize_smiles(smiles, _CANONICAL)[0]


def smiles_hashes(smiles: list[str]) -> np.ndarray:
    """(n,) uint64: the first 8 bytes of blake2b of each UTF-8 SMILES (stable across runs)."""
    digests = b"".join(hashlib.blake2b(s.encode(), digest_size=8).digest() for s in smiles)
    return np.frombuffer(digests, dtype="<u8").copy()


@dataclass
class ChunkResult:
    """One processed chunk. Arrays cover the candidate rows, in input order."""

    n_rows: int
    rows: np.ndarray  # (n,) int64 index of each candidate within the chunk
    ids: np.ndarray  # (sum lengths,) uint16, BOS ... EOS per candidate
    lengths: np.ndarray  # (n,) int64
    hashes: np.ndarray  # (n,) uint64
    rejects: list[tuple[int, str, str]]  # (row in chunk, input, reason)
    smiles: list[str] = field(default_factory=list)  # (n,) final SMILES of each candidate


def undecoded(text: str) -> bool:
    """Whether ``text`` holds the lone surrogates that stand for bytes a reader could not
    decode as UTF-8 (``errors="surrogateescape"``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _decode_rows(items: list) -> tuple[list[str | None], list[tuple[int, str, str]]]:
    """Raw values -> SMILES strings (None where rejected)."""
    rejects: list[tuple[int, str, str]] = []
    out: list[str | None] = []
    if items and isinstance(items[0], bytes):
        blob = b"".join(items)
        try:
            text = blob.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is not None and not _NON_NEWLINE_SPACE.search(text):
            fields = text.split("\n")
            if blob.endswith(b"\n"):
                fields.pop()
            values: list = fields if len(fields) == len(items) else items
        else:
            values = items
    else:
        values = items
    for i, raw in enumerate(values):
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError:
                shown = raw.decode("utf-8", "backslashreplace").strip()
                rejects.append((i, shown, "non_utf8"))
                out.append(None)
                continue
            # Stripped, then the text before the first space or tab (a name may follow).
            raw, _ = split_smiles_line(raw)
        elif raw is None:
            raw = ""
        else:
            if undecoded(raw):
                shown = raw.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                rejects.append((i, shown.strip(), "non_utf8"))
                out.append(None)
                continue
            raw = raw.strip()
            if any(c.isspace() for c in raw):
                rejects.append((i, raw, "invalid_smiles"))
                out.append(None)
                continue
        if not raw:
            rejects.append((i, raw, "empty"))
            out.append(None)
        elif not raw.isascii():  # no SMILES has one; RDKit drops a last one unsaid
            rejects.append((i, raw, "invalid_smiles"))
            out.append(None)
        else:
            out.append(raw)
    return out, rejects


def process_chunk(items: list, config: NormalizeConfig, encoder: ChunkEncoder) -> ChunkResult:
    """Decode, normalise, encode and hash one chunk of raw rows."""
    values, rejects = _decode_rows(items)
    rows: list[int] = []
    smiles: list[str] = []
    for i, value in enumerate(values):
        if value is None:
            continue
        if config.needs_rdkit:
            norm, reason = normalize_smiles(value, config)  # checks the length first
            if norm is None:
                rejects.append((i, value, reason or "invalid_smiles"))
                continue
            value = norm
        rows.append(i)
        smiles.append(value)
    encoded = encoder.encode(smiles)
    ok = encoded.ok.copy()
    lengths = encoded.lengths
    ids = encoded.ids
    for j in np.flatnonzero(~ok).tolist():
        rejects.append((rows[j], _original(values, rows[j]), "untokenizable"))
    if config.max_length is not None and len(lengths) and lengths.max() > config.max_length:
        long = lengths > config.max_length
        ok_rows = np.flatnonzero(ok)
        for j in ok_rows[long].tolist():
            rejects.append((rows[j], _original(values, rows[j]), "too_many_tokens"))
        ids = ids[np.repeat(~long, lengths)]
        lengths = lengths[~long]
        ok[ok_rows[long]] = False
    kept = np.flatnonzero(ok)
    rows_arr = np.asarray(rows, dtype=np.int64)[kept]
    final = [smiles[j] for j in kept.tolist()]
    hashes = smiles_hashes(final)
    rejects.sort()
    return ChunkResult(len(items), rows_arr, ids, lengths, hashes, rejects, final)


def _original(values: list[str | None], row: int) -> str:
    return values[row] or ""
