"""Sequence parallelism around a tensor-parallel MLP: outside the TP region each rank holds only
its 1/world_size of the sequence (LayerNorm, dropout and the residual run on that shard), so
activations there take 1/world_size of the memory. The all-reduce becomes its two halves:

    x_shard -> LayerNorm -> GatherSequence (all-gather; backward: reduce-scatter) -> fc1 columns
      -> gelu -> fc2 rows -> ScatterSequence (reduce-scatter; backward: all-gather) -> + bias
      -> dropout -> + x_shard

An all-reduce is a reduce-scatter followed by an all-gather, so the bytes sent are the same as TP's.
The replicated parameters (LayerNorm's, fc2's bias) now see only this rank's tokens: their
gradients are partial, and finish_gradient_sync() sums them.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .tensor_parallel import shard

all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def gather_sequence(x_shard):
    full = x_shard.new_empty((x_shard.shape[0] * dist.get_world_size(), *x_shard.shape[1:]))
    all_gather_flat(full, x_shard.contiguous())
    return full


def scatter_sequence(x):
    x_shard = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
    reduce_scatter_flat(x_shard, x.contiguous())
    return x_shard


class GatherSequence(torch.autograd.Function):
    """Forward: every rank's sequence shard, joined. Backward: each rank's gradient of the whole
    sequence is a partial sum; reduce-scatter sums it and hands each rank its shard's part."""

    @staticmethod
    def forward(ctx, x_shard):
        return gather_sequence(x_shard)

    @staticmethod
    def backward(ctx, grad):
        return scatter_sequence(grad)


class ScatterSequence(torch.autograd.Function):
    """Forward: sum the partial results and keep this rank's shard. Backward: the shard's gradient
    from every rank, joined (each rank's columns need the whole sequence's)."""

    @staticmethod
    def forward(ctx, partial):
        return scatter_sequence(partial)

    @staticmethod
    def backward(ctx, grad_shard):
        return gather_sequence(grad_shard)


class SequenceParallelMLP(nn.Module):
    """transformer_parts.Block split: the MLP tensor-parallel, the rest on sequence shards."""

    def __init__(self, block):
        super().__init__()
        self.norm = block.norm                  # replicated: the same on every rank
        self.dropout = block.dropout            # on the shard: each rank its own random mask
        self.fc1_weight, self.fc1_bias = shard(block.mlp.fc1.weight, 0), shard(block.mlp.fc1.bias, 0)
        self.fc2_weight = shard(block.mlp.fc2.weight, 1)
        self.fc2_bias = block.mlp.fc2.bias      # replicated, added on the shard

    def forward(self, x_shard):
        h = GatherSequence.apply(self.norm(x_shard))  # no CopyToParallel: the gather's backward sums
        h = F.gelu(F.linear(h, self.fc1_weight, self.fc1_bias))
        h = ScatterSequence.apply(F.linear(h, self.fc2_weight)) + self.fc2_bias
        return x_shard + self.dropout(h)

    def replicated(self):
        return [*self.norm.parameters(), self.fc2_bias]

    def finish_gradient_sync(self):
        """Each rank's gradient of a replicated parameter covers its tokens only: sum them."""
        for param in self.replicated():
            dist.all_reduce(param.grad)
