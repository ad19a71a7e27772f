"""``smiexlm analyze``: the papers' analyses (repeated-mlm, entropy, rank, dag).

Every command writes a CSV/JSON of its figures and a PNG plot into ``--out``. List options
take several values after one flag (``--k 1 2 4``), repeated flags, or commas (``--k 1,2,4``).
Heavy imports happen inside the command bodies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from smiexlm.cli.options import multi_value
from smiexlm.cli.params import Device

analyze_app = typer.Typer(
    name="analyze",
    help="The papers' analyses: Repeated MLM, prediction entropy, effective rank, DAG case.",
    no_args_is_help=True,
)


Out = Annotated[Path, typer.Option("--out", help="Folder for the CSV, JSON and PNG.")]
Checkpoints = Annotated[
    list[Path], typer.Argument(help="Checkpoint folders (config.json, vocab.json, weights).")
]
SmilesFile = Annotated[
    Path | None,
    typer.Option(
        "--smiles-file",
        help="Held-out SMILES (one per line, .gz ok, or CSV with 'smiles'); default "
        "$SMIEXLM_DATA/pretrain/moses_test.smi.gz.",
    ),
]
Seed = Annotated[int, typer.Option(help="Seed of the masks.")]


def _smiles(path: Path | None, n: int, out: Path) -> list[str]:
    """The first ``n`` SMILES of ``path`` the tokenizer reads; those it cannot are left out,
    listed with their reasons in ``out/rejects.csv`` and counted on stderr."""
    from smiexlm.analysis.inputs import default_smiles_file, readable_smiles
    from smiexlm.atomic import atomic_path
    from smiexlm.data.pipeline import read_smiles
    from smiexlm.errors import DataError
    from smiexlm.paths import write_rejects

    path = path or default_smiles_file()
    smiles, rejects = readable_smiles(read_smiles(path, n))
    if not smiles:
        raise DataError(f"--smiles-file {str(path)!r}: the tokenizer reads none of its SMILES "
                        f"(first: {rejects[0][1]!r}: {rejects[0][2]})")  # fmt: skip
    if rejects:
        listed = Path(out) / "rejects.csv"
        with atomic_path(listed) as tmp:  # the folder is made with it
            write_rejects(rejects, tmp)
        typer.echo(f"{len(rejects)} of {len(rejects) + len(smiles)} SMILES left out, the "
                   f"tokenizer cannot read them (listed in {listed}; first: row "
                   f"{rejects[0][0]}, {rejects[0][1]!r})", err=True)  # fmt: skip
    return smiles


def _report(files) -> None:
    typer.echo("wrote " + ", ".join(str(f) for f in files))


@analyze_app.command("repeated-mlm", cls=multi_value("--k", "--p", "--set"))
def repeated_mlm(
    data: Annotated[Path, typer.Option("--data", help="Dataset folder from `smiexlm preprocess`.")],
    out: Out,
    k: Annotated[list[int], typer.Option("--k", help="Repetition counts k.")] = (1, 2, 4),
    p: Annotated[list[float], typer.Option("--p", help="Mask ratios p.")] = (0.15, 0.387, 0.622),
    config: Annotated[
        str, typer.Option(help="Pre-training config (shipped name or TOML).")
    ] = "mol_tiny_mlm",  # noqa: E501
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", help="key=value overrides of the pre-training config."),
    ] = None,  # noqa: E501
    steps: Annotated[int, typer.Option(help="Pre-training steps per cell.")] = 2000,
    max_molecules: Annotated[
        int, typer.Option(help="Training molecules per cell (0 = all).")
    ] = 100_000,  # noqa: E501
    eval_molecules: Annotated[int, typer.Option(help="Held-out molecules measured.")] = 1000,
    min_ratio: Annotated[float, typer.Option(help="Skip cells with p^k below this.")] = 0.001,
    downstream: Annotated[bool, typer.Option(help="Fine-tune each cell on BBBP.")] = True,
    bbbp_epochs: Annotated[int, typer.Option(help="BBBP epochs (shortened schedule).")] = 5,
    bbbp_max_steps: Annotated[int | None, typer.Option(help="Cap on BBBP steps.")] = None,
    bbbp_rows: Annotated[int | None, typer.Option(help="Seeded BBBP subset size.")] = None,
    seed: Seed = 0,
    device: Device = "auto",
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Keep the finished cells in --out and train the "
            "others (a cell made with other settings is refused).",
        ),
    ] = False,  # fmt: skip
) -> None:
    """Repeated MLM grid (ExLM §3): corrupted ratio vs p^k, entropy, BBBP score per (k, p).
    Each finished cell keeps its row in --out: a stopped grid goes on with --resume."""
    from smiexlm.analysis.repeated_mlm import RepeatedMLMConfig, run_repeated_mlm

    cfg = RepeatedMLMConfig(
        ks=tuple(k), ps=tuple(p), min_ratio=min_ratio, train_config=config,
        overrides=tuple(overrides or ()), steps=steps, max_molecules=max_molecules or None,
        eval_molecules=eval_molecules, downstream=downstream, bbbp_epochs=bbbp_epochs,
        bbbp_max_steps=bbbp_max_steps, bbbp_rows=bbbp_rows, seed=seed, device=device,
    )  # fmt: skip
    result = run_repeated_mlm(data, out, cfg, resume=resume)
    for row in result.rows:
        typer.echo(
            f"k={row['k']} p={row['p']:g}: corrupted {row['measured_corrupted']:.4f} "
            f"(p^k {row['expected_corrupted']:.4f}), entropy {row['entropy_bits']:.3f} bits"
            + (f", BBBP test {row['bbbp_test_auc']:.1f}" if "bbbp_test_auc" in row else "")
        )
    _report(result.files)


@analyze_app.command("entropy", cls=multi_value("--mask-ratios"))
def entropy(
    checkpoints: Checkpoints,
    out: Out,
    mask_ratios: Annotated[list[float], typer.Option("--mask-ratios", help="Mask ratios.")] = (
        0.15,
        0.3,
        0.45,
        0.6,
    ),
    smiles_file: SmilesFile = None,
    max_molecules: Annotated[int, typer.Option(min=1, help="Held-out molecules used.")] = 2000,
    seed: Seed = 0,
    batch_size: Annotated[int, typer.Option(min=1, help="Molecules per forward pass.")] = 64,
) -> None:
    """Prediction entropy (bits) of each checkpoint over masked tokens per mask ratio."""
    from smiexlm.analysis.entropy import entropy_by_mask_ratio, write_entropy
    from smiexlm.analysis.inputs import check_models

    check_models(checkpoints, predict_tokens=True)
    smiles = _smiles(smiles_file, max_molecules, out)
    result = entropy_by_mask_ratio(checkpoints, smiles, mask_ratios, seed, batch_size)
    for row in result.rows:
        typer.echo(
            f"{row['checkpoint']} ({row['objective']}) r={row['mask_ratio']:g}: "
            f"{row['entropy_bits']:.3f} bits over {row['n_tokens']} tokens"
        )
    _report(write_entropy(result, out))


@analyze_app.command("rank")
def rank(
    checkpoints: Checkpoints,
    out: Out,
    smiles_file: SmilesFile = None,
    max_molecules: Annotated[int, typer.Option(min=1, help="Held-out molecules used.")] = 1000,
    mask_prob: Annotated[
        float, typer.Option(help="Mask ratio of the 'with [MASK]' inputs.")
    ] = 0.15,  # noqa: E501
    tau: Annotated[float, typer.Option(help="Variance fraction of the effective rank.")] = 0.9,
    seed: Seed = 0,
    batch_size: Annotated[int, typer.Option(min=1, help="Molecules per forward pass.")] = 64,
) -> None:
    """τ-effective rank per layer for inputs with and without [MASK] (MAE-LM §2.2)."""
    from smiexlm.analysis.inputs import check_models
    from smiexlm.analysis.rank import rank_by_layer, write_rank

    check_models(checkpoints)
    smiles = _smiles(smiles_file, max_molecules, out)
    result = rank_by_layer(checkpoints, smiles, mask_prob, tau, seed, batch_size)
    for row in result.rows:
        typer.echo(
            f"{row['checkpoint']} layer {row['layer']}: with [MASK] {row['with_mask']}, "
            f"without {row['without_mask']}, [MASK] only {row['mask_only']}"
        )
    _report(write_rank(result, out))


@analyze_app.command("dag", cls=multi_value("--mask"))
def dag(
    checkpoint: Annotated[Path, typer.Argument(help="An ExLM checkpoint folder.")],
    smiles: Annotated[str, typer.Option("--smiles", help="The input SMILES.")],
    mask: Annotated[list[int], typer.Option("--mask", help="0-based token indices to mask.")],
    out: Out,
    top: Annotated[int, typer.Option(min=1, help="Top tokens shown per state.")] = 3,
) -> None:
    """One input's DAG: transitions, top tokens per state, Viterbi path (ExLM Fig. 10–11)."""
    from smiexlm.analysis.dag_case import dag_case, write_dag_case

    case = dag_case(checkpoint, smiles, mask, top)
    typer.echo(f"tokens: {' '.join(case.tokens)}; masked {case.mask_positions}")
    for st in case.states:
        typer.echo(f"{st['label']:>14}: {' '.join(st['top_tokens'])}  path -> {st['path_target']}")
    _report(write_dag_case(case, out))


def register(app: typer.Typer) -> None:
    app.add_typer(analyze_app, name="analyze")
