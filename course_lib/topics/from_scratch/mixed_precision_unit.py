"""Mixed precision in an FSDP unit: compute in bf16, keep fp32 master weights, reduce in fp32
(lesson 19's exercise, solved): what FSDP2's MixedPrecisionPolicy(param_dtype=torch.bfloat16,
reduce_dtype=torch.float32) does (torch/distributed/fsdp/_fully_shard/_fsdp_api.py).

    units = shard_units(model, MixedPrecisionUnit)
    optimizer = torch.optim.SGD([u.shard for u in units], lr=0.1)   # fp32 shards: the master weights
    loss_fn(model(X).float(), y).backward(); optimizer.step()

Against lesson 16's FSDPUnit (fsdp_unit.py), three changes:
- unshard: cast this rank's fp32 shard to bf16 at every gather (so each step's update reaches the
  compute copy) and all-gather bf16: half the bytes, and a bf16 forward and backward.
- the module's floating-point inputs are cast to bf16 before its forward (FSDP2's
  cast_forward_inputs=True), else a bf16 weight meets an fp32 input.
- post_backward: the bf16 gradient is cast up to fp32 before the reduce-scatter, so the sum over
  ranks is taken in fp32 (FSDP2's foreach_reduce allocates its reduce-scatter input in
  reduce_dtype, _fsdp_collectives.py), and lands in the fp32 shard's .grad.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from .fsdp_unit import FSDPUnit, all_gather_flat, reduce_scatter_flat


class MixedPrecisionUnit(FSDPUnit):
    param_dtype = torch.bfloat16   # what the gather, the forward and the backward run in
    reduce_dtype = torch.float32   # what the gradients are summed in: the shard's own dtype

    def __init__(self, module: nn.Module, next_unit: Optional[FSDPUnit] = None):
        super().__init__(module, next_unit)  # self.shard: fp32, the master weights
        module.register_forward_pre_hook(self._cast_inputs)

    def _cast_inputs(self, module, args):
        return tuple(a.to(self.param_dtype) if torch.is_tensor(a) and a.is_floating_point() else a
                     for a in args)

    def unshard(self, async_op: bool = False):
        low_precision = self.shard.detach().to(self.param_dtype)  # a fresh copy: this step's weights
        return all_gather_flat(self.allocate_full(self.param_dtype), low_precision, async_op=async_op)

    def post_backward(self) -> None:
        gradient = torch.empty(self.shard.numel(), dtype=self.reduce_dtype, device=self.shard.device)
        reduce_scatter_flat(gradient, self.flat_gradient().to(self.reduce_dtype))
        gradient = gradient.div_(dist.get_world_size()).to(self.shard.dtype)
        self.shard.grad = gradient if self.shard.grad is None else self.shard.grad + gradient
        self.reshard()
