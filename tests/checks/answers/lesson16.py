"""Lesson 16's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones, each one mistake away from right
(WRONG_ANSWERS, each must be rejected).
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.checks import lesson16
from course_lib.topics.from_scratch.flat_parameters import FlatParameters
from course_lib.topics.from_scratch.fsdp_unit import FSDPUnit as CourseFSDPUnit

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


# -- the FSDP unit ---------------------------------------------------------------------------------
class FSDPUnit(FlatParameters):
    """A right unit of the learner's own (not the course's): what the wrong answers below change."""

    def __init__(self, module, next_unit=None):
        super().__init__(module)
        self.next_unit = next_unit
        world_size = dist.get_world_size()
        shard_numel = (self.flat.numel() + world_size - 1) // world_size
        mine = torch.zeros(shard_numel, dtype=self.flat.dtype)
        piece = self.flat[dist.get_rank() * shard_numel:(dist.get_rank() + 1) * shard_numel]
        mine[:piece.numel()] = piece
        self.shard = torch.nn.Parameter(mine, requires_grad=self.requires_grad)

    def unshard(self, async_op=False):
        return GATHER(self.allocate_full(), self.shard.detach(), async_op=async_op)

    def reshard(self):
        self.free_full()

    def pre_forward(self):
        work, self.pending_gather = self.pending_gather, None
        if work is None:  # not prefetched: gather now
            work = self.unshard(async_op=True)
        work.wait()
        following = self.next_unit
        if following:
            following.pending_gather = following.unshard(async_op=True)

    def post_forward(self):
        self.reshard()

    def pre_backward(self):
        self.unshard()

    def post_backward(self):
        mean = torch.zeros_like(self.shard)
        SCATTER(mean, self.flat_gradient().div(dist.get_world_size()))
        self.shard.grad = mean
        self.reshard()


# -- the FSDP unit, two other ways -------------------------------------------------------------------
class UnitWithListGathersAndBackwardPrefetch(FlatParameters):
    """All-gathers into a list of views of `full`; in backward, also prefetches the unit before."""

    def __init__(self, module, next_unit=None):
        super().__init__(module)
        self.next_unit, self.previous_unit = next_unit, None
        if next_unit is not None:
            next_unit.previous_unit = self
        world_size = dist.get_world_size()
        size = -(-self.flat.numel() // world_size)
        padded = torch.zeros(size * world_size, dtype=self.flat.dtype)
        padded[:self.flat.numel()] = self.flat
        self.shard = torch.nn.Parameter(padded.chunk(world_size)[dist.get_rank()].clone(),
                                        requires_grad=self.requires_grad)

    def unshard(self, async_op=False):
        if self.full_bytes() and self.pending_gather is None:
            return None
        full = self.allocate_full()
        return dist.all_gather(list(full.chunk(dist.get_world_size())), self.shard.detach(),
                               async_op=async_op)

    def wait(self):
        if self.pending_gather is not None:
            self.pending_gather.wait()
            self.pending_gather = None

    def pre_forward(self):
        if self.pending_gather is None:
            self.unshard()
        self.wait()
        if self.next_unit is not None:
            self.next_unit.pending_gather = self.next_unit.unshard(async_op=True)

    def post_forward(self):
        self.free_full()

    def pre_backward(self):
        if self.pending_gather is None and not self.full_bytes():
            self.unshard()
        self.wait()
        before = self.previous_unit
        if before is not None and before.requires_grad and not before.full_bytes():
            before.pending_gather = before.unshard(async_op=True)

    def post_backward(self):
        gradient = self.flat_gradient()
        grad_shard = torch.zeros_like(self.shard)
        dist.reduce_scatter(grad_shard, list(gradient.chunk(dist.get_world_size())))
        self.shard.grad = grad_shard / dist.get_world_size()
        self.free_full()


class UnitGathersThroughATemporary(FSDPUnit):
    """Exercise 2's gather_full (a new tensor), copied into `full`: the temporary is dropped."""

    def unshard(self, async_op=False):
        full = self.allocate_full()
        full.copy_(gather_as_a_list(self.shard.detach()))
        return _Done() if async_op else None


class _Done:
    def wait(self):
        pass


