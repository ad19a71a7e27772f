"""Similarity search over a library embedded by ``smiexlm embed --out DIR``.

:func:`build_index` turns a folder of embedding parts into an index folder; a
:class:`SearchIndex` finds each query's ``k`` nearest library molecules by cosine similarity
of the model's embeddings (approximate, HNSW) and, for comparison, by Tanimoto similarity of
ECFP4 fingerprints (exact)::

    IDX/index.json        what was indexed: the embeddings folder, its job and model sha256,
                          pooling and normalisation, row counts, the HNSW parameters, and
                          the size and sha256 of each of the three files below
    IDX/embedding.faiss   HNSW graph over the unit-length embeddings (inner product = cosine);
                          ids are library rows; rows with NaN embeddings are left out
    IDX/ecfp4.npy         (N, 32) uint64: ECFP4 (radius 2, 2,048 bits) of row r, packed;
                          all zeros where RDKit cannot parse the SMILES (never a hit)
    IDX/library.parquet   the library's id columns and SMILES, row r = input row r

Why FAISS (``faiss-cpu``, the ``search`` extra): it is the most widely used nearest-neighbour
library, maintained by Meta with wheels for Linux, macOS and Windows on x86-64 and arm64; its
HNSW index needs no training pass, can be built part by part, is saved as one file and
answers in well under a millisecond at library scale, and the same API offers compressed
(IVF-PQ) and GPU indexes for when a library outgrows memory. usearch is lighter but younger;
hnswlib has had no release since 2023.

Loading an index checks the size and sha256 of each of its files against ``index.json``
first, so that a truncated or damaged file gives an error naming it, never wrong neighbours.
sha256 runs at 0.5-1 GB/s on one core of a shared 2-core EPYC, a little faster than FAISS
reads its index file (measured on a 496 MiB flat index: 0.7-1.1 s against 1.1-1.5 s). A
1M-molecule index of 384-wide embeddings is about 2 GB (1.5 GB of vectors and 0.25 GB of
links in ``embedding.faiss``, 0.25 GB of fingerprints), so the check adds 2-4 s to loading it;
a query batch shares one load. The shipped model's embedding is 1152 wide (three blocks), so
its vectors take three times that; ``smiexlm embed --layers 1`` embeds the last block alone,
384 wide.

ECFP4 search is exact: the query's packed bits are ANDed with the library's and counted
(``popcount``) block by block, ``|a & b| / (|a| + |b| - |a & b|)``, the Tanimoto similarity
RDKit's ``BulkTanimotoSimilarity`` gives, at a few milliseconds per query per 100k molecules.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from smiexlm.atomic import atomic_dir
from smiexlm.chemistry.fingerprints import ECFP4_BITS, ecfp4_packed
from smiexlm.data.normalize import kept_names
from smiexlm.errors import ConfigError, DataError, InvalidSmilesError, check_positive_int
from smiexlm.model.pooling import last_blocks
from smiexlm.paths import check_output, file_problem, file_record, read_json_file

INDEX_FORMAT = "smiexlm-search-index/1"
INDEX_JSON = "index.json"
EMBEDDING_FILE = "embedding.faiss"
ECFP4_FILE = "ecfp4.npy"
LIBRARY_FILE = "library.parquet"
INDEX_FILES = (EMBEDDING_FILE, ECFP4_FILE, LIBRARY_FILE)  # each recorded (size, sha256)
WORDS = ECFP4_BITS // 64  # uint64 words per packed fingerprint
BLOCK_ROWS = 1 << 16  # library rows per popcount block: 16 MiB of temporaries per query
By = Literal["embedding", "ecfp4", "both"]
_BY = ("embedding", "ecfp4", "both")
HIT_COLUMNS = ("query_index", "query", "by", "rank", "score", "row")  # before the library's


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise DataError(
            "similarity search needs FAISS: expected the package faiss-cpu, installed with "
            "`pip install 'smiexlm[search]'`"
        ) from None
    return faiss


# ---------------------------------------------------------------------- fingerprints
def popcount(words: np.ndarray) -> np.ndarray:
    """Set bits per row of a (n, w) uint64 array, as int32."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(words).sum(axis=1, dtype=np.int32)
    return np.unpackbits(words.view(np.uint8), axis=1).sum(axis=1, dtype=np.int32)


