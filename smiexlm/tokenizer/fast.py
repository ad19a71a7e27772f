"""Vectorised SMILES-to-ids encoding for whole chunks of molecules.

The tokenizer's regex costs several microseconds per molecule in Python, which alone would
cap a corpus run far below the pipeline's target. Almost every SMILES token is one byte; the
exceptions are ``Br``, ``Cl``, ``%nn`` ring bonds, ``>>`` and bracket atoms ``[...]``. So a
chunk is joined into one byte array, token starts are found with numpy masks, single-byte
tokens are looked up in a 256-entry table, and only bracket atoms go through a dict.

Exactness comes first: any SMILES with a byte the fast path does not fully understand (a
stray ``]``, an unclosed ``[``, a ``[`` inside brackets, non-ASCII text, ...) is handed to
``SmilesTokenizer.encode``, the reference. On construction the encoder compares itself with
the tokenizer on a probe set and falls back to the reference path entirely if they differ.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from smiexlm.errors import InvalidSmilesError

# Bytes that are a whole token on their own (regex alternatives of one character).
_SINGLE = "BCNOSPFIbcnosp()\\/.=#-+:~@?>*$0123456789"
_PROBES = [
    "CCO",
    "c1ccccc1Br",
    "ClC(Cl)Cl",
    "C[C@@H](N)C(=O)O",
    "[NH4+].[Cl-]",
    "C%12CC%12",
    "O=C(O)c1ccc[nH]1",
    "F/C=C/F",
    "[2H]C([2H])([2H])B(O)O",
    "CC>>CO",
    "C>C",
    "[Se][MASK]",
    "[Zz]Cc1ccsc1",
    "C#N",
    "*CC*",
    "B1CC1",
    "BrCBr",
    "CCl.CBr",
]


@dataclass
class EncodedChunk:
    """Ids of the SMILES of one chunk that could be tokenized.

    ``ok`` (n,) bool: False = untokenizable. ``ids`` (sum of lengths,) uint16 with BOS ... EOS
    per molecule, concatenated in input order over the ok rows; ``lengths`` (n_ok,) int64."""

    ok: np.ndarray
    ids: np.ndarray
    lengths: np.ndarray


class ChunkEncoder:
    """Encode lists of SMILES exactly like ``tokenizer.encode`` but for a chunk at a time."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.bos, self.eos, self.unk = tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id
        n_special = 5
        # Special tokens spelled in a SMILES are unknown, as in the tokenizer.
        lookup = {t: i for t, i in tokenizer.vocab.items() if i >= n_special}
        self._bytes_vocab = {t.encode("utf-8"): i for t, i in lookup.items()}
        self._lut = np.full(256, -1, dtype=np.int32)  # -1 = not a token start on its own
        for ch in _SINGLE:
            self._lut[ord(ch)] = lookup.get(ch, self.unk)
        self._lut[ord("%")] = 0  # resolved below from the two digits
        self._br = lookup.get("Br", self.unk)
        self._cl = lookup.get("Cl", self.unk)
        self._arrow = lookup.get(">>", self.unk)
        self._ring = np.array([lookup.get(f"%{i:02d}", self.unk) for i in range(100)])
        self.fast = True
        if not self._agrees(_PROBES):
            warnings.warn(
                "the vectorised SMILES encoder disagrees with the tokenizer on a probe set; "
                "using the tokenizer's exact (slower) path",
                stacklevel=2,
            )
            self.fast = False

    # ------------------------------------------------------------------ reference path
    def _exact(self, smiles: str) -> np.ndarray | None:
        try:
            return np.asarray(self.tokenizer.encode(smiles), dtype=np.uint16)
        except InvalidSmilesError:
            return None

    def _agrees(self, probes: list[str]) -> bool:
        got = self.encode(probes)
        want = [self._exact(s) for s in probes]
        if got.ok.tolist() != [w is not None for w in want]:
            return False
        ref = [w for w in want if w is not None]
        ref_ids = np.concatenate(ref) if ref else np.zeros(0, np.uint16)
        return np.array_equal(got.ids, ref_ids) and got.lengths.tolist() == [len(w) for w in ref]

    # ------------------------------------------------------------------ chunk path
    def encode(self, smiles: list[str]) -> EncodedChunk:
        n = len(smiles)
        if not self.fast or n == 0:
            return self._encode_exact(smiles, np.ones(n, dtype=bool))
        joined = "\n".join(smiles) + "\n"
        if not joined.isascii() or joined.count("\n") != n:
            # Rare: let the reference tokenizer decide about non-ASCII text or embedded newlines.
            slow = np.array([not s.isascii() or "\n" in s for s in smiles], dtype=bool)
            if slow.all():
                return self._encode_exact(smiles, slow)
            return self._merge(smiles, slow)
        return self._encode_fast(joined.encode("ascii"), smiles)

    def _encode_fast(self, data: bytes, smiles: list[str]) -> EncodedChunk:
        n = len(smiles)
        b = np.frombuffer(data, dtype=np.uint8)
        nl = b == 10
        sid = np.cumsum(nl, dtype=np.int32) - nl  # (N,) row of each byte; "\n" ends its row
        br = _brackets(b, nl)
        outside = ~br.inside & ~nl
        cont, bad = _continuations(b, outside, br.bad)
        lut = self._lut[b]
        starts = outside & ~cont
        bad |= starts & (lut < 0)
        bad_rows = np.bincount(sid[bad], minlength=n) > 0  # (n,)
        tokpos = np.flatnonzero((starts | br.start | nl) & ~bad_rows[sid])
        tid = self._token_ids(data, b, lut, cont, tokpos, br)
        tok_sid = sid[tokpos]
        firsts = np.flatnonzero(np.r_[True, tok_sid[1:] != tok_sid[:-1]]) if len(tok_sid) else []
        ids = np.insert(tid, firsts, self.bos).astype(np.uint16)
        lengths = np.bincount(tok_sid, minlength=n)[~bad_rows] + 1
        chunk = EncodedChunk(~bad_rows, ids, lengths.astype(np.int64))
        if bad_rows.any():  # the reference tokenizer decides about the odd rows
            return self._merge(smiles, bad_rows, chunk)
        return chunk

    def _token_ids(self, data: bytes, b, lut, cont, tokpos, br: _Brackets) -> np.ndarray:
        """The id of each token starting at ``tokpos`` (EOS for a row's newline)."""
        size = len(b)
        tid = lut[tokpos].copy()
        tb = b[tokpos]
        nxt = np.minimum(tokpos + 1, size - 1)
        two = cont[nxt] & (tokpos + 1 < size)
        tid[(tb == 66) & two] = self._br
        tid[(tb == 67) & two] = self._cl
        tid[(tb == 62) & two] = self._arrow
        is_pct = tb == 37
        if is_pct.any():
            p = tokpos[is_pct]
            tid[is_pct] = self._ring[(b[p + 1] - 48).astype(np.int64) * 10 + (b[p + 2] - 48)]
        tid[tb == 10] = self.eos
        is_br = br.start[tokpos]
        if is_br.any():
            starts_b = tokpos[is_br]
            ends = np.flatnonzero(br.is_close)[br.group[starts_b]]
            get, unk = self._bytes_vocab.get, self.unk
            tid[is_br] = [
                get(data[s : e + 1], unk)
                for s, e in zip(starts_b.tolist(), ends.tolist(), strict=False)
            ]
        return tid

    def _encode_exact(self, smiles: list[str], which: np.ndarray) -> EncodedChunk:
        ok = np.zeros(len(smiles), dtype=bool)
        parts = []
        for i in np.flatnonzero(which).tolist():
            arr = self._exact(smiles[i])
            if arr is not None:
                ok[i] = True
                parts.append(arr)
        ids = np.concatenate(parts) if parts else np.zeros(0, np.uint16)
        return EncodedChunk(ok, ids, np.array([len(p) for p in parts], dtype=np.int64))

    def _merge(
        self, smiles: list[str], slow: np.ndarray, fast: EncodedChunk | None = None
    ) -> EncodedChunk:
        """Rows in ``slow`` via the tokenizer, the others from ``fast`` (computed if None)."""
        if fast is None:
            rest = [s for s, m in zip(smiles, slow.tolist(), strict=False) if not m]
            sub = self.encode(rest)
            fast = EncodedChunk(np.zeros(len(smiles), bool), sub.ids, sub.lengths)
            fast.ok[np.flatnonzero(~slow)[sub.ok]] = True
        pieces = np.split(fast.ids, np.cumsum(fast.lengths)[:-1]) if len(fast.lengths) else []
        by_row = dict(zip(np.flatnonzero(fast.ok).tolist(), pieces, strict=False))
        ok = np.zeros(len(smiles), dtype=bool)
        out = []
        for i in range(len(smiles)):
            arr = self._exact(smiles[i]) if slow[i] else by_row.get(i)
            if arr is not None:
                ok[i] = True
                out.append(arr)
        ids = np.concatenate(out) if out else np.zeros(0, np.uint16)
        return EncodedChunk(ok, ids, np.array([len(a) for a in out], dtype=np.int64))


