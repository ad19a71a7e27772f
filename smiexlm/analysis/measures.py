"""Pure measures behind the papers' analyses (no models, no files).

- :func:`prediction_entropy_bits`: H[P] = −Σ_x P(x) log₂ P(x) of softmax(logits), in bits
  (ExLM Appendix E).
- :func:`effective_rank`: the τ-effective rank of a representation matrix, the smallest r
  whose r largest squared singular values hold a fraction τ of the total (MAE-LM §2.2).
- :func:`fully_masked_tokens` / :func:`corrupted_ratio`: which original tokens of a
  k-repeated sequence have *all* their copies masked, and their share ("corrupted
  semantics", ExLM §3.1); :func:`expected_corrupted_ratio` = p^k and
  :func:`corrupted_ratio_variance` = p^k (1 − p^k) / N for independent masking (Appendix C).
- :func:`token_entropy_bits`: Appendix E's filter: per fully masked original token, the mean
  entropy over its k masked copies; tokens with any visible copy are left out.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from smiexlm.errors import ConfigError

LOG2 = math.log(2.0)


def prediction_entropy_bits(logits: Tensor) -> Tensor:
    """Entropy in bits of ``softmax(logits)`` over the last dimension: (..., V) -> (...).

    Computed in float64 from log-probabilities, so saturated rows give 0 (not NaN)."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    p = logp.exp()
    return -(p * logp).nan_to_num(0.0).sum(-1) / LOG2


def effective_rank(hidden: Tensor, tau: float = 0.9) -> int:
    """τ-effective rank of ``hidden`` (n, d): argmin_r Σ_{i≤r} σ_i² / Σ_i σ_i² ≥ τ.

    Singular values come from the uncentred matrix (MAE-LM's definition); a zero matrix
    has rank 0. Cumulative fractions are compared with a 1e-9 slack for rounding."""
    if not 0.0 < tau <= 1.0:
        raise ConfigError("tau", tau, "a fraction in (0, 1]")
    if hidden.dim() != 2:
        raise ConfigError("hidden", tuple(hidden.shape), "an (n, d) matrix")
    sigma2 = torch.linalg.svdvals(hidden.double()) ** 2  # (min(n, d),) descending
    total = float(sigma2.sum())
    if total == 0.0:
        return 0
    fraction = sigma2.cumsum(0) / total
    return int((fraction < tau - 1e-9).sum()) + 1


def _per_token_counts(values: Tensor, source: Tensor, valid: Tensor, n_tokens: int) -> Tensor:
    """Sum of ``values`` (B, Lx) over the copies of each original token -> (B, n_tokens)."""
    out = torch.zeros(source.shape[0], n_tokens, dtype=torch.float64, device=source.device)
    return out.scatter_add_(1, source.masked_fill(~valid, 0), (values * valid).double())


def fully_masked_tokens(
    selected: Tensor, source: Tensor, valid: Tensor, n_tokens: int
) -> tuple[Tensor, Tensor]:
    """Which original tokens have every copy masked.

    ``selected`` (B, Lx) bool: copy was masked; ``source`` (B, Lx) long: original column of
    each copy; ``valid`` (B, Lx) bool: real copy (not padding); ``n_tokens``: original width T.
    Returns ``(fully, present)``, both (B, T) bool: ``present`` marks original tokens with at
    least one copy, ``fully`` those whose copies are all masked.
    """
    ones = torch.ones_like(selected, dtype=torch.float64)
    copies = _per_token_counts(ones, source, valid, n_tokens)
    masked = _per_token_counts(selected.double(), source, valid, n_tokens)
    present = copies > 0
    return present & (masked == copies), present


def corrupted_ratio(selected: Tensor, source: Tensor, valid: Tensor, counted: Tensor) -> float:
    """Share of the ``counted`` (B, T) original tokens whose copies are all masked."""
    fully, _ = fully_masked_tokens(selected, source, valid, counted.shape[1])
    n = int(counted.sum())
    if n == 0:
        raise ConfigError("counted", 0, "at least one original token to count")
    return float((fully & counted).sum()) / n


def expected_corrupted_ratio(p: float, k: int) -> float:
    """p^k: each of k copies masked independently with probability p (Appendix C)."""
    return float(p) ** int(k)


def corrupted_ratio_variance(p: float, k: int, n: int) -> float:
    """Var(s) = p^k (1 − p^k) / N for N tokens masked independently (Appendix C)."""
    if n < 1:
        raise ConfigError("n", n, "a positive number of tokens")
    q = expected_corrupted_ratio(p, k)
    return q * (1.0 - q) / n


def token_entropy_bits(
    copy_entropy: Tensor, selected: Tensor, source: Tensor, valid: Tensor, counted: Tensor
) -> Tensor:
    """Appendix E: entropies (bits) of the fully masked original tokens, 1-D.

    ``copy_entropy`` (B, Lx): prediction entropy at each copy (only masked copies are read);
    a token's value is the mean over its k copies; tokens among ``counted`` (B, T) with any
    unmasked copy are excluded."""
    t = counted.shape[1]
    fully, _ = fully_masked_tokens(selected, source, valid, t)
    keep = fully & counted  # (B, T)
    sums = _per_token_counts(copy_entropy.double() * selected, source, valid, t)
    copies = _per_token_counts(selected.double(), source, valid, t)
    return (sums[keep] / copies[keep]).float()
