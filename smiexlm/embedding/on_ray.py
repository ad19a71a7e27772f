"""Embedding on a Ray cluster (``smiexlm embed INPUT --out PARTS --ray ADDRESS``, on the
engine of :mod:`smiexlm.parts.on_ray`), and the model as a callable class for Ray Data
pipelines of one's own (:class:`EmbedBatches`). Ray is an optional extra: ``pip install
'smiexlm[ray]'``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from smiexlm.embedding.embed import EmbedOptions, chunk_embedder, id_columns
from smiexlm.parts.job import DEFAULT_PART_ROWS, PartsJob, PartsResult, model_record
from smiexlm.parts.on_ray import inputs_record, ray_input, run_parts_on_ray
from smiexlm.paths import check_output


class EmbedBatches:
    """The model as a callable class for ``ray.data.Dataset.map_batches``: each batch (a
    pandas DataFrame with a SMILES column) comes back with ``e0 … e{d-1}`` beside its columns
    and ``embed_error`` (empty, or why the row is NaN). ``options``: :class:`EmbedOptions`
    fields (``checkpoint``, ``pooling``, ...). The model loads once per actor::

        ds.map_batches(EmbedBatches, fn_constructor_kwargs={"smiles_col": "smiles"},
                       batch_format="pandas", concurrency=4, num_cpus=1)
    """

    def __init__(self, smiles_col: str = "smiles", threads: int = 1, **options: Any):
        from smiexlm.training.workers import set_threads

        set_threads(threads)
        self.how, self.smiles_col = EmbedOptions(**{"device": "cpu", **options}), smiles_col
        self.feat = self.how.featurizer()

    def __call__(self, batch: Any) -> Any:
        emb = self.how.embed(self.feat, batch[self.smiles_col], 0)
        errors = [""] * len(batch)
        for row, _, reason in self.feat.last_report.failed:
            errors[row] = reason
        columns = {f"e{i}": emb[:, i] for i in range(emb.shape[1])}
        return batch.reset_index(drop=True).assign(**columns, embed_error=errors)


def embed_parts_on_ray(
    input: Path | str,
    out: Path,
    address: str,
    smiles_col: str = "smiles",
    id_cols: list[str] | None = None,
    *,
    progress: bool = True,
    chunk_rows: int = 8192,
    part_rows: int = DEFAULT_PART_ROWS,
    **options: Any,
) -> PartsResult:
    """:func:`~smiexlm.embedding.embed.embed_parts` on the Ray cluster at ``address``
    (:mod:`smiexlm.parts.on_ray`); ``options`` are :class:`EmbedOptions` fields."""
    how, out = EmbedOptions(**options), Path(out)
    check_output(out, "--out", kind="folder")
    paths, first, chunks = ray_input(input, address, smiles_col, chunk_rows)
    id_cols = id_columns(first, smiles_col, id_cols)
    settings = {"smiles_col": smiles_col, "id_cols": id_cols, **how.settings()}
    job = PartsJob("embed", inputs_record(paths), model_record([how.folder.path]), settings,
                   part_rows)  # fmt: skip
    fields = {k: getattr(how, k) for k in how.__dataclass_fields__}
    if how.checkpoint is not None:  # read by the writers, each in its own working folder
        fields["checkpoint"] = how.folder.path.resolve()
    return run_parts_on_ray(job, out, chunks, partial(_embedder, fields, smiles_col, id_cols),
                            progress=progress, desc="embed (ray)")  # fmt: skip


def _embedder(options: dict[str, Any], smiles_col: str, id_cols: list[str]) -> Any:
    """A part writer's chunk processor: the model loaded once, on the CPU."""
    how = EmbedOptions(**{**options, "device": "cpu"})
    return chunk_embedder(how, how.featurizer(), smiles_col, id_cols)
