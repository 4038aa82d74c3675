"""Plausible wrong answers to lesson 16's exercises (ZeRO-1, an FSDP layer), each one mistake away
from right. The graders must reject every one (tests/checks/test_checks.py runs WRONG_ANSWERS).
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

# torch 2.13 renamed these (the old names still work, with a warning)
GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# -- ZeRO-1 ----------------------------------------------------------------------------------------
class _Sharded:
    """Right, but for what a subclass changes: parameter i belongs to rank i % world_size."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [p for p in params if p.requires_grad]
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.owner = [index % self.world_size for index in range(len(self.params))]
        self.local_optimizer = optimizer_class(self._mine(), **defaults)

    def _mine(self):
        return [p for p, owner in zip(self.params, self.owner) if owner == self.rank]

    def step(self):
        self.local_optimizer.step()
        self._send()

    def _send(self):
        for param, owner in zip(self.params, self.owner):
            dist.broadcast(param.data, src=owner)

    def zero_grad(self):
        for param in self.params:
            param.grad = None


class EveryRankStepsEverything(_Sharded):
    def _mine(self):
        return list(self.params)


class SharesOverlap(_Sharded):
    def _mine(self):
        mine = super()._mine()
        return mine if any(p is self.params[0] for p in mine) else [self.params[0]] + mine


class MissesTheLastParameter(_Sharded):
    def _mine(self):
        return [p for p in super()._mine() if p is not self.params[-1]]

    def _send(self):
        for param, owner in list(zip(self.params, self.owner))[:-1]:
            dist.broadcast(param.data, src=owner)


class NeverSendsTheUpdate(_Sharded):
    def _send(self):
        pass


# -- gathering a layer's parameters ----------------------------------------------------------------
def repeat_own_shard(shard):
    return shard.repeat(dist.get_world_size())


def sum_the_shards(shard):
    total = shard.clone()
    dist.all_reduce(total)
    return total.repeat(dist.get_world_size())


def reversed_order(shard):
    pieces = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, shard)
    return torch.cat(pieces[::-1])


def always_float32(shard):
    full = torch.empty(shard.numel() * dist.get_world_size())
    GATHER(full, shard.float())
    return full


# -- an FSDP layer ---------------------------------------------------------------------------------
def _gather(shard):
    full = torch.empty(shard.numel() * dist.get_world_size(), dtype=shard.dtype)
    GATHER(full, shard)
    return full


def _split(full, out_features, in_features):
    n = out_features * in_features
    return full[:n].view(out_features, in_features), full[n:n + out_features]


class _ShardedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        weight, bias = _split(_gather(shard), out_features, in_features)
        ctx.save_for_backward(x, shard)
        ctx.shape = (out_features, in_features)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        full = _gather(shard)
        return _gradients(ctx, grad_out, x, shard, full, _reduce_scatter_mean)


def _gradients(ctx, grad_out, x, shard, full, reduce):
    weight, _ = _split(full, *ctx.shape)
    grad_shard = None
    if ctx.needs_input_grad[1]:
        grad_full = torch.zeros_like(full)
        grad_weight, grad_bias = _split(grad_full, *ctx.shape)
        grad_weight.copy_(grad_out.T @ x)
        grad_bias.copy_(grad_out.sum(0))
        grad_shard = reduce(grad_full, shard)
    return grad_out @ weight, grad_shard, None, None


def _reduce_scatter_mean(grad_full, shard):
    grad_shard = torch.empty_like(shard)
    SCATTER(grad_shard, grad_full)
    return grad_shard / dist.get_world_size()


class KeepsFullParametersForBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        full = _gather(shard)
        ctx.save_for_backward(x, shard, full)
        ctx.shape = (out_features, in_features)
        return F.linear(x, *_split(full, out_features, in_features))

    @staticmethod
    def backward(ctx, grad_out):
        x, shard, full = ctx.saved_tensors
        return _gradients(ctx, grad_out, x, shard, full, _reduce_scatter_mean)


class HoldsFullParametersOnCtx(_ShardedLinear):
    """Gathers again for backward, but its ctx still holds the forward's full parameters."""

    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        ctx.save_for_backward(x, shard)
        ctx.shape, ctx.full = (out_features, in_features), _gather(shard)
        return F.linear(x, *_split(ctx.full, out_features, in_features))


def _all_reduce_then_slice(grad_full, shard):
    dist.all_reduce(grad_full)
    rank = dist.get_rank()
    return grad_full[rank * shard.numel():(rank + 1) * shard.numel()] / dist.get_world_size()


def _reduce_scatter_sum(grad_full, shard):
    grad_shard = torch.empty_like(shard)
    SCATTER(grad_shard, grad_full)
    return grad_shard


class AllReducesGradients(_ShardedLinear):
    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        return _gradients(ctx, grad_out, x, shard, _gather(shard), _all_reduce_then_slice)


class SumsGradients(_ShardedLinear):
    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        return _gradients(ctx, grad_out, x, shard, _gather(shard), _reduce_scatter_sum)


class LocalGradientOnly(_ShardedLinear):
    """Takes its own slice of its local gradient: no communication in backward."""

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        rank = dist.get_rank()
        return _gradients(ctx, grad_out, x, shard, _gather(shard),
                          lambda full, shard: full[rank * shard.numel():(rank + 1) * shard.numel()].clone())
