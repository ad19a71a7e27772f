"""What a ``featurize`` call reports (:class:`FeaturizeReport`, logged by :func:`log_report`;
its :func:`progress_bar`), and how a long run keeps its memory flat
(:func:`release_free_memory`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from smiexlm.errors import shorten
from smiexlm.model.inputs import UnseenTokens

logger = logging.getLogger("smiexlm.embedding.featurizer")


@dataclass
class FeaturizeReport:
    """What the last ``featurize`` call did. ``failed`` lists (index, input, reason)."""

    n_inputs: int = 0
    n_failed: int = 0
    n_unk_tokens: int = 0
    n_changed_by_normalization: int = 0
    failed: list[tuple[int, str, str]] = field(default_factory=list)
    # the embedded molecules holding tokens the model never trained; None when its folder
    # keeps no record of its corpus (corpus_tokens.json)
    unseen: UnseenTokens | None = None

    def summary(self) -> str:
        line = (
            f"{self.n_inputs:,} SMILES, {self.n_failed:,} failed, "
            f"{self.n_unk_tokens:,} [UNK] tokens, "
            f"{self.n_changed_by_normalization:,} rewritten by normalisation"
        )
        if self.unseen is not None:
            line += f", {self.unseen.holding:,} with tokens the model never trained"
        return line


_MALLOC_TRIM: Any = None


def release_free_memory() -> None:
    """Hand freed heap memory back to the operating system (glibc's ``malloc_trim``).

    Each token-budget batch allocates large transient buffers of a different shape; glibc
    keeps the freed ones in a fragmented heap, so without this the peak memory of a long
    ``featurize`` or ``smiexlm embed`` run creeps up chunk after chunk. A no-op elsewhere."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            import ctypes

            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


def log_report(report: FeaturizeReport) -> None:
    """Warn of what a chunk of embeddings should not be trusted for: the inputs that failed
    (NaN rows) and the molecules holding tokens the model never trained."""
    if report.n_failed:
        shown = ", ".join(f"#{i} {shorten(s)!r} ({why})" for i, s, why in report.failed[:10])
        more = f" and {report.n_failed - 10} more" if report.n_failed > 10 else ""
        logger.warning(
            "featurize: %d of %d SMILES could not be embedded (rows are NaN): %s%s",
            report.n_failed, report.n_inputs, shown, more,
        )  # fmt: skip
    if report.unseen is not None and report.unseen.holding:
        logger.warning("featurize: %s", report.unseen.describe())


def progress_bar(total: int | None) -> Any:
    """A tqdm bar counting molecules."""
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="mol", desc="featurize")
