"""Lesson 11, exercise 2: what each rank holds, counted on the ranks.

The learner's held_bytes(model, optimizer) runs inside real gloo ranks, after one AdamW step of the
course's MLP (a hidden width drawn from grading_seed) under DDP, DDP + ZeroRedundancyOptimizer and
fully_shard, on 2 and then 3 ranks (uneven shards), and returns the bytes this rank holds in
parameters, gradients and optimizer state. Its numbers cross as plain data and are compared here
with the grader's own count from the tensors' shapes: the same on every machine and run, so exact.
A call of the library's measure_model_state (or its helpers) is the library's count, not the
learner's.
"""
import math
import numbers

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...topics.memory import (
    distinct_bytes,
    measure_model_state,
    optimizer_state_tensors,
)
from ...training.data import N_CLASSES, N_FEATURES, make_dataset
from ...training.models import make_model
from ..engine import expect, expect_equal, grader
from ..engine.boundary import grading_seed
from ..engine.call_watch import calls_of
from ..engine.ranks import run_on_ranks

# -- exercise 2: what each rank holds, counted on the ranks -------------------------------------

HELD_STRATEGIES = ("ddp", "zero1", "fsdp")  # DDP + AdamW, DDP + ZeroRedundancyOptimizer, fully_shard
HELD_PARTS = ("parameters", "gradients", "optimizer_state")
HELD_WORLD_SIZES = (2, 3)                  # on 3 ranks the shards are uneven: a share of 1/N shows


def held_widths(seed):
    """A hidden width per world size, drawn from `seed` (grading_seed): not 256, the lesson's."""
    generator = torch.Generator().manual_seed(seed)
    return [int(torch.randint(20, 121, (1,), generator=generator)) for _ in HELD_WORLD_SIZES]


def _layer_shapes(hidden):
    return [(hidden, N_FEATURES), (hidden,), (N_CLASSES, hidden), (N_CLASSES,)]


def _zero1_partition(numels, world_size):
    """ZeroRedundancyOptimizer's split of whole tensors (_partition_parameters in
    torch/distributed/optim/zero_redundancy_optimizer.py): largest first, each to the rank with
    the fewest values so far."""
    sizes, owned = [0] * world_size, [[] for _ in range(world_size)]
    for numel in sorted(numels, reverse=True):
        rank = sizes.index(min(sizes))
        owned[rank].append(numel)
        sizes[rank] += numel
    return owned


