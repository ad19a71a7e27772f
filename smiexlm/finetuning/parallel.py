"""Data parallel fine-tuning: one run spread over N processes (cores or GPUs).

Every process holds the whole model and the whole data, draws the same batch order (the
same seed) and computes its share of each batch: rows ``rank::N`` of the length-sorted batch,
so each share has molecules of the same lengths. The loss of a share is weighted by its
share of the batch's present labels, and the gradients are summed over the processes: the
objective is the one-process objective (the mean over the batch's present labels), with
other dropout masks. After the summed gradients every process takes the same step, so the
weights stay equal everywhere (checked after each epoch). Validation rows are split the same
way and gathered. Only rank 0 writes.

Started by ``smiexlm finetune --processes N`` (which starts N copies of itself, see
:func:`smiexlm.training.distributed.launch_local`) or by ``torchrun``.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from smiexlm.errors import SmiexlmError
from smiexlm.tokenizer.special import IGNORE_INDEX
from smiexlm.training.distributed import init, shutdown
from smiexlm.training.ranks import DistInfo, detect

#: the dropout generator of rank r > 0 is seeded with seed + r * RANK_SEED_STRIDE
RANK_SEED_STRIDE = 1_000_003


class ReplicaDriftError(SmiexlmError, RuntimeError):
    """The processes' weights differ after an epoch (they must take identical steps)."""


@dataclass
class Replicas:
    """This process's place among the replicas of one run (one process: world 1)."""

    info: DistInfo

    @classmethod
    def join(cls, device: torch.device) -> Replicas:
        """This process's place; under torchrun, the process group joined here (when no one
        has yet) stays for the process's life and is destroyed as the process ends, before
        the interpreter's own teardown: a gloo group still alive then can abort a process
        whose work is done (``terminate called without an active exception``)."""
        info = detect()
        if init(info, device):
            atexit.register(shutdown)
        return cls(info)

    @property
    def world(self) -> int:
        return self.info.world_size

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def is_main(self) -> bool:
        return self.info.is_main

    def share(self, index: np.ndarray) -> np.ndarray:
        """This process's rows of a batch (every N-th of the length-sorted rows)."""
        return index if self.world == 1 else index[self.rank :: self.world]

    def seed_dropout(self, seed: int) -> None:
        """Give each process its own dropout masks (rank 0 keeps the one-process stream)."""
        if self.rank:
            torch.manual_seed(seed + self.rank * RANK_SEED_STRIDE)

    def broadcast(self, model: nn.Module) -> None:
        """Rank 0's weights everywhere (they start equal; this makes it certain)."""
        if self.world > 1:
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, 0)

    def sum_gradients(self, params: list[nn.Parameter]) -> None:
        """Sum every trainable gradient over the processes, in one flat buffer."""
        if self.world == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.dtype)
            offset += n

    def sum_floats(self, values: list[float]) -> list[float]:
        """A few numbers summed over the processes (themselves in one process)."""
        if self.world == 1:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def gather_rows(self, values: np.ndarray, n: int) -> np.ndarray:
        """(n, C) from each process's rows ``rank::N`` of an (n, C) output."""
        if self.world == 1:
            return values
        width = torch.tensor(values.shape[1])  # 0 where a process had no rows
        dist.all_reduce(width, op=dist.ReduceOp.MAX)
        width = int(width)
        size = -(-n // self.world)  # rows of rank 0, the most any rank has
        mine = torch.zeros(size, width, dtype=torch.float32)
        if len(values):
            mine[: len(values)] = torch.from_numpy(values)
        parts = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(parts, mine)
        out = np.zeros((n, width), dtype=np.float32)
        for rank, part in enumerate(parts):
            rows = np.arange(rank, n, self.world)
            out[rows] = part[: len(rows)].numpy()
        return out

    def gather_rng(self) -> list[Tensor]:
        """Every process's torch CPU generator state, in rank order."""
        state = torch.get_rng_state()
        if self.world == 1:
            return [state]
        parts = [torch.zeros_like(state) for _ in range(self.world)]
        dist.all_gather(parts, state)
        return parts

    def check_same_weights(self, model: nn.Module) -> None:
        """Raise when the processes' weights have drifted apart."""
        if self.world == 1:
            return
        with torch.no_grad():
            total = torch.stack([p.double().sum() for p in model.parameters()]).sum()
        low, high = total.clone(), total.clone()
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if low.item() != high.item():
            raise ReplicaDriftError(
                f"the {self.world} processes' weights differ after an epoch "
                f"(checksums {low.item()!r} to {high.item()!r})"
            )


def present_labels(targets: Tensor | None) -> int:
    """Labels a loss is averaged over: non-NaN floats, or class ids other than IGNORE_INDEX."""
    if targets is None:
        return 0
    if targets.is_floating_point():
        return int((~torch.isnan(targets)).sum())
    return int((targets != IGNORE_INDEX).sum())