# ---------------------------------------------------------------------- building
@dataclass
class IndexInfo:
    out: Path
    n_rows: int
    n_embedded: int  # rows in the HNSW graph (finite embeddings)
    n_fingerprinted: int  # rows with an ECFP4 fingerprint
    seconds: dict[str, float]


def build_index(
    embeddings: Path,
    out: Path,
    m: int = 32,
    ef_construction: int = 100,
    progress: bool = True,
) -> IndexInfo:
    """Index the complete folder of embedding parts ``embeddings`` into the folder ``out``.

    ``m`` (graph degree) and ``ef_construction`` (candidates kept while inserting) are FAISS's
    HNSW parameters: larger gives better recall for a slower build and a larger graph. The
    folder is written under a temporary name and renamed into place when complete.
    """
    from smiexlm.parts.reading import part_files, read_manifest

    faiss = _faiss()
    for name, value in (("m", m), ("ef_construction", ef_construction)):
        if not isinstance(value, int) or value < 2:
            raise ConfigError(name, value, "an integer of at least 2")
    manifest = read_manifest(Path(embeddings))
    if manifest["kind"] != "embed":
        raise DataError(f"{str(embeddings)!r} holds {manifest['kind']} parts: expected the "
                        "output of `smiexlm embed --out DIR`")  # fmt: skip
    files = part_files(Path(embeddings))  # each checked (size, sha256) before any work
    out = check_output(out, "--out", kind="folder")
    ecols = [c for c in manifest["columns"] if re.fullmatch(r"e\d+", c)]
    n, dim = manifest["n_rows"], len(ecols)
    bar = _bar(progress, n)
    with atomic_dir(out) as tmp:
        graph = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = ef_construction
        index = faiss.IndexIDMap2(graph)
        n_fp, seconds = _add_parts(files, manifest, ecols, index, tmp, bar)
        faiss.write_index(index, str(tmp / EMBEDDING_FILE))
        recorded = {name: file_record(tmp / name) for name in INDEX_FILES}
        doc = {"format": INDEX_FORMAT, "embeddings": str(Path(embeddings).resolve()),
               "job": manifest["job"], "model": manifest["model"], "settings": manifest["settings"],
               "n_rows": n, "dim": dim, "n_embedded": int(index.ntotal), "n_fingerprinted": n_fp,
               "hnsw": {"m": m, "ef_construction": ef_construction}, "ecfp4": {"radius": 2,
               "bits": ECFP4_BITS}, "build_seconds": {k: round(v, 2) for k, v in seconds.items()},
               "files": recorded}  # fmt: skip
        (tmp / INDEX_JSON).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    if bar is not None:
        bar.close()
    return IndexInfo(out, n, int(doc["n_embedded"]), n_fp, seconds)


