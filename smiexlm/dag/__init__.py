"""ExLM's DAG alignment loss: log-likelihood, fused logits entry point and best alignment.

Shapes (see ``docs/dag.md``):

- ``emissions`` (B, M, L): ``log P_u(y_i)`` for target index i and state u.
- ``log_links`` (B, L, L): ``log E[v, u]`` indexed by the absolute successor state u; only the
  strict upper triangle inside the state length is read (−inf = no edge).
- ``state_lengths`` (B,), ``target_lengths`` (B,): integer lengths S_b ≥ 1 and 1 ≤ M_b ≤ S_b.

A path starts at state 0, ends at state ``S_b − 1`` and emits target i at its i-th state.

Implementation choice: ``SMIEXLM_DAG_IMPL=auto|matmul|reference|triton`` (default ``auto``: the
fused Triton kernels for CUDA tensors when triton is installed and they pass a self-check, the
banded matrix products of :mod:`smiexlm.dag.matmul` for CPU tensors, the log-space reference
otherwise). The self-check runs once per device and process: the kernels must compile, run and
match the reference, forward and backward, on a small problem; if they do not (no usable
compiler, a GPU the kernels were not written for), ``auto`` says why once and uses the
reference, while an explicit ``triton`` runs them regardless.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Literal

import torch

from smiexlm.dag.checks import check_inputs, check_targets
from smiexlm.dag.gather import logsoftmax_gather
from smiexlm.dag.matmul import matmul_log_likelihood
from smiexlm.dag.reference import (
    backward_beta,
    emission_posterior,
    forward_alpha,
    log_partition,
    prepare,
    reference_log_likelihood,
)
from smiexlm.dag.viterbi import viterbi_alignment
from smiexlm.errors import ConfigError

__all__ = [
    "dag_log_likelihood",
    "dag_logits_log_likelihood",
    "dag_best_alignment",
    "dag_state_posterior",
    "dag_loss",
    "resolve_impl",
]

logger = logging.getLogger(__name__)

Impl = Literal["matmul", "reference", "triton"]
IMPLS = ("auto", "matmul", "reference", "triton")
IMPL_ENV = "SMIEXLM_DAG_IMPL"


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_impl(device: torch.device) -> Impl:
    """Which implementation runs for tensors on ``device`` (honours ``SMIEXLM_DAG_IMPL``)."""
    choice = os.environ.get(IMPL_ENV, "auto").strip().lower() or "auto"
    if choice not in IMPLS:
        raise ConfigError(IMPL_ENV, choice, "one of " + ", ".join(map(repr, IMPLS)))
    if choice in ("matmul", "reference"):
        return choice
    interpret = _interpreting()
    runnable = _triton_available() and (device.type == "cuda" or interpret)
    if choice == "triton":
        if not runnable:
            raise ConfigError(
                IMPL_ENV,
                choice,
                "triton installed and CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors)",
            )
        return "triton"
    if device.type == "cpu":
        return "matmul"
    # interpreted kernels on CUDA tensors would copy every tensor to the host: use the reference
    if runnable and device.type == "cuda" and not interpret:
        return "triton" if fused_kernels_problem(device) is None else "reference"
    return "reference"


_PROBLEMS: dict[str, str | None] = {}  # device -> why the fused kernels cannot serve it


def fused_kernels_problem(device: torch.device) -> str | None:
    """Why the fused kernels cannot serve ``device`` in this process, or None when they pass
    :func:`_self_check`; checked once per device, the reason logged once."""
    key = str(device)
    if key not in _PROBLEMS:
        try:
            _PROBLEMS[key] = _self_check(device)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as err:  # a compiler, driver or launch failure: whatever triton raises
            _PROBLEMS[key] = f"{type(err).__name__}: {err}"
        if _PROBLEMS[key] is not None:
            logger.warning(
                "the fused Triton DAG kernels do not work on %s (%s): the DAG loss uses the "
                "PyTorch reference instead (%s=reference silences this, =triton forces them)",
                key, _PROBLEMS[key], IMPL_ENV,
            )  # fmt: skip
    return _PROBLEMS[key]


def _self_check(device: torch.device) -> str | None:
    """Run the fused kernels on a small problem on ``device``, forward and backward, against
    the reference; the first quantity that differs, or None."""
    from smiexlm.dag.triton_kernels import triton_log_likelihood, triton_logsoftmax_gather

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 8, 5, generator=g).to(device).requires_grad_(True)
    targets = torch.randint(0, 5, (2, 3), generator=g).to(device)
    links = torch.log_softmax(torch.randn(2, 8, 8, generator=g), 2).to(device).requires_grad_(True)
    lengths = torch.tensor([8, 5], device=device), torch.tensor([3, 2], device=device)

    def run(gather, likelihood):
        value = likelihood(gather(logits, targets), links, *lengths)
        return value, *torch.autograd.grad(value.sum(), (logits, links))

    fused = run(triton_logsoftmax_gather, triton_log_likelihood)
    reference = run(logsoftmax_gather, reference_log_likelihood)
    for name, a, b in zip(("log-likelihood", "logits gradient", "links gradient"), fused,
                          reference, strict=True):  # fmt: skip
        if not torch.allclose(a.double(), b.double(), rtol=1e-4, atol=1e-4):
            return f"their {name} differs from the reference by {(a - b).abs().max().item():.3g}"
    return None


def _interpreting() -> bool:
    """Whether the Triton kernels run in Triton's CPU interpreter. ``@triton.jit`` reads
    ``TRITON_INTERPRET`` when the kernel module is first imported, so once it is imported its
    mode decides, not the variable's current value; before that, the variable does."""
    kernels = sys.modules.get("smiexlm.dag.triton_kernels")
    if kernels is not None:
        return bool(kernels.INTERPRETED)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _trim(emissions, log_links, m_max: int, s_max: int):
    """Drop padding beyond the longest sequence; slicing keeps gradients flowing back."""
    return emissions[:, :m_max, :s_max], log_links[:, :s_max, :s_max]


