"""Graders for lesson 16, ZeRO-1 and FSDP from collectives. All run your code on 2 and on 3 gloo
ranks (sharding.py, unit.py).

- ZeRO-1: trained under torch's DDP with your ShardedOptimizer(params, optimizer_class, ...),
  optimizer_class torch.optim.AdamW on 2 ranks and torch.optim.Adam on 3 (a class written in
  shows; your own: one built on the course's ShardedOptimizer or torch's ZeroRedundancyOptimizer
  does not count), every parameter that needs a gradient has optimizer state on exactly one rank (its
  `local_optimizer`'s state), each rank on some; after every step all ranks hold the same
  weights, equal to one process's AdamW (Adam) on the global batch (and to torch's
  ZeroRedundancyOptimizer on the same shards).
- gather_full: on 2 and 3 ranks, shards whose values say whose they are (from a grading-time base);
  each rank's shard unchanged after the call.
- an FSDP unit: each Linear of a stack (the first frozen; flat sizes 2 and 3 do not divide) becomes
  a unit of your class (unit.py; the verdicts in judge_unit.py), not one built on the course's
  FSDPUnit. Each rank's shard is the padded size / world_size; in every step, as unit k computes,
  the full parameters in memory are unit k's and, prefetched, unit k+1's (the storages that the
  all-gathers wrote into and the units hold, and that still have memory); one all-gather per unit
  in the forward and one in the backward (the last unit may stay gathered); one reduce-scatter per
  trainable unit, no all-reduce; nothing gathered once backward is over; and the losses and
  weights are one process's SGD on the global batch (and torch's fully_shard's).
Inputs (data, the model's initial weights, the shards' values) come from grading_seed; the
rank functions return observations, the comparisons are made here.
"""
from collections import Counter

import torch

from ..engine import GradingError, describe, expect, grader
from ..engine.boundary import grading_seed
from ..engine.gradient_sync import DATA_SEED, TiedNet, close
from ..engine.ranks import run_on_ranks
from .judge_unit import judge_shard_sizes, judge_unit_events, judge_unit_training
from .sharding import (GATHER_CASES, LOCAL_CLASSES, STEPS, gather_on_rank, one_process_adamw,
                       shard_for, zero_on_rank)
from .unit import flat_of, linears, one_process_units, unit_on_rank, unit_stack

LAUNCH_TIMEOUT_S = 90
WORLD_SIZES = (2, 3)
LIBRARY_OPTIMIZERS = {"ShardedOptimizer": "the course's ShardedOptimizer",
                      "ZeroRedundancyOptimizer": "torch's ZeroRedundancyOptimizer"}
SAME_COLLECTIVES = ("every rank must call the same collectives, in the same order, with tensors "
                    "of the same size")


def _run(fn, answer, world_size, what, *args):
    return run_on_ranks(fn, answer, *args, nprocs=world_size, what=what, timeout=LAUNCH_TIMEOUT_S,
                        hang_hint=SAME_COLLECTIVES)


# -- exercise 1: ZeRO-1 ------------------------------------------------------------------------
@grader("a ZeRO-1 optimizer")
def check_sharded_optimizer(ShardedOptimizer):
    data_seed = grading_seed(DATA_SEED)
    trainable = [name for name, p in TiedNet().named_parameters() if p.requires_grad]
    for world_size in WORLD_SIZES:
        what = f"ShardedOptimizer on {world_size} ranks"
        local_class = LOCAL_CLASSES[world_size]
        oracle = one_process_adamw(data_seed, local_class=local_class)
        results = _run(zero_on_rank, ShardedOptimizer, world_size, what, data_seed, STEPS, local_class)
        called = results[0].get("library_calls")
        if called:
            library = LIBRARY_OPTIMIZERS[called[0].split(".")[0]]
            raise GradingError(what, "your own optimizer", f"one built on {library}",
                               f"your class handed the work to {library}: this exercise asks you "
                               f"to shard the optimizer yourself (the check sees which classes "
                               f"are built, whatever name they go by)")
        _judge_shares(results, trainable, what)
        _judge_zero_weights(results, oracle, what, local_class.__name__)


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


