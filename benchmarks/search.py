"""``smiexlm index`` / ``search``: build time, query latency and recall@10 of HNSW.

    SMIEXLM_DATA=../shared/data nice python benchmarks/search.py --embeddings EMB_DIR

EMB_DIR is a folder of embedding parts (``smiexlm embed moses.csv --out EMB_DIR``). The script
builds the index (timing the HNSW graph and the ECFP4 fingerprints apart), embeds ``--queries``
held-out molecules (the first of MOSES's test split) with the same model, and for each
``efSearch`` measures the recall@k of HNSW against exact cosine search (FAISS ``IndexFlatIP``
over the same unit vectors) and the latency of one query at a time (FAISS on one thread; the
model's embedding of the query is timed apart). Exact ECFP4 Tanimoto search is timed the same
way, and the overlap of the two top-k lists is reported.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np


def folder_mib(path: Path) -> dict[str, float]:
    return {p.name: round(p.stat().st_size / 2**20, 1) for p in sorted(path.iterdir())}


def per_query_ms(fn, items) -> float:
    """Median milliseconds of ``fn(item)`` over ``items``."""
    times = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        times.append(time.perf_counter() - start)
    return round(1000 * float(np.median(times)), 3)


def main() -> None:
    import faiss

    from smiexlm.embedding.search import SearchIndex, build_index

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embeddings", type=Path, required=True)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--ef", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--m", type=int, default=32)
    parser.add_argument("--ef-construction", type=int, default=100)
    parser.add_argument("--ecfp4-queries", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    print(f"# {platform.platform()}, {os.cpu_count()} CPUs, faiss {faiss.__version__}, "
          f"{faiss.omp_get_max_threads()} FAISS threads for the build")  # fmt: skip
    report: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "idx"
        start = time.perf_counter()
        info = build_index(args.embeddings, out, args.m, args.ef_construction, progress=False)
        report["build"] = {"n_rows": info.n_rows, "n_embedded": info.n_embedded,
                           "wall_s": round(time.perf_counter() - start, 1),
                           "hnsw_s": round(info.seconds["embedding"], 1),
                           "ecfp4_s": round(info.seconds["ecfp4"], 1),
                           "files_mib": folder_mib(out)}  # fmt: skip
        print(json.dumps(report["build"]), flush=True)
        index = SearchIndex(out, device="cpu")
        source = Path(os.environ["SMIEXLM_DATA"]) / "pretrain" / "moses_test.smi.gz"
        with gzip.open(source, "rt") as handle:
            queries = [next(handle).strip() for _ in range(args.queries)]
        index.featurizer()  # the model is loaded once, outside the timing
        start = time.perf_counter()
        vectors = index.embed(queries)  # (q, d)
        report["embed_queries_ms_per_query"] = round(
            1000 * (time.perf_counter() - start) / len(queries), 2
        )
        faiss.omp_set_num_threads(1)
        exact_s, exact_rows = index.search_embedding(vectors, args.k, exact=True)
        report["exact_cosine_ms"] = per_query_ms(
            lambda v: index.search_embedding(v[None], args.k, exact=True), vectors[:200]
        )
        report["hnsw"] = []
        for ef in args.ef:
            _, rows = index.search_embedding(vectors, args.k, ef_search=ef)
            recall = np.mean(
                [len(set(a) & set(b)) / args.k for a, b in zip(rows, exact_rows, strict=True)]
            )
            ms = per_query_ms(
                lambda v, ef=ef: index.search_embedding(v[None], args.k, ef_search=ef), vectors
            )
            row = {"ef_search": ef, "recall_at_k": round(float(recall), 4), "ms_per_query": ms}
            report["hnsw"].append(row)
            print(json.dumps(row), flush=True)
        _ = index.ecfp4_bits  # the library's popcounts, once, outside the timing
        start = time.perf_counter()
        _, fp_rows = index.search_ecfp4(queries[: args.ecfp4_queries], args.k)
        report["ecfp4_ms_per_query"] = round(
            1000 * (time.perf_counter() - start) / args.ecfp4_queries, 2
        )
        overlap = np.mean([len(set(a) & set(b)) / args.k
                           for a, b in zip(exact_rows[: args.ecfp4_queries], fp_rows, strict=True)])  # fmt: skip
        report["top_k_overlap_embedding_vs_ecfp4"] = round(float(overlap), 3)
        report["exact_cosine_mean_top1"] = round(float(exact_s[:, 0].mean()), 4)
    print(json.dumps({k: v for k, v in report.items() if k not in ("build", "hnsw")}))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
