"""Prediction on a Ray cluster (``smiexlm predict --checkpoint M --input INPUT --out PARTS
--ray ADDRESS``, on the engine of :mod:`smiexlm.parts.on_ray`), and the fine-tuned model as a
callable class for Ray Data pipelines of one's own (:class:`PredictBatches`). Ray is an
optional extra: ``pip install 'smiexlm[ray]'``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smiexlm.parts.job import DEFAULT_PART_ROWS, PartsResult
from smiexlm.parts.on_ray import inputs_record, ray_input, run_parts_on_ray
from smiexlm.paths import check_output
from smiexlm.serving.predict_parts import How, chunk_predictor, predict_job
from smiexlm.serving.prediction import served_folders


class PredictBatches:
    """A fine-tuned model (or an ensemble of folders) as a callable class for
    ``ray.data.Dataset.map_batches``: each batch (a pandas DataFrame with a SMILES column)
    comes back as ``predict`` writes its rows (the batch's other columns, ``smiles``,
    ``valid``, the predictions and the trust columns) with ``predict_error`` (empty, or why
    the row is NaN). ``how``: ``predict``'s options (``backend``, ``conformal_alpha``...)::

        ds.map_batches(PredictBatches, fn_constructor_kwargs={"checkpoint": "model/"},
                       batch_format="pandas", concurrency=4, num_cpus=1)
    """

    def __init__(self, checkpoint: Path | str | Sequence[Path | str], smiles_col: str = "smiles",
                 threads: int = 1, **how: Any):  # fmt: skip
        from smiexlm.training.workers import set_threads

        set_threads(threads)
        self.folders, self.smiles_col, self.how = served_folders(checkpoint), smiles_col, how
        self.process: Any = None

    def __call__(self, batch: Any) -> Any:
        if self.process is None:  # the output columns are named from the first batch's
            _, make = chunk_predictor(self.folders, batch, self.smiles_col, None, self.how)
            self.process = make()
        output = self.process(batch, 0)
        table = output.table.to_pandas()
        errors = [""] * len(table)
        for row, _, reason in output.rejects:
            errors[row] = reason
        return table.assign(predict_error=errors)


def predict_parts_on_ray(
    checkpoint: Path | str | Sequence[Path | str],
    input: Path | str,
    out: Path,
    address: str,
    smiles_col: str = "smiles",
    id_cols: list[str] | None = None,
    part_rows: int = DEFAULT_PART_ROWS,
    *,
    chunk_rows: int = 8192,
    progress: bool = True,
    how: How | None = None,
) -> PartsResult:
    """:func:`~smiexlm.serving.predict_parts.predict_parts` on the Ray cluster at
    ``address`` (:mod:`smiexlm.parts.on_ray`): the same folder, bitwise the same table."""
    # read by the writers, each in its own working folder: a folder's path whole
    folders = [Path(f).resolve() if Path(f).exists() else f for f in served_folders(checkpoint)]
    out = Path(out)
    check_output(out, "--out", kind="folder")
    paths, first, chunks = ray_input(input, address, smiles_col, chunk_rows)
    job, make = predict_job(folders, inputs_record(paths), first, smiles_col, id_cols, part_rows,
                            how or {})  # fmt: skip
    return run_parts_on_ray(job, out, chunks, make, progress=progress, desc="predict (ray)")
