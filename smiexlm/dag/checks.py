"""Input validation shared by every DAG entry point: shapes, dtypes and lengths."""

from __future__ import annotations

import torch

from smiexlm.errors import ConfigError

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _first_bad(mask: torch.Tensor, values: torch.Tensor) -> tuple[int, int]:
    index = int(mask.nonzero()[0, 0])
    return index, int(values[index])


def _check_lengths(name: str, lengths: torch.Tensor, batch: int) -> torch.Tensor:
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or lengths.shape[0] != batch:
        shape = tuple(lengths.shape) if isinstance(lengths, torch.Tensor) else type(lengths)
        raise ConfigError(name, shape, f"a 1-D integer tensor of length B = {batch}")
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise ConfigError(name, lengths.dtype, "an integer dtype (torch.long or torch.int32)")
    return lengths.detach().to("cpu", torch.long)


def check_inputs(
    emissions: torch.Tensor,
    log_links: torch.Tensor,
    state_lengths: torch.Tensor,
    target_lengths: torch.Tensor,
) -> tuple[int, int]:
    """Validate the DAG inputs; return (longest target, longest state sequence)."""
    if emissions.dim() != 3:
        raise ConfigError("emissions", tuple(emissions.shape), "a (B, M, L) tensor")
    B, M, L = emissions.shape
    if emissions.dtype not in _FLOATS:
        raise ConfigError("emissions", emissions.dtype, "a floating dtype (fp16/bf16/fp32/fp64)")
    if tuple(log_links.shape) != (B, L, L):
        raise ConfigError("log_links", tuple(log_links.shape), f"shape (B, L, L) = ({B}, {L}, {L})")
    if log_links.dtype not in _FLOATS:
        raise ConfigError("log_links", log_links.dtype, "a floating dtype (fp16/bf16/fp32/fp64)")
    if log_links.device != emissions.device:
        raise ConfigError("log_links", str(log_links.device), f"device {emissions.device}")
    if B == 0:
        raise ConfigError("emissions", tuple(emissions.shape), "a batch of at least one sequence")
    s = _check_lengths("state_lengths", state_lengths, B)
    t = _check_lengths("target_lengths", target_lengths, B)
    for name, values, limit, dim in (("state_lengths", s, L, "L"), ("target_lengths", t, M, "M")):
        if (values < 1).any():
            b, v = _first_bad(values < 1, values)
            raise ConfigError(f"{name}[{b}]", v, "a length >= 1 (empty sequences have no path)")
        if (values > limit).any():
            b, v = _first_bad(values > limit, values)
            raise ConfigError(f"{name}[{b}]", v, f"a length <= {dim} = {limit} (the tensor size)")
    if (t > s).any():
        b, v = _first_bad(t > s, t)
        raise ConfigError(
            f"target_lengths[{b}]",
            v,
            f"<= state_lengths[{b}] = {int(s[b])} (each target needs its own state)",
        )
    return int(t.max()), int(s.max())


def check_targets(targets: torch.Tensor, target_lengths: torch.Tensor, vocab_size: int) -> None:
    """Target ids inside the target lengths must lie in [0, V)."""
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ConfigError("targets", targets.dtype, "an integer dtype (torch.long)")
    lengths = _check_lengths("target_lengths", target_lengths, targets.shape[0])
    t = targets.detach().cpu()
    inside = torch.arange(t.shape[1])[None, :] < lengths[:, None]
    bad = inside & ((t < 0) | (t >= vocab_size))
    if bad.any():
        b, i = (int(x) for x in bad.nonzero()[0])
        raise ConfigError(f"targets[{b}, {i}]", int(t[b, i]), f"a token id in [0, {vocab_size})")
