"""Lesson 16's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones, each one mistake away from right
(WRONG_ANSWERS, each must be rejected).
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.checks import lesson16

from . import answer, wrong_answer

# torch 2.13 renamed these (the old names still work, with a warning)
GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


# -- ZeRO-1, two other ways ------------------------------------------------------------------------
class ShardedBySizeWithAsyncBroadcasts:
    """Largest parameters first, each to the rank with the fewest elements; async broadcasts."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [p for p in params if p.requires_grad]
        load, self.owner = [0] * dist.get_world_size(), {}
        for param in sorted(self.params, key=lambda p: -p.numel()):
            rank = load.index(min(load))
            self.owner[param], load[rank] = rank, load[rank] + param.numel()
        mine = [p for p in self.params if self.owner[p] == dist.get_rank()]
        self.local_optimizer = optimizer_class(mine, **defaults)

    def step(self):
        self.local_optimizer.step()
        works = [dist.broadcast(p.data, src=self.owner[p], async_op=True) for p in self.params]
        for work in works:
            work.wait()

    def zero_grad(self):
        for param in self.params:
            param.grad = None


class ShardedByRoundRobinOverSortedSizes:
    """Parameters sorted by size, largest first, dealt round-robin (every rank owns some); the
    local optimizer's step, then one broadcast per parameter from its owner, over a flat view."""

    def __init__(self, params, optimizer_class, **defaults):
        self.params = [p for p in params if p.requires_grad]
        world_size = dist.get_world_size()
        order = sorted(range(len(self.params)), key=lambda i: (-self.params[i].numel(), i))
        self.owner = {self.params[i]: turn % world_size for turn, i in enumerate(order)}
        self.local_optimizer = optimizer_class(
            [p for p in self.params if self.owner[p] == dist.get_rank()], **defaults)

    @torch.no_grad()
    def step(self):
        self.local_optimizer.step()
        for param in self.params:
            flat = param.view(-1)
            dist.broadcast(flat, src=self.owner[param])

    def zero_grad(self):
        for param in self.params:
            param.grad = None


# -- gather, two other ways ------------------------------------------------------------------------
def gather_as_a_list(shard):
    pieces = [torch.zeros_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, shard)
    return torch.cat(pieces)


def gather_by_summing_placed_shards(shard):
    full = shard.new_zeros(shard.numel() * dist.get_world_size())
    rank = dist.get_rank()
    full[rank * shard.numel():(rank + 1) * shard.numel()] = shard
    dist.all_reduce(full)
    return full


# -- an FSDP layer, two other ways -----------------------------------------------------------------
def _gather_chunks(shard):
    chunks = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(chunks, shard)
    return torch.cat(chunks)


class LinearRecomputedByAutograd(torch.autograd.Function):
    """Backward runs autograd on the layer again, from gathered leaves; list-form collectives."""

    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        ctx.save_for_backward(x, shard)
        ctx.shape = (out_features, in_features)
        full = _gather_chunks(shard)
        n = out_features * in_features
        return F.linear(x, full[:n].view(out_features, in_features), full[n:n + out_features])

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        (out_features, in_features), n = ctx.shape, ctx.shape[0] * ctx.shape[1]
        with torch.enable_grad():
            full = _gather_chunks(shard).requires_grad_(ctx.needs_input_grad[1])
            x_leaf = x.detach().requires_grad_(True)
            y = F.linear(x_leaf, full[:n].view(out_features, in_features), full[n:n + out_features])
            inputs = (x_leaf, full) if ctx.needs_input_grad[1] else (x_leaf,)
            grads = torch.autograd.grad(y, inputs, grad_out)
        if not ctx.needs_input_grad[1]:
            return grads[0], None, None, None
        world_size = dist.get_world_size()
        chunks = list((grads[1] / world_size).chunk(world_size))
        grad_shard = torch.empty_like(shard)
        dist.reduce_scatter(grad_shard, chunks)
        return grads[0], grad_shard, None, None


