"""Options that several commands declare alike, each written once as an ``Annotated`` type.

A command names its parameter and default, ``device: Device = "auto"``; the flag, its help and
its type come from here, so ``embed``, ``predict``, ``probe`` and the rest spell them the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Device = Annotated[str, typer.Option(help="auto (CUDA when available) | cpu | cuda[:N].")]
ModelFolder = Annotated[
    Path | None,
    typer.Option(
        "--checkpoint",
        "-c",
        help="Model folder, or a shipped model's name (exlm, exlm_desc, mlm, maelm; default: "
        "the shipped default model, an MTR model).",
    ),
]
SmilesCol = Annotated[
    str, typer.Option("--smiles-col", help="Column of the input holding the SMILES.")
]
Pooling = Annotated[
    str | None,
    typer.Option(
        help="cls, mean, max, or several joined by + such as cls+max (default: "
        "the model's own, see its card)."
    ),
]
Canonicalize = Annotated[
    bool,
    typer.Option(
        "--canonicalize/--no-canonicalize",
        help="RDKit canonical SMILES first, stereo kept (--no-canonicalize: as written).",
    ),
]
PartRows = Annotated[
    int | None,
    typer.Option(
        help="Input rows per part of a folder --out (default 100,000); each part is written "
        "atomically and a rerun resumes part by part.",
        show_default=False,
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option("--ray", help="Run on a Ray cluster into a folder of parts: local (start "
                 "one here), auto (the running one) or HOST:PORT of its head; the input may "
                 "then be a folder or a glob of files (pip install 'smiexlm[ray]')."),
]  # fmt: skip
Threads = Annotated[
    int | None,
    typer.Option(
        help="Torch threads per process (default: torch's own; under torchrun the cores over "
        "the processes of the node).",
        show_default=False,
    ),
]
Progress = Annotated[bool, typer.Option("--progress/--no-progress", help="Show a progress bar.")]
OutputAlias = Annotated[Path | None, typer.Option("--output", hidden=True)]  # the old --out


def columns(text: str | None) -> list[str] | None:
    """``"a, b,c"`` -> ``["a", "b", "c"]`` (a comma-separated column option); None stays None."""
    return None if text is None else [c.strip() for c in text.split(",") if c.strip()]


def distinct_columns(option: str, value: str | list[str]) -> list[str]:
    """The columns of a column option (a list, or one comma-separated text); DataError when
    one is named twice."""
    from smiexlm.errors import check_distinct

    names = columns(value) if isinstance(value, str) else [str(v) for v in value]
    check_distinct(option, names)
    return names