def dag_log_likelihood(
    emissions: torch.Tensor,
    log_links: torch.Tensor,
    state_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """(B,) float32 log-likelihood of the targets under the DAG (float64 in, float64 out).

    −inf where a sequence has no valid path. Differentiable in ``emissions`` (B, M, L) and
    ``log_links`` (B, L, L); bf16/fp16 inputs are accepted and accumulated in fp32.
    """
    m_max, s_max = check_inputs(emissions, log_links, state_lengths, target_lengths)
    state_lengths = state_lengths.to(device=emissions.device, dtype=torch.long)
    target_lengths = target_lengths.to(device=emissions.device, dtype=torch.long)
    em, links = _trim(emissions, log_links, m_max, s_max)
    impl = resolve_impl(emissions.device)
    if impl == "triton":
        from smiexlm.dag.triton_kernels import triton_log_likelihood

        return triton_log_likelihood(em, links, state_lengths, target_lengths)
    if impl == "matmul":
        return matmul_log_likelihood(em, links, state_lengths, target_lengths)
    return reference_log_likelihood(em, links, state_lengths, target_lengths)


def dag_logits_log_likelihood(
    logits: torch.Tensor,
    targets: torch.Tensor,
    log_links: torch.Tensor,
    state_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """(B,) log-likelihood from raw logits (B, L, V) and target ids (B, M).

    Equivalent to ``dag_log_likelihood(log_softmax(logits).gather(targets), ...)`` but never
    materialises the log-softmax over V for every state: it gathers the target logits and
    subtracts a per-state logsumexp. Gradients flow to ``logits`` and ``log_links``.
    """
    if logits.dim() != 3:
        raise ConfigError("logits", tuple(logits.shape), "a (B, L, V) tensor")
    if targets.dim() != 2 or targets.shape[0] != logits.shape[0]:
        raise ConfigError(
            "targets", tuple(targets.shape), f"a (B, M) tensor with B = {logits.shape[0]}"
        )
    check_targets(targets, target_lengths, logits.shape[2])
    if resolve_impl(logits.device) == "triton":
        from smiexlm.dag.triton_kernels import triton_logsoftmax_gather as gather
    else:
        gather = logsoftmax_gather
    emissions = gather(logits, targets)  # (B, M, L)
    return dag_log_likelihood(emissions, log_links, state_lengths, target_lengths)


def dag_best_alignment(
    emissions: torch.Tensor,
    log_links: torch.Tensor,
    state_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """(B, L) long: the target index each state emits on the Viterbi path, −1 elsewhere.

    Rows of sequences without a valid path are all −1.
    """
    check_inputs(emissions, log_links, state_lengths, target_lengths)
    return viterbi_alignment(
        emissions.detach(),
        log_links.detach(),
        state_lengths.to(device=emissions.device, dtype=torch.long),
        target_lengths.to(device=emissions.device, dtype=torch.long),
    )


@torch.no_grad()
def dag_state_posterior(
    emissions: torch.Tensor,
    log_links: torch.Tensor,
    state_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> torch.Tensor:
    """(B, M, L) float: P(state u emits target i), over all paths weighted by their probability.

    Each valid target row sums to 1 over the states and each sequence to M_b; summing over i
    gives the probability that a state is on the path. Rows of sequences without a valid path
    are all 0. Computed by the reference forward-backward recursions, without gradients.
    """
    m_max, s_max = check_inputs(emissions, log_links, state_lengths, target_lengths)
    state_lengths = state_lengths.to(device=emissions.device, dtype=torch.long)
    target_lengths = target_lengths.to(device=emissions.device, dtype=torch.long)
    em, links = prepare(
        *_trim(emissions, log_links, m_max, s_max),
        state_lengths,
        target_lengths,
    )
    alpha = forward_alpha(em, links)
    beta = backward_beta(em, links, state_lengths, target_lengths)
    post = emission_posterior(alpha, beta, log_partition(alpha, state_lengths, target_lengths))
    out = post.new_zeros(emissions.shape)
    out[:, :m_max, :s_max] = post
    return out


def dag_loss(
    log_likelihood: torch.Tensor, target_lengths: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """(loss, n_invalid): mean of −log_likelihood / M_b over sequences with a finite value.

    Sequences whose log-likelihood is −inf or NaN (no valid path) are left out of the mean,
    contribute zero gradient and are counted in ``n_invalid``. With no valid sequence the loss
    is a zero that still belongs to the graph.
    """
    valid = torch.isfinite(log_likelihood)  # (B,)
    m = target_lengths.to(device=log_likelihood.device, dtype=log_likelihood.dtype)
    per_seq = torch.where(valid, -log_likelihood / m.clamp_min(1), 0.0)
    n_valid = int(valid.sum())
    loss = per_seq.sum() / max(n_valid, 1)
    return loss, log_likelihood.shape[0] - n_valid
