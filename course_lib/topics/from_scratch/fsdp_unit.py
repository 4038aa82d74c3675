"""An FSDP unit: one module's parameters sharded over the ranks, gathered only while it computes
(lesson 16's exercise, solved). The hooks have FSDP2's names (torch/distributed/fsdp/_fully_shard/
_fsdp_param_group.py: unshard, wait_for_unshard, reshard, pre_forward ... post_backward).

    units = shard_units(model, FSDPUnit)        # one unit per child with parameters, in order
    optimizer = torch.optim.SGD([u.shard for u in units], lr=0.1)
    loss_fn(model(X), y).backward(); optimizer.step()

- __init__: flatten, zero-pad to a multiple of world_size, keep slice `rank` (an nn.Parameter).
- pre_forward: all-gather the shards into `full` (or wait for the all-gather the previous unit
  started), then start the next unit's all-gather (async: it runs while this unit computes).
- post_forward: free `full`. pre_backward: gather it again. post_backward: reduce-scatter the full
  gradient (each rank receives the sum of its own slice), divide by world_size, free `full`.
"""
from __future__ import annotations

from typing import List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .flat_parameters import FlatParameters


def all_gather_flat(output, input, async_op=False):
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch < 2.13
    return gather(output, input, async_op=async_op)


def reduce_scatter_flat(output, input, async_op=False):
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # torch < 2.13
    return scatter(output, input, async_op=async_op)


class FSDPUnit(FlatParameters):
    def __init__(self, module: nn.Module, next_unit: Optional["FSDPUnit"] = None):
        super().__init__(module)
        self.next_unit = next_unit
        rank, world_size = dist.get_rank(), dist.get_world_size()
        padded = F.pad(self.flat, (0, -self.flat.numel() % world_size))
        size = padded.numel() // world_size
        self.shard = nn.Parameter(padded[rank * size:(rank + 1) * size].clone(),
                                  requires_grad=self.requires_grad)

    def unshard(self, async_op: bool = False):
        """All-gather every rank's shard into self.full; the Work when async_op."""
        return all_gather_flat(self.allocate_full(), self.shard.detach(), async_op=async_op)

    def reshard(self) -> None:
        self.free_full()

    def pre_forward(self) -> None:
        if self.pending_gather is not None:  # the previous unit prefetched this one
            self.pending_gather.wait()
            self.pending_gather = None
        else:
            self.unshard()
        if self.next_unit is not None:
            self.next_unit.pending_gather = self.next_unit.unshard(async_op=True)

    def post_forward(self) -> None:
        self.reshard()

    def pre_backward(self) -> None:
        self.unshard()

    def post_backward(self) -> None:
        gradient = torch.empty_like(self.shard)
        reduce_scatter_flat(gradient, self.flat_gradient())
        gradient /= dist.get_world_size()
        self.shard.grad = gradient if self.shard.grad is None else self.shard.grad + gradient
        self.reshard()


def shard_units(model: nn.Module, unit_class=FSDPUnit) -> List[FlatParameters]:
    """One unit_class(child, next_unit) per child of `model` that has parameters, in order
    (built last to first, so each knows the next); the units, first to last."""
    units, next_unit = [], None
    for child in reversed([c for c in model.children() if next(c.parameters(), None) is not None]):
        next_unit = unit_class(child, next_unit)
        units.append(next_unit)
    return units[::-1]
