"""Graders for lesson 16, ZeRO-1 and FSDP from collectives. Both run your code on 2 and on 3 gloo
ranks (sharding.py) with models that have a tied weight, a frozen layer and a buffer.

- ZeRO-1: trained under torch's DDP with your ShardedOptimizer(params, torch.optim.AdamW, ...)
  (your own: one built on the course's ShardedOptimizer or torch's ZeroRedundancyOptimizer does
  not count), every parameter that needs a gradient has optimizer state on exactly one rank (its
  `local_optimizer`'s state), each rank on some; after every step all ranks hold the same
  weights, equal to one process's AdamW on the global batch (and to torch's
  ZeroRedundancyOptimizer on the same shards).
- an FSDP layer: ShardedStack runs each Linear through your autograd Function from this rank's
  flat shard. In every step each use of a layer all-gathers its parameters in the forward and
  again in the backward (all but at most one use), no gathered tensor outlives its layer (none
  is alive when the next all-gather starts), the gradients reach the shards by reduce-scatter
  (never all-reduce), none for the frozen layer, and the shards after each step are those of one
  process's SGD on the global batch (and torch's fully_shard's on the same shards of data).
"""
from collections import Counter

import torch

from ..engine import GradingError, describe, expect, grader
from ..engine.gradient_sync import TiedNet, close
from ..engine.ranks import run_on_ranks
from .sharding import (GATHER_CASES, PLAN, fsdp_on_rank, gather_on_rank, one_process_adamw,
                       one_process_stack, padded_sizes, shard_for, zero_on_rank)

LAUNCH_TIMEOUT_S = 90
WORLD_SIZES = (2, 3)
LIBRARY_OPTIMIZERS = {"ShardedOptimizer": "the course's ShardedOptimizer",
                      "ZeroRedundancyOptimizer": "torch's ZeroRedundancyOptimizer"}
SAME_COLLECTIVES = ("every rank must call the same collectives, in the same order, with tensors "
                    "of the same size")


def _run(fn, answer, world_size, what):
    return run_on_ranks(fn, answer, nprocs=world_size, what=what, timeout=LAUNCH_TIMEOUT_S,
                        hang_hint=SAME_COLLECTIVES)


# -- exercise 1: ZeRO-1 ------------------------------------------------------------------------
@grader("a ZeRO-1 optimizer")
def check_sharded_optimizer(ShardedOptimizer):
    oracle = one_process_adamw()
    trainable = [name for name, p in TiedNet().named_parameters() if p.requires_grad]
    for world_size in WORLD_SIZES:
        what = f"ShardedOptimizer on {world_size} ranks"
        results = _run(zero_on_rank, ShardedOptimizer, world_size, what)
        called = results[0].get("library_calls")
        if called:
            library = LIBRARY_OPTIMIZERS[called[0].split(".")[0]]
            raise GradingError(what, "your own optimizer", f"one built on {library}",
                               f"your class handed the work to {library}: this exercise asks you "
                               f"to shard the optimizer yourself (the check sees which classes "
                               f"are built, whatever name they go by)")
        _judge_shares(results, trainable, what)
        _judge_zero_weights(results, oracle, what)


def _judge_shares(results, trainable, what):
    for rank, result in enumerate(results):
        expect(result["owned"] is not None, f"{what}: rank {rank}'s optimizer",
               "a `local_optimizer` attribute: the optimizer over this rank's share",
               "no such attribute", "the check reads the optimizer state each rank holds from it")
        expect(bool(result["owned"]), f"{what}: rank {rank}'s optimizer state",
               "the state of some parameters", "none",
               "every rank owns a share of the parameters, and steps it")
    holders = Counter(name for result in results for name in result["owned"])
    for name in trainable:
        ranks = [rank for rank, result in enumerate(results) if name in result["owned"]]
        expect(len(ranks) == 1, f"{what}: the optimizer state of {name}", "on exactly one rank",
               f"on ranks {ranks}" if ranks else "on no rank",
               "the shares must not overlap: each rank keeps the state of its own parameters only"
               if ranks else "every parameter that needs a gradient belongs to one rank's share")
    extra = [name for name in holders if name not in trainable]
    expect(not extra, f"{what}: the optimizer state", f"only for {trainable}", f"also for {extra}",
           "the frozen layer needs no optimizer state")


def _judge_zero_weights(results, oracle, what):
    for step, expected in enumerate(oracle):
        for rank, result in enumerate(results):
            expect(close(result["torch_zero"][step], expected),
                   f"torch's ZeroRedundancyOptimizer on rank {rank}", "the one-process weights",
                   "other weights", "please report this machine")
            if close(result["weights"][step], expected):
                continue
            agree = all(close(r["weights"][step], results[0]["weights"][step]) for r in results)
            raise GradingError(f"{what}: rank {rank}'s weights after step {step}",
                               "one process's AdamW weights on the global batch", "other weights",
                               "the ranks hold different weights: after its step, each rank's "
                               "share must reach the other ranks" if not agree else
                               "the ranks agree on other weights: is every parameter stepped, by "
                               "exactly one rank, with the optimizer's own arguments?")