def _add_parts(
    files: list[Path], manifest: dict, ecols: list[str], index: Any, tmp: Path, bar: Any
) -> tuple[int, dict[str, float]]:
    """Each part into the graph (finite rows, L2-normalised), its ECFP4 bits into the
    memory-mapped matrix and its id columns and SMILES into the library table; the number of
    fingerprinted rows and the seconds spent on each kind."""
    from pyarrow import parquet as pq

    faiss = _faiss()
    smiles_col, id_cols = manifest["settings"]["smiles_col"], manifest["settings"]["id_cols"]
    fps = np.lib.format.open_memmap(tmp / ECFP4_FILE, mode="w+", dtype=np.uint64,
                                    shape=(manifest["n_rows"], WORDS))  # fmt: skip
    seconds = {"embedding": 0.0, "ecfp4": 0.0}
    writer, start, n_fp = None, 0, 0
    for table in map(pq.read_table, files):
        rows = np.arange(start, start + table.num_rows, dtype=np.int64)
        t = time.perf_counter()
        vectors = np.column_stack([table[c].to_numpy() for c in ecols]).astype(np.float32)
        finite = np.isfinite(vectors).all(axis=1)
        vectors = np.ascontiguousarray(vectors[finite])  # (n_part, d)
        faiss.normalize_L2(vectors)
        index.add_with_ids(vectors, rows[finite])
        seconds["embedding"] += time.perf_counter() - t
        t = time.perf_counter()
        fps[start : start + table.num_rows] = ecfp4_packed(table[smiles_col].to_pylist())
        n_fp += int((popcount(fps[start : start + table.num_rows]) > 0).sum())
        seconds["ecfp4"] += time.perf_counter() - t
        library = table.select([*id_cols, smiles_col])
        if writer is None:
            writer = pq.ParquetWriter(tmp / LIBRARY_FILE, library.schema)
        writer.write_table(library)
        start += table.num_rows
        if bar is not None:
            bar.update(table.num_rows)
    writer.close()
    fps.flush()
    del fps
    return n_fp, seconds


def _bar(progress: bool, total: int) -> Any:
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="mol", desc="index")


# ---------------------------------------------------------------------- searching
def check_index_files(directory: Path, info: dict[str, Any]) -> None:
    """DataError naming the first index file that is missing, truncated or changed since
    ``smiexlm index`` wrote it (its size and sha256 in ``index.json``)."""
    recorded = info.get("files")
    for name in INDEX_FILES:
        entry = recorded.get(name) if isinstance(recorded, dict) else None
        problem = file_problem(directory / name, entry)
        if problem:
            raise DataError(
                f"search index file {str(directory / name)!r} {problem}: expected the file "
                f"its {INDEX_JSON} records; rebuild the index with `smiexlm index`"
            )


