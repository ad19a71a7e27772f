"""``smiexlm predict``: fine-tuned folders on a table, with the columns of trust.

Heavy imports (torch, RDKit, pandas) happen inside the command body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from smiexlm.cli.embed import echo_parts, ray_needs_parts
from smiexlm.cli.options import multi_value
from smiexlm.cli.params import OutputAlias, PartRows, RayAddress, SmilesCol, Threads, columns

FinetunedDirs = Annotated[
    list[Path],
    typer.Option("--checkpoint", help="Fine-tuned folder(s) from finetune --save-dir; several "
                 "(e.g. seed0 seed1 seed2) give the ensemble mean and a <label>_std column."),
]  # fmt: skip
InputCsv = Annotated[
    Path, typer.Option("--input", help="CSV/TSV/Parquet table or .smi file with a SMILES column.")
]
OutputCsv = Annotated[
    Path,
    typer.Option("--out", "-o", help="Predictions CSV (Parquet for a .parquet name), or a "
                 "folder (a name without suffix) of resumable Parquet parts with a "
                 "manifest.json: for large inputs and torchrun."),
]  # fmt: skip
IdCols = Annotated[
    str | None,
    typer.Option(help="Comma-separated input columns to keep (default: all but the SMILES); "
                 "one named like a column predict writes (a label, valid, in_domain...) is "
                 "kept as input_<name>."),
]  # fmt: skip
Backend = Annotated[
    str,
    typer.Option(help="torch, or onnx: each folder's predictor.onnx with onnxruntime on the CPU "
                 "(written by `smiexlm export-onnx FOLDER`)."),
]  # fmt: skip
Tta = Annotated[
    int,
    typer.Option("--tta", min=0, help="Score each molecule as the mean over its canonical "
                 "SMILES and K random ones; <label>_tta_std is their spread (default 0)."),
]  # fmt: skip
Calibrate = Annotated[
    bool,
    typer.Option(help="Classification: temperature-scale each model's probabilities "
                 "(temperature fitted on its validation molecules)."),
]  # fmt: skip
ConformalAlpha = Annotated[
    float | None,
    typer.Option("--conformal-alpha", help="Add conformal sets (<label>_set, "
                 "classification) or intervals (<label>_low, <label>_high, regression) "
                 "that hold the true label with probability 1 - ALPHA, calibrated on the "
                 "validation molecules (e.g. 0.1)."),
]  # fmt: skip
Mondrian = Annotated[
    bool,
    typer.Option(help="With --conformal-alpha: class-conditional sets (the coverage "
                 "holds within each class; larger sets for the rare class): "
                 "--conformal-method class."),
]  # fmt: skip
ConformalMethod = Annotated[
    str | None,
    typer.Option("--conformal-method", help="With --conformal-alpha: difficulty (the "
                 "default of a classification blend: wider sets where the model and its forest "
                 "disagree; <label>_difficulty) | split (the default otherwise: one threshold a "
                 "task) | class (one a class) | distance (one per bin of nearest similarity to "
                 "the training molecules; conformal_bin) | weighted (validation molecules "
                 "weighted like the molecules predicted together; depends on the batch)."),
]  # fmt: skip


DomainQuantile = Annotated[
    float,
    typer.Option(help="in_domain is False below this quantile of the validation molecules' "
                 "nearest similarities to the training molecules (0: below the least similar "
                 "of them)."),
]  # fmt: skip


def predict(
    checkpoint: FinetunedDirs,
    input: InputCsv,
    smiles_col: SmilesCol = "smiles",
    out: OutputCsv = Path("predictions.csv"),
    output: OutputAlias = None,
    id_cols: IdCols = None,
    backend: Backend = "torch",
    part_rows: PartRows = None,
    threads: Threads = None,
    tta: Tta = 0,
    calibrate: Calibrate = False,
    conformal_alpha: ConformalAlpha = None,
    mondrian: Mondrian = False,
    conformal_method: ConformalMethod = None,
    domain_quantile: DomainQuantile = 0.05,
    ray: RayAddress = None,
) -> None:
    """Predict with a fine-tuned model or an ensemble of seeds: one row per input, NaN for
    unparsable SMILES, with the applicability domain (nearness to the training molecules)
    and, on request, calibrated probabilities and conformal sets or intervals. A folder --out
    is written part by part and resumed by the same command.

    Under `torchrun --nproc_per_node N` N processes share the parts; with --ray a Ray cluster
    writes them."""
    from smiexlm.parts.job import DEFAULT_PART_ROWS, wants_parts
    from smiexlm.serving.predict_parts import predict_file, predict_parts
    from smiexlm.training.workers import detect

    output = output if output is not None else out
    cols = columns(id_cols or None)  # an empty --id-cols keeps the default
    how = {"backend": backend, "tta": tta, "calibrate": calibrate,
           "conformal_alpha": conformal_alpha, "mondrian": mondrian,
           "conformal_method": conformal_method, "domain_quantile": domain_quantile}  # fmt: skip
    parts = wants_parts(output, part_rows)  # refuses --part-rows 0 (None: the default)
    rows = DEFAULT_PART_ROWS if part_rows is None else part_rows
    if ray is not None:
        from smiexlm.serving.on_ray import predict_parts_on_ray

        ray_needs_parts(parts, output)
        return echo_parts(predict_parts_on_ray(checkpoint, input, output, ray, smiles_col, cols,
                                               rows, how=how))  # fmt: skip
    if parts:
        return echo_parts(predict_parts(checkpoint, input, output, smiles_col, cols, rows,
                                        threads=threads, how=how))  # fmt: skip
    if threads is not None:
        detect(threads)
    result = predict_file(checkpoint, input, output, smiles_col, cols, how)
    _echo_failures(result.rejects)
    typer.echo(f"wrote {result.n_rows} rows ({len(result.rejects)} unparsable) to {result.out}")
    if result.rejects:
        typer.echo(f"every bad row, with its reason: {result.rejects_path}", err=True)


def _echo_failures(rejects: list[tuple[int, str, str]], shown: int = 10) -> None:
    """The first ``shown`` bad rows of a prediction, with the reason of each, on stderr."""
    from smiexlm.errors import shorten

    for row, text, reason in rejects[:shown]:
        typer.echo(f"  row {row}: {shorten(text.strip())!r} ({reason})", err=True)
    if len(rejects) > shown:
        typer.echo(f"  ... and {len(rejects) - shown:,} more (NaN rows)", err=True)


def select(
    input: Annotated[
        Path,
        typer.Argument(help="predict's output: a CSV/TSV/Parquet table, or its folder of parts."),
    ],
    n: Annotated[int, typer.Option("-n", min=1, help="How many molecules to pick.")] = 10,
    by: Annotated[
        str,
        typer.Option(
            help="uncertainty (probability nearest 0.5) | std (the ensemble's spread) "
            "| tta_std (the spread over random SMILES) | novelty (1 - nearest "
            "training Tanimoto) | value (the prediction) | ucb (value + kappa x spread)."
        ),
    ] = "uncertainty",  # fmt: skip
    task: Annotated[
        str | None, typer.Option(help="The predicted column to rank by (default: the only one).")
    ] = None,
    max_similarity: Annotated[
        float,
        typer.Option(
            help="Skip a molecule whose ECFP4 Tanimoto to one already picked is "
            "above this (1: keep near-copies)."
        ),
    ] = 0.7,  # fmt: skip
    lowest: Annotated[
        bool, typer.Option(help="--by value or ucb: the lowest predictions first.")
    ] = False,
    kappa: Annotated[
        float,
        typer.Option(help="--by ucb: how much the spread weighs against the value (0: value)."),
    ] = 1.0,
    smiles_col: SmilesCol = "smiles",
    out: Annotated[Path, typer.Option("--out", "-o", help="CSV of the picks.")] = Path("picks.csv"),
) -> None:
    """Pick the molecules to test next from predict's output: the highest acquisition score
    first, none too similar to one picked before it."""
    from smiexlm.atomic import atomic_path
    from smiexlm.data.readers import read_table, write_table
    from smiexlm.parts.reading import read_parts
    from smiexlm.paths import check_output
    from smiexlm.trust.acquisition import select as choose

    check_output(out, "--out")
    # cells as written (an id 007 stays 007); select parses the scores it ranks by
    frame = (read_parts(input).to_pandas() if input.is_dir()
             else read_table(input, smiles_col, "input"))  # fmt: skip
    chosen = choose(frame, n, by, task, max_similarity, smiles_col, lowest, kappa)
    with atomic_path(out) as tmp:
        write_table(chosen.picks, tmp)
    typer.echo(f"{chosen.summary()}; wrote {out}")


def register(app: typer.Typer) -> None:
    app.command(cls=multi_value("--checkpoint"))(predict)
    app.command()(select)