def _judge_zero_weights(results, oracle, what, local_name):
    for step, expected in enumerate(oracle):
        for rank, result in enumerate(results):
            expect(close(result["torch_zero"][step], expected),
                   f"torch's ZeroRedundancyOptimizer on rank {rank}", "the one-process weights",
                   "other weights", "please report this machine")
            if close(result["weights"][step], expected):
                continue
            agree = all(close(r["weights"][step], results[0]["weights"][step]) for r in results)
            raise GradingError(f"{what}: rank {rank}'s weights after step {step}",
                               f"one process's {local_name} weights on the global batch", "other weights",
                               "the ranks hold different weights: after its step, each rank's "
                               "share must reach the other ranks" if not agree else
                               "the ranks agree on other weights: is every parameter stepped, by "
                               f"exactly one rank, with the optimizer class it is given ({local_name} "
                               "here) and its arguments?")


# -- exercise 2: gather a layer's parameters ---------------------------------------------------
@grader("gather the full parameters")
def check_gather_full(gather_full):
    base = grading_seed(0)  # the shards' values start there
    for world_size in WORLD_SIZES:
        what = f"gather_full on {world_size} ranks"
        results = _run(gather_on_rank, gather_full, world_size, what, base)
        for rank, result in enumerate(results):
            for (numel, dtype), got, after in zip(GATHER_CASES, result["gathered"],
                                                  result["shards_after"]):
                expected = torch.cat([shard_for(r, numel, dtype, base) for r in range(world_size)])
                call = f"{what}: rank {rank}, shards of {numel} {dtype} elements"
                if not torch.is_tensor(got):
                    raise GradingError(call, "one tensor", type(got).__name__,
                                       "return the full flat tensor, not the pieces")
                expect(got.shape == expected.shape and got.dtype == expected.dtype
                       and torch.equal(got, expected), call, describe(expected), describe(got),
                       _gather_hint(got, expected, world_size, numel))
                shard = shard_for(rank, numel, dtype, base)
                expect(torch.is_tensor(after) and torch.equal(after, shard), f"{call}: the shard it "
                       "was given, after the call", describe(shard),
                       "its memory freed" if isinstance(after, str) else describe(after), "the shard is this rank's own parameters, which it keeps "
                       "(and steps) after the gather: read it, never change or free it")


def _gather_hint(got, expected, world_size, numel):
    if got.numel() == numel:
        return f"the full tensor holds {world_size} shards: {world_size} x {numel} elements"
    if got.dtype != expected.dtype:
        return "keep the shard's dtype"
    if got.shape == expected.shape and torch.equal(got.sort().values, expected.sort().values):
        return "every shard is there, in another order: rank r's shard goes in slice r"
    return "each slice r of the full tensor is rank r's shard, unchanged"


# -- exercise 3: an FSDP unit ------------------------------------------------------------------
@grader("an FSDP unit")
def check_fsdp_unit(FSDPUnit):
    # the model and data seeds are chosen at grading time; the ranks' world sizes are fixed (2, 3)
    model_seed, data_seed = grading_seed(0), grading_seed(16)
    losses, oracle = one_process_units(model_seed, data_seed)
    initial = [flat_of(layer) for layer in linears(unit_stack(model_seed))]
    for world_size in WORLD_SIZES:
        what = f"FSDPUnit on {world_size} ranks"
        results = run_on_ranks(unit_on_rank, FSDPUnit, model_seed, data_seed, nprocs=world_size,
                               what=what, timeout=LAUNCH_TIMEOUT_S, hang_hint=SAME_COLLECTIVES,
                               crash_hint=_unit_crash_hint)
        if results[0].get("library_calls"):
            raise GradingError(what, "your own unit", "one built on the course's FSDPUnit",
                               "your class handed the work to course_lib.topics.from_scratch's "
                               "FSDPUnit: this exercise asks you to write its hooks yourself")
        judge_shard_sizes(results, world_size, what)
        for rank, result in enumerate(results):
            for step, events in enumerate(result["events"]):
                judge_unit_events(events, world_size, f"{what}: rank {rank} at step {step}")
        judge_unit_training(results, losses, oracle, initial, world_size, what)


def _unit_crash_hint(cause):
    if "size" in cause.summary and ("all_gather" in cause.summary or "output" in cause.summary):
        return ("every rank's shard must have the same size: pad the flat parameters with zeros to a "
                "multiple of world_size, then take slice `rank`")
    return "the error is raised in your class: fix it, run its cell again, then the check"