class LinearWithEinsumAndAGradientForEveryInput(torch.autograd.Function):
    """Gradients by einsum, the mean taken before the reduce-scatter."""

    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        ctx.save_for_backward(x, shard)
        ctx.dims = (out_features, in_features)
        full = torch.empty(shard.numel() * dist.get_world_size())
        GATHER(full, shard)
        weight = full[:out_features * in_features].reshape(out_features, in_features)
        return torch.einsum("bi,oi->bo", x, weight) + full[out_features * in_features:][:out_features]

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        out_features, in_features = ctx.dims
        full = torch.empty(shard.numel() * dist.get_world_size())
        GATHER(full, shard)
        weight = full[:out_features * in_features].reshape(out_features, in_features)
        grad_x = torch.einsum("bo,oi->bi", grad_out, weight)
        if not ctx.needs_input_grad[1]:
            return grad_x, None, None, None
        flat = torch.cat([torch.einsum("bo,bi->oi", grad_out, x).flatten(), grad_out.sum(0)])
        flat = F.pad(flat, (0, full.numel() - flat.numel())) / dist.get_world_size()
        grad_shard = torch.zeros_like(shard)
        SCATTER(grad_shard, flat)
        return grad_x, grad_shard, None, None


ALTERNATIVES = {
    lesson16.check_sharded_optimizer: [
        answer("by size, async broadcasts", ShardedBySizeWithAsyncBroadcasts),
        answer("sorted by size, dealt round-robin, broadcasts of flat views",
               ShardedByRoundRobinOverSortedSizes),
    ],
    lesson16.check_gather_full: [
        answer("dist.all_gather into a list, torch.cat", gather_as_a_list),
        answer("each shard placed in zeros, then all-reduced", gather_by_summing_placed_shards),
    ],
    lesson16.check_sharded_linear: [
        answer("autograd recomputes the layer in backward; list collectives",
               LinearRecomputedByAutograd),
        answer("einsum, the mean before the reduce-scatter", LinearWithEinsumAndAGradientForEveryInput),
    ],
}


# Wrong answers, each one mistake away from right

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


def course_sharded_optimizer(params, optimizer_class, **defaults):
    from course_lib.topics.from_scratch import ShardedOptimizer
    return ShardedOptimizer(params, optimizer_class, **defaults)


class TorchsZeroUnderAnotherName:
    """torch's ZeroRedundancyOptimizer, its local optimizer renamed to what the exercise asks."""

    def __init__(self, params, optimizer_class, **defaults):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        self.zero = ZeroRedundancyOptimizer(params, optimizer_class=optimizer_class, **defaults)
        self.local_optimizer = self.zero.optim

    def step(self):
        self.zero.step()

    def zero_grad(self):
        self.zero.zero_grad()


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


WRONG_ANSWERS = {
    lesson16.check_sharded_optimizer: [
        wrong_answer("every rank steps every parameter: no sharding", EveryRankStepsEverything),
        wrong_answer("shares overlap in one parameter", SharesOverlap),
        wrong_answer("no rank owns the last parameter", MissesTheLastParameter),
        wrong_answer("never sends the updated share to the others", NeverSendsTheUpdate),
        wrong_answer("the course's ShardedOptimizer", course_sharded_optimizer),
        wrong_answer("torch's ZeroRedundancyOptimizer under another name", TorchsZeroUnderAnotherName),
    ],
    lesson16.check_gather_full: [
        wrong_answer("its own shard, repeated: no communication", repeat_own_shard),
        wrong_answer("sums the shards (all-reduce)", sum_the_shards),
        wrong_answer("the shards in reverse rank order", reversed_order),
        wrong_answer("a float32 tensor whatever the shard's dtype", always_float32),
    ],
    lesson16.check_sharded_linear: [
        wrong_answer("keeps the full parameters from forward to backward",
                     KeepsFullParametersForBackward),
        wrong_answer("gathers again for backward, but keeps the forward's on ctx",
                     HoldsFullParametersOnCtx),
        wrong_answer("all-reduces the gradient, then slices it", AllReducesGradients),
        wrong_answer("sums the gradients instead of averaging", SumsGradients),
        wrong_answer("keeps its own slice of its local gradient", LocalGradientOnly),
    ],
}