# -- exercise 2: gather a layer's parameters ---------------------------------------------------
@grader("gather the full parameters")
def check_gather_full(gather_full):
    for world_size in WORLD_SIZES:
        what = f"gather_full on {world_size} ranks"
        results = _run(gather_on_rank, gather_full, world_size, what)
        for rank, gathered in enumerate(results):
            for (numel, dtype), got in zip(GATHER_CASES, gathered):
                expected = torch.cat([shard_for(r, numel, dtype) for r in range(world_size)])
                call = f"{what}: rank {rank}, shards of {numel} {dtype} elements"
                if not torch.is_tensor(got):
                    raise GradingError(call, "one tensor", type(got).__name__,
                                       "return the full flat tensor, not the pieces")
                expect(got.shape == expected.shape and got.dtype == expected.dtype
                       and torch.equal(got, expected), call, describe(expected), describe(got),
                       _gather_hint(got, expected, world_size, numel))


def _gather_hint(got, expected, world_size, numel):
    if got.numel() == numel:
        return f"the full tensor holds {world_size} shards: {world_size} x {numel} elements"
    if got.dtype != expected.dtype:
        return "keep the shard's dtype"
    if got.shape == expected.shape and torch.equal(got.sort().values, expected.sort().values):
        return "every shard is there, in another order: rank r's shard goes in slice r"
    return "each slice r of the full tensor is rank r's shard, unchanged"


# -- exercise 3: an FSDP layer -----------------------------------------------------------------
@grader("an FSDP layer")
def check_sharded_linear(ShardedLinear):
    oracle = one_process_stack()
    for world_size in WORLD_SIZES:
        what = f"ShardedLinear on {world_size} ranks"
        results = _run(fsdp_on_rank, ShardedLinear, world_size, what)
        for rank, result in enumerate(results):
            for step, events in enumerate(result["events"]):
                _judge_collectives(events, world_size, f"{what}: rank {rank} at step {step}")
        _judge_shards(results, oracle, what)


def _judge_collectives(events, world_size, where):
    uses, sizes = len(PLAN), padded_sizes(world_size)
    trainable = {sizes[name] for name in ("first", "middle", "head")}
    gathers = {phase: [e for e in events if e[0] == "all_gather" and e[1] == phase]
               for phase in ("forward", "backward")}
    expect(not [e for e in events if e[0] == "all_reduce"], where, "no all-reduce",
           "an all-reduce", "each rank needs only the sum of its own slice of the gradient")
    expect(len(gathers["forward"]) == uses, where,
           f"{uses} all-gathers in the forward (one per use of a layer)",
           f"{len(gathers['forward'])}", "gather a layer's parameters when it runs")
    expect(len(gathers["backward"]) >= uses - 1, where,
           f"at least {uses - 1} all-gathers in the backward",
           f"{len(gathers['backward'])}",
           "the full parameters must not stay in memory from forward to backward: gather them "
           "again when the layer's backward needs them")
    alive = [e for e in events if e[0] == "all_gather" and e[3] > 0]
    expect(not alive, where, "no earlier gathered parameters in memory when a layer gathers",
           f"{alive[0][3]} still alive at an all-gather in the {alive[0][1]}" if alive else "",
           "a layer's full parameters are for that layer only: keep no reference to them once "
           "it has run")
    scattered = [e[2] for e in events if e[0] == "reduce_scatter"]
    expect(scattered and all(size in trainable for size in scattered)
           and len(set(scattered)) == len(trainable), where,
           f"reduce-scatters of the layers that need a gradient (padded sizes {sorted(trainable)})",
           f"of sizes {scattered}",
           "the frozen layer gets no gradient; every other layer's gradient is reduce-scattered "
           "into the shards")


def _judge_shards(results, oracle, what):
    for step, expected in enumerate(oracle):
        for name, flat in expected.items():
            expect(all(close(result["torch_fsdp"][step][name], flat) for result in results),
                   f"torch's fully_shard, layer {name!r}", "the one-process weights",
                   "other weights", "please report this machine")
            full = torch.cat([result["shards"][step][name] for result in results])[:flat.numel()]
            if close(full, flat):
                continue
            raise GradingError(f"{what}: layer {name!r} after step {step}",
                               "one process's SGD weights on the global batch",
                               "other weights (the ranks' shards put together)",
                               "each shard's gradient is the mean over the ranks of that slice of "
                               "the layer's gradient")