class UnitKeepsTheLastGatheredIntoBackward(FSDPUnit):
    """FSDP2's reshard_after_forward=False for the last unit (backward needs it at once); the
    gradient divided before the reduce-scatter; an async reduce-scatter, waited at once."""

    def post_forward(self):
        if self.next_unit is not None:
            self.reshard()

    def pre_backward(self):
        if not self.full_bytes():
            self.unshard()

    def post_backward(self):
        gradient = self.flat_gradient() / dist.get_world_size()
        grad_shard = torch.empty_like(self.shard)
        SCATTER(grad_shard, gradient, async_op=True).wait()
        self.shard.grad = grad_shard
        self.reshard()


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
    lesson16.check_fsdp_unit: [
        answer("list all-gathers into views, a backward prefetch too",
               UnitWithListGathersAndBackwardPrefetch),
        answer("the last unit stays gathered into backward; divides first",
               UnitKeepsTheLastGatheredIntoBackward),
        answer("gathers into a temporary (exercise 2's way), copied into full; prefetch not async",
               UnitGathersThroughATemporary),
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


class AlwaysAdamW(_Sharded):
    """The notebook's AdamW written in: the optimizer_class it is given is never used."""

    def __init__(self, params, optimizer_class, **defaults):
        super().__init__(params, torch.optim.AdamW, **defaults)


class DropsTheArguments(_Sharded):
    """The local optimizer built with its own defaults: lr and weight_decay never reach it."""

    def __init__(self, params, optimizer_class, **defaults):
        super().__init__(params, optimizer_class)


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


def zeroes_its_shard(shard):
    """The right full tensor; then the shard, "no longer needed", is zeroed: the caller's parameters."""
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    GATHER(full, shard)
    shard.zero_()
    return full


def frees_its_shard(shard):
    """The right full tensor; then the shard's memory is freed, as FSDP frees the full parameters."""
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    GATHER(full, shard)
    shard.untyped_storage().resize_(0)
    return full


def gathers_to_rank0_only(shard):
    """dist.gather: rank 0 gets the full tensor, the others zeros."""
    world_size = dist.get_world_size()
    pieces = [torch.empty_like(shard) for _ in range(world_size)] if dist.get_rank() == 0 else None
    dist.gather(shard, pieces, dst=0)
    return torch.cat(pieces) if pieces else shard.new_zeros(shard.numel() * world_size)


# -- the FSDP unit, wrong ---------------------------------------------------------------------------
class TheCoursesUnitUnderAnotherName(CourseFSDPUnit):
    pass


class NeverFreesAfterForward(FSDPUnit):
    def post_forward(self):
        pass


class DropsItsReferenceInsteadOfFreeing(FSDPUnit):
    """Frees by forgetting `full`: autograd saved views of it for backward, so it stays in memory."""

    def reshard(self):
        self.full = None


class NeverGathersForBackward(FSDPUnit):
    def pre_backward(self):
        pass


class AllReducesTheGradient(FSDPUnit):
    def post_backward(self):
        gradient = self.flat_gradient()
        dist.all_reduce(gradient)
        size, rank = self.shard.numel(), dist.get_rank()
        self.shard.grad = gradient[rank * size:(rank + 1) * size] / dist.get_world_size()
        self.reshard()


class NeverPrefetches(FSDPUnit):
    def pre_forward(self):
        self.unshard()


class PrefetchesTwoUnitsAhead(FSDPUnit):
    def pre_forward(self):
        if self.pending_gather is not None:
            self.pending_gather.wait()
            self.pending_gather = None
        else:
            self.unshard()
        ahead = self.next_unit.next_unit if self.next_unit is not None else None
        if ahead is not None:
            ahead.pending_gather = ahead.unshard(async_op=True)


class PrefetchesThenGathersAgain(FSDPUnit):
    def pre_forward(self):
        self.unshard()  # the prefetched all-gather is never waited for: gathered twice
        if self.next_unit is not None:
            self.next_unit.pending_gather = self.next_unit.unshard(async_op=True)


class SumsTheGradients(FSDPUnit):
    def post_backward(self):
        gradient = torch.empty_like(self.shard)
        SCATTER(gradient, self.flat_gradient())
        self.shard.grad = gradient
        self.reshard()


def _pad_a_whole_row_when_divisible(unit, module, next_unit):
    FlatParameters.__init__(unit, module)
    unit.next_unit = next_unit
    world_size = dist.get_world_size()
    padded = F.pad(unit.flat, (0, world_size - unit.flat.numel() % world_size))  # never 0
    size = padded.numel() // world_size
    unit.shard = torch.nn.Parameter(padded[dist.get_rank() * size:][:size].clone(),
                                    requires_grad=unit.requires_grad)


class PadsAWholeRowWhenDivisible(FSDPUnit):
    __init__ = _pad_a_whole_row_when_divisible


class KeepsAViewOfTheWhole(FSDPUnit):
    """The right values, but the shard is a slice of the whole padded tensor: a view that keeps
    all of it alive on every rank."""

    def __init__(self, module, next_unit=None):
        super().__init__(module, next_unit)
        world_size = dist.get_world_size()
        padded = torch.nn.functional.pad(self.flat.detach(), (0, -self.flat.numel() % world_size))
        size = padded.numel() // world_size
        self.shard = torch.nn.Parameter(padded[dist.get_rank() * size:][:size],
                                        requires_grad=self.requires_grad)


class ShardsWithoutPadding(FSDPUnit):
    """Floor division: the last few parameters belong to no shard."""

    def __init__(self, module, next_unit=None):
        FlatParameters.__init__(self, module)
        self.next_unit = next_unit
        size = self.flat.numel() // dist.get_world_size()
        self.shard = torch.nn.Parameter(self.flat[dist.get_rank() * size:][:size].clone(),
                                        requires_grad=self.requires_grad)


class NeverFreesAfterBackward(FSDPUnit):
    """Reduce-scatters its gradient, but keeps the full parameters pre_backward gathered."""

    def post_backward(self):
        mean = torch.zeros_like(self.shard)
        SCATTER(mean, self.flat_gradient().div(dist.get_world_size()))
        self.shard.grad = mean


class DividesByTwo(FSDPUnit):
    """The notebook's 2 ranks written in: the reduce-scattered sum divided by 2."""

    def post_backward(self):
        mean = torch.zeros_like(self.shard)
        SCATTER(mean, self.flat_gradient().div(2))
        self.shard.grad = mean
        self.reshard()


class ShardsForTwoRanks(FSDPUnit):
    """Padded and split for 2 ranks, whatever the world size."""

    def __init__(self, module, next_unit=None):
        FlatParameters.__init__(self, module)
        self.next_unit = next_unit
        size = -(-self.flat.numel() // 2)
        padded = F.pad(self.flat.detach(), (0, 2 * size - self.flat.numel()))
        self.shard = torch.nn.Parameter(padded[dist.get_rank() * size:][:size].clone(),
                                        requires_grad=self.requires_grad)


WRONG_ANSWERS = {
    lesson16.check_sharded_optimizer: [
        wrong_answer("every rank steps every parameter: no sharding", EveryRankStepsEverything),
        wrong_answer("shares overlap in one parameter", SharesOverlap),
        wrong_answer("no rank owns the last parameter", MissesTheLastParameter),
        wrong_answer("never sends the updated share to the others", NeverSendsTheUpdate),
        wrong_answer("the course's ShardedOptimizer", course_sharded_optimizer),
        wrong_answer("torch's ZeroRedundancyOptimizer under another name", TorchsZeroUnderAnotherName),
        wrong_answer("AdamW written in, whatever optimizer_class is given", AlwaysAdamW),
        wrong_answer("the optimizer's arguments never passed on", DropsTheArguments),
    ],
    lesson16.check_gather_full: [
        wrong_answer("its own shard, repeated: no communication", repeat_own_shard),
        wrong_answer("sums the shards (all-reduce)", sum_the_shards),
        wrong_answer("the shards in reverse rank order", reversed_order),
        wrong_answer("a float32 tensor whatever the shard's dtype", always_float32),
        wrong_answer("zeroes the caller's shard after gathering", zeroes_its_shard),
        wrong_answer("frees the caller's shard after gathering", frees_its_shard),
        wrong_answer("dist.gather: the full tensor on rank 0 only", gathers_to_rank0_only),
    ],
    lesson16.check_fsdp_unit: [
        wrong_answer("never frees the full parameters after forward", NeverFreesAfterForward),
        wrong_answer("frees by dropping its reference (autograd keeps them)",
                     DropsItsReferenceInsteadOfFreeing),
        wrong_answer("never gathers again for backward", NeverGathersForBackward),
        wrong_answer("all-reduces the gradient, then slices its part", AllReducesTheGradient),
        wrong_answer("no prefetch", NeverPrefetches),
        wrong_answer("prefetches the unit two ahead", PrefetchesTwoUnitsAhead),
        wrong_answer("prefetches, then gathers again", PrefetchesThenGathersAgain),
        wrong_answer("sums the gradients instead of averaging", SumsTheGradients),
        wrong_answer("pads a whole extra row when the size divides", PadsAWholeRowWhenDivisible),
        wrong_answer("shards without padding (floor division)", ShardsWithoutPadding),
        wrong_answer("the course's FSDPUnit under another name", TheCoursesUnitUnderAnotherName),
        wrong_answer("the shard a view of the whole padded tensor", KeepsAViewOfTheWhole),
        wrong_answer("keeps the full parameters after backward", NeverFreesAfterBackward),
        wrong_answer("the gradient divided by 2, not the world size", DividesByTwo),
        wrong_answer("shards sized for 2 ranks", ShardsForTwoRanks),
    ],
}