class SearchIndex:
    """A loaded index folder; the model that made its embeddings is loaded on first use."""

    def __init__(self, directory: Path, checkpoint: Path | None = None, device: str = "auto"):
        faiss = _faiss()
        self.directory = Path(directory)
        if not (self.directory / INDEX_JSON).is_file():
            raise DataError(f"{str(directory)!r} has no {INDEX_JSON}: expected a folder "
                            "written by `smiexlm index`")  # fmt: skip
        _, self.info = read_json_file(self.directory / INDEX_JSON, "search index", INDEX_FORMAT)
        check_index_files(self.directory, self.info)
        self.embedding = faiss.read_index(str(self.directory / EMBEDDING_FILE))
        self.ecfp4 = np.load(self.directory / ECFP4_FILE, mmap_mode="r")  # (N, 32) uint64
        self._ecfp4_bits: np.ndarray | None = None
        self._exact: Any = None
        self.checkpoint, self.device, self._featurizer = checkpoint, device, None
        self.left_out: list[tuple[int, str, str]] = []  # the last search's unreadable queries

    @property
    def settings(self) -> dict[str, Any]:
        return self.info["settings"]

    def featurizer(self) -> Any:
        """The model of the index's embeddings: ``checkpoint`` or the recorded folder, checked
        against the recorded weights' sha256."""
        if self._featurizer is None:
            from smiexlm.embedding.featurizer import Featurizer

            self._featurizer = Featurizer.from_pretrained(self.model_folder(), device=self.device)
        return self._featurizer

    def model_folder(self) -> Path:
        """``checkpoint`` (a folder or a shipped model's name) or the folder recorded in
        ``index.json``; DataError unless its weights are those that made the embeddings."""
        from smiexlm.modelio.layout import model_folder
        from smiexlm.parts.job import model_record

        recorded = self.info["model"]
        made_by, want = recorded["folders"][0]["path"], recorded["sha256"]
        if self.checkpoint is None:
            folder = Path(made_by)
            if not folder.is_dir():
                raise DataError(f"the model folder {made_by!r} that made the index's embeddings "
                                "is gone: pass it (moved or copied) with --checkpoint")  # fmt: skip
        else:
            folder = model_folder(self.checkpoint)
        digest = model_record([folder])["sha256"]
        if digest != want:
            given = ("the recorded model folder" if self.checkpoint is None
                     else f"--checkpoint {str(self.checkpoint)!r}")  # fmt: skip
            where = f"{str(folder)!r}, " if str(folder) != str(self.checkpoint) else ""
            fix = ("leave --checkpoint out to use it" if self.checkpoint and Path(made_by).is_dir()
                   else "pass that model with --checkpoint")  # fmt: skip
            raise DataError(
                f"{given} ({where}weights sha256 {digest[:12]}…) is not the model that made "
                f"the index's embeddings ({made_by!r}, weights sha256 {want[:12]}…): {fix}, or "
                "rebuild the index with this one"
            )
        return folder

    def embed(self, queries: Sequence[str], errors: str = "raise") -> np.ndarray:
        """(q, d) unit-length query embeddings, made as the library's were; with ``errors =
        "nan"``, a row of NaN for a query the model cannot read (the featurizer's
        ``last_report`` says why)."""
        faiss = _faiss()
        vectors = self.featurizer().featurize(
            list(queries), pooling=self.settings["pooling"], errors=errors,
            layer=last_blocks(self.settings.get("layers", 1)),
            canonicalize=self.settings["canonicalize"], whiten=self.settings.get("whiten", False),
        )  # fmt: skip
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        faiss.normalize_L2(vectors)  # a row of NaN stays NaN
        return vectors

    def search_embedding(
        self, vectors: np.ndarray, k: int = 10, ef_search: int = 128, exact: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each (q, k): cosine similarity and library row, best first; row
        -1 where the library has fewer than ``k`` embedded rows. ``exact`` compares with every
        row (the ground truth of the approximate HNSW answer)."""
        faiss = _faiss()
        if exact:
            if self._exact is None:
                graph = faiss.downcast_index(self.embedding.index)
                stored = graph.reconstruct_n(0, self.embedding.ntotal)  # (n, d), insertion order
                self._exact = faiss.IndexIDMap2(faiss.IndexFlatIP(stored.shape[1]))
                self._exact.add_with_ids(stored, faiss.vector_to_array(self.embedding.id_map))
            return self._exact.search(vectors, k)
        params = faiss.SearchParametersHNSW(efSearch=max(ef_search, k))
        return self.embedding.search(vectors, k, params=params)

    def search_ecfp4(self, queries: Sequence[str], k: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """(scores, rows), each (q, k): exact ECFP4 Tanimoto similarity, best first (ties in
        row order); row -1 where the library has fewer than ``k`` fingerprints."""
        packed = ecfp4_packed(list(queries))  # (q, 32)
        counts = popcount(packed)
        for text, count in zip(queries, counts, strict=True):
            if count == 0:
                raise InvalidSmilesError(str(text), None, "RDKit cannot parse it (no ECFP4)")
        bits = self.ecfp4_bits
        scores = np.full((len(packed), k), np.nan, dtype=np.float32)
        rows = np.full((len(packed), k), -1, dtype=np.int64)
        for q, (query, count) in enumerate(zip(packed, counts, strict=True)):
            best_s, best_r = np.empty(0, np.float64), np.empty(0, np.int64)
            for start in range(0, len(self.ecfp4), BLOCK_ROWS):
                block = np.asarray(self.ecfp4[start : start + BLOCK_ROWS])
                inter = popcount(block & query)
                lib = bits[start : start + BLOCK_ROWS]
                sim = np.where(lib > 0, inter / np.maximum(count + lib - inter, 1), -1.0)
                take = min(k, len(sim))
                top = np.argpartition(-sim, take - 1)[:take]
                best_s = np.concatenate([best_s, sim[top]])
                best_r = np.concatenate([best_r, top + start])
            order = np.lexsort((best_r, -best_s))[:k]
            keep = best_s[order] >= 0
            scores[q, : keep.sum()] = best_s[order][keep]
            rows[q, : keep.sum()] = best_r[order][keep]
        return scores, rows

    @property
    def ecfp4_bits(self) -> np.ndarray:
        """(N,) set bits of each library fingerprint (0: no fingerprint)."""
        if self._ecfp4_bits is None:
            self._ecfp4_bits = np.concatenate(
                [popcount(np.asarray(self.ecfp4[s : s + BLOCK_ROWS]))
                 for s in range(0, len(self.ecfp4), BLOCK_ROWS)]
            )  # fmt: skip
        return self._ecfp4_bits

    def search(
        self, queries: Sequence[str], k: int = 10, by: By = "both", ef_search: int = 128,
        exact: bool = False,
    ) -> Any:  # fmt: skip
        """A DataFrame of hits: query, by (embedding | ecfp4), rank, score, row, the library's
        id columns and SMILES (under :meth:`library_names`). Embedding scores are cosine,
        ECFP4 scores Tanimoto. A query the model cannot embed (longer than its positions) is
        left out of every method and listed with its reason in :attr:`left_out`."""
        import pandas as pd
        import pyarrow.parquet as pq

        if by not in _BY:
            raise ConfigError("by", by, f"one of {_BY}")
        check_positive_int("--ef-search", ef_search)
        if not isinstance(k, int) or k < 1:
            raise ConfigError("k", k, "a positive integer")
        queries = list(queries)
        if not queries:
            raise DataError("--query: expected at least one SMILES")
        found, kept, self.left_out = [], list(range(len(queries))), []
        if by in ("embedding", "both"):
            vectors = self.embed(queries, errors="nan")
            self.left_out = list(self.featurizer().last_report.failed)
            out = {i for i, _, _ in self.left_out}
            kept = [q for q in kept if q not in out]
            found.append(("embedding", *self.search_embedding(vectors[kept], k, ef_search, exact)))  # fmt: skip
        if by in ("ecfp4", "both"):
            found.append(("ecfp4", *self.search_ecfp4([queries[q] for q in kept], k)))
        records = []
        for method, scores, rows in found:
            for i, q in enumerate(kept):
                for rank, (score, row) in enumerate(zip(scores[i], rows[i], strict=True), 1):
                    if row >= 0:
                        records.append((q, queries[q], method, rank, float(score), int(row)))
        hits = pd.DataFrame(records, columns=list(HIT_COLUMNS))
        library = pq.read_table(self.directory / LIBRARY_FILE).take(hits["row"].to_numpy())
        return pd.concat([hits, library.to_pandas().rename(columns=self.library_names())], axis=1)

    def library_names(self) -> dict[str, str]:
        """The library's columns (its id columns and SMILES) by their names among the hits:
        their own, or ``input_<name>`` where a hit column has it (``score``, ``rank``...)."""
        columns = [*self.settings["id_cols"], self.settings["smiles_col"]]
        return kept_names(columns, set(HIT_COLUMNS))


def format_hits(hits: Any, id_cols: list[str], smiles_col: str) -> str:
    """Hits as text: one block per query and method, best first."""
    from smiexlm.errors import shorten

    names = {"embedding": "embedding cosine", "ecfp4": "ECFP4 Tanimoto"}
    lines = []
    hits = hits.sort_values("query_index", kind="stable")  # per query: embedding, then ECFP4
    for (q, method), group in hits.groupby(["query_index", "by"], sort=False):
        lines.append(f"query {q + 1} {shorten(group['query'].iloc[0])!r}, {names[method]}:")
        for hit in group.to_dict("records"):
            ids = " ".join(str(hit[c]) for c in id_cols)
            smiles = shorten(hit[smiles_col])
            lines.append(
                f"  {hit['rank']:>3}  {hit['score']:.3f}  row {hit['row']:<9} {ids}  {smiles}"
            )
    return "\n".join(lines)
