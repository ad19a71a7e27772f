"""``smiexlm index`` (embedding parts -> a search index) and ``smiexlm search``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand

from smiexlm.cli.params import Device, SmilesCol


class QueryList(TyperCommand):
    """``--query A B C`` means ``--query A --query B --query C``: values run until the next
    argument that starts with ``-`` (no SMILES does); no splitting at commas."""

    def parse_args(self, ctx, args):
        spread, inside = [], False
        for arg in args:
            if arg in ("--query", "-q"):
                inside = True
            elif inside and not arg.startswith("-"):
                spread += ["--query", arg]
            else:
                inside = False
                spread.append(arg)
        return super().parse_args(ctx, spread)


def index(
    embeddings: Annotated[
        Path, typer.Argument(help="Folder of embedding parts (`smiexlm embed IN --out DIR`).")
    ],
    out: Annotated[Path, typer.Option("--out", "-o", help="Index folder to write.")],
    m: Annotated[int, typer.Option("--m", help="HNSW graph degree (FAISS M).")] = 32,
    ef_construction: Annotated[
        int, typer.Option(help="HNSW candidates kept while inserting (FAISS efConstruction).")
    ] = 100,
    threads: Annotated[
        int | None, typer.Option(help="FAISS threads (default: every core).", show_default=False)
    ] = None,
) -> None:
    """Build a similarity-search index over embeddings: an HNSW graph of the cosine
    similarities (FAISS) and the library's ECFP4 fingerprints for exact Tanimoto search."""
    from smiexlm.embedding.search import build_index

    _threads(threads)
    info = build_index(embeddings, out, m, ef_construction)
    typer.echo(f"indexed {info.n_rows:,} rows in {info.out}: {info.n_embedded:,} embeddings "
               f"({info.seconds['embedding']:.1f} s), {info.n_fingerprinted:,} ECFP4 "
               f"fingerprints ({info.seconds['ecfp4']:.1f} s)")  # fmt: skip


def search(
    index: Annotated[Path, typer.Argument(help="Index folder (`smiexlm index`).")],
    query: Annotated[
        list[str] | None, typer.Option("--query", "-q", help="Query SMILES (one or more).")
    ] = None,
    queries: Annotated[
        Path | None,
        typer.Option(help="File of query SMILES (.smi, or a table with --smiles-col)."),
    ] = None,
    smiles_col: SmilesCol = "smiles",
    k: Annotated[int, typer.Option("-k", "--k", help="Neighbours per query.")] = 10,
    by: Annotated[
        str, typer.Option(help="embedding (cosine, HNSW), ecfp4 (Tanimoto, exact) or both.")
    ] = "both",
    checkpoint: Annotated[
        Path | None,
        typer.Option("--checkpoint", "-c", help="Model folder (default: the one recorded)."),
    ] = None,
    ef_search: Annotated[int, typer.Option(help="HNSW candidates per query (efSearch).")] = 128,
    exact: Annotated[bool, typer.Option(help="Exact cosine search (no HNSW).")] = False,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the hits as CSV.")] = None,
    device: Device = "auto",
) -> None:
    """The k nearest library molecules of each query, by embedding cosine and ECFP4 Tanimoto.
    A query RDKit cannot read is left out (with --out, listed with its reason in
    OUT.rejects.csv); ``query_index`` numbers the queries as given."""
    from smiexlm.atomic import atomic_paths
    from smiexlm.data.readers import read_table, write_table
    from smiexlm.embedding.search import SearchIndex, format_hits
    from smiexlm.errors import DataError
    from smiexlm.paths import check_output, rejects_beside, write_rejects

    if out is not None:
        check_output(out, "--out")
        check_output(rejects_beside(out), "--out rejects file")
    listed = [] if queries is None else read_table(queries, smiles_col)[smiles_col].tolist()
    texts = list(query or []) + listed
    kept, rejects = _readable_queries(texts)
    found = SearchIndex(index, checkpoint, device)
    hits = found.search([texts[i] for i in kept], k, by, ef_search, exact)  # type: ignore[arg-type]
    hits["query_index"] = [kept[i] for i in hits["query_index"]]  # as the queries were given
    rejects = sorted(rejects + [(kept[i], text, why) for i, text, why in found.left_out])
    if len(rejects) == len(texts):
        row, text, reason = rejects[0]
        raise DataError(f"no query could be searched; first: query {row + 1} {text!r}: {reason}")
    names = found.library_names()
    typer.echo(format_hits(hits, [names[c] for c in found.settings["id_cols"]],
                           names[found.settings["smiles_col"]]))  # fmt: skip
    if out is not None:
        with atomic_paths(out, rejects_beside(out)) as (tmp, tmp_listed):
            write_table(hits, tmp)
            write_rejects(rejects, tmp_listed)
        typer.echo(f"wrote {len(hits)} hits to {out}")
    if rejects:
        where = f" (listed in {rejects_beside(out)})" if out is not None else ""
        row, text, reason = rejects[0]
        typer.echo(f"{len(rejects)} of {len(texts)} queries left out{where}; first: query "
                   f"{row + 1} {text!r}: {reason}", err=True)  # fmt: skip


def _readable_queries(texts: list[str]) -> tuple[list[int], list[tuple[int, str, str]]]:
    """The places of the queries RDKit reads, and ``(query_index, smiles, reason)`` of the
    others (0-based, as the hits number them); DataError when it reads none."""
    from smiexlm.errors import DataError
    from smiexlm.model.inputs import readable_smiles

    kept, rejects = [], []
    for place, text in enumerate(texts):
        reason = readable_smiles(text)[1]
        if reason is None:
            kept.append(place)
        else:
            rejects.append((place, str(text), reason))
    if texts and not kept:
        row, text, reason = rejects[0]
        raise DataError(f"--query/--queries: RDKit reads none of the {len(texts)} queries "
                        f"(first: query {row + 1} {text!r}: {reason})")  # fmt: skip
    return kept, rejects


def _threads(threads: int | None) -> None:
    if threads is not None:
        from smiexlm.embedding.search import _faiss
        from smiexlm.training.workers import check_threads

        _faiss().omp_set_num_threads(check_threads(threads, "--threads"))


def register(app: typer.Typer) -> None:
    app.command("index")(index)
    app.command("search", cls=QueryList)(search)