def reference_held(strategy, hidden, world_size, rank):
    """The bytes rank `rank` holds after one AdamW step (fp32): AdamW keeps exp_avg and exp_avg_sq
    the size of each parameter it updates, and a 4-byte step counter per parameter tensor."""
    shapes = _layer_shapes(hidden)
    numels = [math.prod(shape) for shape in shapes]
    if strategy == "fsdp":  # fully_shard splits dim 0 as torch.chunk does: ceil(rows / N) a rank
        numels = []
        for shape in shapes:
            chunk = -(-shape[0] // world_size)
            rows = max(0, min(shape[0], (rank + 1) * chunk) - rank * chunk)
            numels.append(rows * math.prod(shape[1:]))
    updated = _zero1_partition(numels, world_size)[rank] if strategy == "zero1" else numels
    return {"parameters": 4 * sum(numels), "gradients": 4 * sum(numels),
            "optimizer_state": 8 * sum(updated) + 4 * len(updated)}


def _strategies():
    """DDP, ZeroRedundancyOptimizer, init_device_mesh and fully_shard. Imported in the grader's
    process before the launch, so that the forked ranks inherit them (each rank importing them
    itself took 2-3 s of the check)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel, ZeroRedundancyOptimizer, init_device_mesh, fully_shard


def _one_step(strategy, hidden):
    """Inside a rank: the model of width `hidden` under `strategy`, after one AdamW step."""
    DDP, ZeroRedundancyOptimizer, init_device_mesh, fully_shard = _strategies()
    model = make_model(seed=0, hidden=hidden)
    if strategy == "fsdp":
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    else:
        model = DDP(model)
        optimizer = (torch.optim.AdamW(model.parameters(), lr=1e-2) if strategy == "ddp" else
                     ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                             lr=1e-2))
    X, y = make_dataset(8 * dist.get_world_size(), seed=0).tensors
    rows = slice(8 * dist.get_rank(), 8 * (dist.get_rank() + 1))
    F.cross_entropy(model(X[rows]), y[rows]).backward()
    optimizer.step()
    return model, optimizer


def _held_on_rank(held_bytes, hidden):
    """Inside a rank: the learner's count for each strategy, as plain data, and what it called."""
    answers = {}
    for strategy in HELD_STRATEGIES:
        model, optimizer = _one_step(strategy, hidden)
        with calls_of(measure_model_state, distinct_bytes, optimizer_state_tensors) as called:
            got = held_bytes(model, optimizer)
        if not isinstance(got, dict):
            got = {part: getattr(got, part, None) for part in HELD_PARTS}
        answers[strategy] = {"called": list(called), "shown": repr(got)[:160],
                             "held": {part: _whole(got.get(part)) for part in HELD_PARTS}}
    return answers


def _whole(value):
    """An int for a whole number (int, numpy integer, 0-dim integer tensor), else None."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    return int(value) if isinstance(value, numbers.Integral) and not isinstance(value, bool) else None


@grader("what each rank holds")
def check_held_bytes(held_bytes):
    _strategies()
    for world_size, hidden in zip(HELD_WORLD_SIZES, held_widths(grading_seed(0))):
        ranks = run_on_ranks(_held_on_rank, held_bytes, hidden, nprocs=world_size,
                             what=f"held_bytes on {world_size} ranks",
                             hang_hint="held_bytes counts what this rank holds: it needs no "
                                       "collective")
        for rank, answers in enumerate(ranks):
            for strategy in HELD_STRATEGIES:
                answer = answers[strategy]
                call = (f"held_bytes on rank {rank} of {world_size}, {_STRATEGY_NAMES[strategy]}, "
                        f"hidden={hidden}")
                expect(not answer["called"], f"what {call} called", "your own count of the tensors",
                       f"the library's {answer['called'][0]}" if answer["called"] else "",
                       "measure_model_state is the count this exercise rebuilds: add up the "
                       "tensors' bytes yourself")
                expected = reference_held(strategy, hidden, world_size, rank)
                for part in HELD_PARTS:
                    got = answer["held"][part]
                    expect(got is not None, f"{call}: {part}", "a whole number of bytes",
                           answer["shown"], "return a dict with the keys parameters, gradients "
                                            "and optimizer_state, each a number of bytes")
                    expect_equal(got, expected[part], f"{call}: {part}",
                                 _held_hint(strategy, part, got, hidden, world_size, rank))


_STRATEGY_NAMES = {"ddp": "DDP + AdamW", "zero1": "DDP + ZeroRedundancyOptimizer(AdamW)",
                   "fsdp": "fully_shard + AdamW"}


def _held_hint(strategy, part, got, hidden, world_size, rank):
    """What the number looks like: the full tensors, a 1/N share, one state per value, no step."""
    full = reference_held("ddp", hidden, world_size, rank)
    mine = reference_held(strategy, hidden, world_size, rank)
    if got == full[part] and strategy == "fsdp":
        return ("that is the whole model's count: a fully_shard parameter is a DTensor whose "
                "numel() is the full tensor's; this rank holds only to_local()")
    if strategy == "zero1" and part == "parameters" and got < full[part]:
        return ("ZeroRedundancyOptimizer shards the optimizer state only: every rank keeps every "
                "parameter (and gradient) whole")
    if part == "optimizer_state":
        if got == 0:
            return ("no state counted: ZeroRedundancyOptimizer's own .state is empty; the state "
                    "lives in the local optimizer it wraps, .optim" if strategy == "zero1" else
                    "AdamW keeps its state in optimizer.state, one dict per parameter")
        if got in (mine[part] // 2, (mine[part] - 16) // 2, (mine[part] - 16) // 2 + 16,
                   mine["parameters"]):
            return "AdamW keeps two values per parameter it updates, exp_avg and exp_avg_sq"
        if got == full[part]:
            return ("that is every parameter's state: under ZeRO-1 this rank keeps the state of "
                    "the parameters it updates only")
        steps = (mine[part] - got) / 4
        if steps == int(steps) and 0 < steps <= 4:
            return "the 'step' counter AdamW keeps for each parameter is a tensor too (4 bytes)"
    if got == 0:
        return f"no {part.replace('_', ' ')} counted: after backward() each parameter's .grad holds them"
    return (f"count the bytes of every tensor this rank keeps (numel() x element_size(), "
            f"{'to_local() of a DTensor' if strategy == 'fsdp' else 'whole tensors'})")
