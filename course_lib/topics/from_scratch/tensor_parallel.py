"""Tensor parallelism from collectives: a Linear split by its output features (column-parallel) or
by its input features (row-parallel), joined by two autograd Functions that are each other's twin.

    x -> CopyToParallel -> ColumnParallelLinear -> (gelu, attention: per rank, on its own part)
      -> RowParallelLinear (ReduceFromParallel inside) -> y, whole on every rank

Forward: one all-reduce (the row layer's partial sums). Backward: one all-reduce (the gradient of
x, to which every rank's columns contributed a part). Same code on gloo and on NCCL. `group`: the
ranks that share the layer (the TP group of a 2-D mesh, lesson 20); None, every rank (lesson 17).
"""
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class CopyToParallel(torch.autograd.Function):
    """Forward: x as it is (every rank already holds all of it). Backward: each rank holds only
    its columns' part of dL/dx; the all-reduce sums the parts."""

    @staticmethod
    def forward(ctx, x, group=None):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()  # autograd's tensor: sum into our own
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromParallel(torch.autograd.Function):
    """Forward: sum every rank's partial result. Backward: dL/dy is the same on every rank, and
    each rank's part of y needs all of it: pass it through."""

    @staticmethod
    def forward(ctx, partial, group=None):
        total = partial.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def shard(tensor, dim: int, group=None):
    """This rank's contiguous 1/size of `tensor` along `dim` (its place in `group`), a new leaf Parameter."""
    piece = tensor.detach().chunk(dist.get_world_size(group), dim)[dist.get_rank(group)]
    return nn.Parameter(piece.clone())


class ColumnParallelLinear(nn.Module):
    """linear's rows of weight (its output features) and of bias, 1/size of `group` each."""

    def __init__(self, linear: nn.Linear, group=None):
        super().__init__()
        self.group = group
        self.weight, self.bias = shard(linear.weight, 0, group), shard(linear.bias, 0, group)

    def forward(self, x):
        return F.linear(CopyToParallel.apply(x, self.group), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """linear's columns of weight (its input features); the bias whole, added once, after the sum."""

    def __init__(self, linear: nn.Linear, group=None):
        super().__init__()
        self.group = group
        self.weight = shard(linear.weight, 1, group)
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x_part):
        return ReduceFromParallel.apply(F.linear(x_part, self.weight), self.group) + self.bias


def split_mlp(mlp, column=ColumnParallelLinear, row=RowParallelLinear):
    """The MLP with fc1 column-parallel and fc2 row-parallel: gelu runs on each rank's columns."""
    split = copy.deepcopy(mlp)
    split.fc1, split.fc2 = column(mlp.fc1), row(mlp.fc2)
    return split


def split_attention(attention, column=ColumnParallelLinear, row=RowParallelLinear):
    """The attention with its heads dealt out: qkv column-parallel (whole heads per rank), the
    output projection row-parallel. Heads are independent, so each rank attends on its own."""
    split = copy.deepcopy(attention)
    split.qkv, split.out = column(attention.qkv), row(attention.out)
    return split