@dataclass
class _Brackets:
    """Bracket atoms of a chunk's bytes: ``inside`` ("[" and "]" included), ``start`` (their
    "["), ``group`` (bytes between two "]"), ``is_close`` and the ``bad`` bytes (unclosed,
    stray, empty or running over a row end)."""

    inside: np.ndarray
    start: np.ndarray
    group: np.ndarray
    is_close: np.ndarray
    bad: np.ndarray


def _brackets(b: np.ndarray, nl: np.ndarray) -> _Brackets:
    """A bracket atom is the first "[" after the previous "]" up to the next "]" (the regex
    rule); one that runs over a row end is unclosed in one row and stray in the next."""
    size = len(b)
    pos = np.arange(size, dtype=np.int32)
    is_open, is_close = b == 91, b == 93
    group = np.cumsum(is_close, dtype=np.int32) - is_close
    opens = np.flatnonzero(is_open)
    first_open = np.full(int(group[-1]) + 2, size + 1, dtype=np.int32)
    if len(opens):
        g_open = group[opens]
        keep = np.r_[True, g_open[1:] != g_open[:-1]]
        first_open[g_open[keep]] = opens[keep]
    inside = pos >= first_open[group]
    start = inside & is_open & (pos == first_open[group])
    crosses = np.zeros(len(first_open), dtype=bool)
    crosses[group[inside & nl]] = True
    bad = (inside & crosses[group]) | (inside & is_open & ~start)
    bad[:-1] |= start[:-1] & is_close[1:]  # "[]"
    return _Brackets(inside, start, group, is_close, bad)


