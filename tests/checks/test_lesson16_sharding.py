"""Lesson 16's graders (ZeRO-1, an FSDP layer): correct answers written differently from the
solution, and the watch the FSDP grader stands on.

LESSON16_ALTERNATIVES are listed for every grader in tests/checks/test_checks_alternatives.py;
the wrong answers are lesson16.WRONG_ANSWERS (tests/checks/test_checks.py).
"""
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib import launch
from course_lib.checks import lesson16
from course_lib.checks.sharding import WatchSharding

pytestmark = pytest.mark.timeout(300)


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


def course_sharded_optimizer(params, optimizer_class, **defaults):
    from course_lib.topics.from_scratch import ShardedOptimizer
    return ShardedOptimizer(params, optimizer_class, **defaults)


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
        lesson16.mistakes.GATHER(full, shard)
        weight = full[:out_features * in_features].reshape(out_features, in_features)
        return torch.einsum("bi,oi->bo", x, weight) + full[out_features * in_features:][:out_features]

    @staticmethod
    def backward(ctx, grad_out):
        x, shard = ctx.saved_tensors
        out_features, in_features = ctx.dims
        full = torch.empty(shard.numel() * dist.get_world_size())
        lesson16.mistakes.GATHER(full, shard)
        weight = full[:out_features * in_features].reshape(out_features, in_features)
        grad_x = torch.einsum("bo,oi->bi", grad_out, weight)
        if not ctx.needs_input_grad[1]:
            return grad_x, None, None, None
        flat = torch.cat([torch.einsum("bo,bi->oi", grad_out, x).flatten(), grad_out.sum(0)])
        flat = F.pad(flat, (0, full.numel() - flat.numel())) / dist.get_world_size()
        grad_shard = torch.zeros_like(shard)
        lesson16.mistakes.SCATTER(grad_shard, flat)
        return grad_x, grad_shard, None, None


def _answer(description, *args):
    return pytest.param(args, {}, id=description)


LESSON16_ALTERNATIVES = {
    lesson16.check_sharded_optimizer: [
        _answer("by size, async broadcasts", ShardedBySizeWithAsyncBroadcasts),
        _answer("the course's ShardedOptimizer (a torch.optim.Optimizer)", course_sharded_optimizer),
    ],
    lesson16.check_gather_full: [
        _answer("dist.all_gather into a list, torch.cat", gather_as_a_list),
        _answer("each shard placed in zeros, then all-reduced", gather_by_summing_placed_shards),
    ],
    lesson16.check_sharded_linear: [
        _answer("autograd recomputes the layer in backward; list collectives",
                LinearRecomputedByAutograd),
        _answer("einsum, the mean before the reduce-scatter", LinearWithEinsumAndAGradientForEveryInput),
    ],
}


# -- the watch -------------------------------------------------------------------------------------
def _gather_twice(keep_first):
    shard = torch.ones(3)
    with WatchSharding() as watch:
        first = torch.empty(6)
        lesson16.mistakes.GATHER(first, shard)
        kept = first if keep_first else None
        del first
        second = torch.empty(6)
        lesson16.mistakes.GATHER(second, shard)
    del kept, second
    return [event[3] for event in watch.events]


def test_the_watch_sees_a_gathered_tensor_still_alive():
    assert launch(_gather_twice, False, nprocs=2, timeout=60, output="none") == [[0, 0], [0, 0]]
    assert launch(_gather_twice, True, nprocs=2, timeout=60, output="none") == [[0, 1], [0, 1]]


def test_a_weakref_sees_a_tensor_freed_at_once():
    tensor = torch.empty(4)
    ref = weakref.ref(tensor)
    del tensor
    assert ref() is None