def _continuations(b: np.ndarray, outside: np.ndarray, bad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Bytes that continue the token before them outside brackets ("Br", "Cl", ">>", "%nn"),
    and ``bad`` with the malformed "%" added."""
    size = len(b)
    pos = np.arange(size, dtype=np.int32)
    cont = np.zeros(size, dtype=bool)
    prev = np.r_[np.uint8(0), b[:-1]]
    prev_out = np.r_[False, outside[:-1]]
    cont |= outside & prev_out & (((b == 114) & (prev == 66)) | ((b == 108) & (prev == 67)))
    gt = outside & (b == 62)  # ">>" pairs up within a run of ">": odd offsets continue
    if gt.any():
        run_start = gt & ~np.r_[False, gt[:-1]]
        start_pos = np.maximum.accumulate(np.where(run_start, pos, 0))
        cont |= gt & ((pos - start_pos) % 2 == 1)
    pct = np.flatnonzero(outside & (b == 37))
    if len(pct):
        d1, d2 = pct + 1, pct + 2
        d1c, d2c = np.minimum(d1, size - 1), np.minimum(d2, size - 1)
        digits = (
            (d2 < size) & (b[d1c] >= 48) & (b[d1c] <= 57) & (b[d2c] >= 48) & (b[d2c] <= 57)
            & outside[d1c] & outside[d2c]
        )  # fmt: skip
        bad[pct[~digits]] = True
        cont[d1c[digits]] = True
        cont[d2c[digits]] = True
    return cont, bad
