"""The verdicts on a learner's FSDP unit (lesson 16, exercise 3), from what each rank observed
(unit.py): the shards' sizes, the collectives and the memory of each step, the losses and weights."""
import torch

from ..engine import GradingError, expect
from ..engine.gradient_sync import close
from .unit import FROZEN_UNITS, LAYERS, flat_numels, padded_numels

UNITS = len(LAYERS)


def _units(alive: dict) -> str:
    return ", ".join(f"unit {unit} ({size:,} bytes)" if unit >= 0 else f"a tensor of {size:,} bytes"
                     for unit, size in sorted(alive.items())) or "none"


def judge_shard_sizes(results, world_size, what):
    for rank, result in enumerate(results):
        for unit, (numel, padded, got) in enumerate(zip(flat_numels(), padded_numels(world_size),
                                                        result["shard_numels"])):
            expect(got == padded // world_size, f"{what}: rank {rank}'s shard of unit {unit}",
                   f"{padded // world_size} elements", f"{got}",
                   f"the unit's {numel} parameters, zero-padded to {padded} (a multiple of "
                   f"world_size), split in {world_size} equal slices: rank r keeps slice r")
        for unit, (storage, own) in enumerate(result["shard_storage"]):
            expect(storage == own, f"{what}: the memory behind rank {rank}'s shard of unit {unit}",
                   f"its own {own} bytes", f"a view into {storage} bytes",
                   "the shard is a slice of the whole padded tensor, which it keeps alive: every "
                   "rank still holds all the parameters; .clone() the slice")


def judge_unit_events(events, world_size, where):
    kinds = [event[0] for event in events]
    expect("all_reduce" not in kinds, where, "no all-reduce", "an all-reduce",
           "each rank needs only the sum of its own slice of the gradient: reduce-scatter it")
    for kind, phase, unit, alive in (e for e in events if e[0] == "memory" and e[2] != "end"):
        _judge_forward_memory(unit, alive, where)
    gathers = {phase: [e[2] for e in events if e[0] == "all_gather" and e[1] == phase]
               for phase in ("forward", "backward")}
    for unit in range(UNITS):
        count = gathers["forward"].count(unit)
        expect(count == 1, f"{where}: unit {unit}'s all-gathers in the forward", "one", f"{count}",
               "when the previous unit has prefetched this one, wait for that all-gather "
               "(its Work) instead of gathering again" if count > 1 else
               "gather each unit's parameters before its forward")
    for unit in range(FROZEN_UNITS, UNITS):
        count = gathers["backward"].count(unit)
        needed = 1 if unit < UNITS - 1 else 0  # the last unit may stay gathered into backward
        expect(needed <= count <= 1, f"{where}: unit {unit}'s all-gathers in the backward",
               "one" if needed else "at most one", f"{count}",
               "backward needs the full parameters the forward freed: gather them again in "
               "pre_backward" if count < needed else "gather once per backward")
    scattered = [e[2] for e in events if e[0] == "reduce_scatter"]
    trainable = list(range(FROZEN_UNITS, UNITS))
    expect(sorted(scattered) == trainable, where,
           f"one reduce-scatter of each trainable unit's gradient (units {trainable}, padded sizes "
           f"{padded_numels(world_size)[FROZEN_UNITS:]})",
           f"of units {sorted(scattered)} (-1: a size no unit has)",
           "the frozen unit 0 gets no gradient; every other unit's full flat gradient (padded like "
           "its parameters) is reduce-scattered once, in post_backward")
    end = [e[3] for e in events if e[0] == "memory" and e[2] == "end"][-1]
    expect(not end, f"{where}: full parameters in memory once backward is over", "none", _units(end),
           "free a unit's full parameters in post_backward, once its gradient is reduce-scattered")


def _judge_forward_memory(unit, alive, where):
    expected = {unit, unit + 1} if unit + 1 < UNITS else {unit}
    if set(alive) == expected:
        return
    where = f"{where}: full parameters in memory as unit {unit} computes"
    wanted = f"units {sorted(expected)} (its own, and the next, prefetched)" if len(expected) > 1 \
        else f"unit {unit} only"
    earlier = [u for u in alive if 0 <= u < unit]
    if earlier:
        raise GradingError(where, wanted, _units(alive),
                           f"unit {earlier[0]} was not freed after its forward: post_forward must "
                           "free the full parameters (autograd's saved views keep dropped tensors "
                           "alive; resize their storage to 0, as free_full() does), and backward "
                           "gathers them again")
    later = [u for u in alive if u > unit + 1 or u < 0]
    if later:
        raise GradingError(where, wanted, _units(alive),
                           "the prefetch gathered the wrong unit: start the all-gather of the "
                           "next unit (self.next_unit), the one that computes after this one")
    raise GradingError(where, wanted, _units(alive),
                       "no prefetch: in pre_forward, once this unit's parameters are in, start the "
                       "next unit's all-gather with async_op=True and leave its Work for it to wait on")


def judge_unit_training(results, losses, oracle, initial, world_size, what):
    for step, (loss, expected) in enumerate(zip(losses, oracle)):
        for rank, result in enumerate(results):
            for unit, flat in enumerate(expected):
                expect(close(result["torch_fsdp"][step][unit], flat),
                       f"torch's fully_shard on rank {rank}, unit {unit}", "the one-process weights",
                       "other weights", "please report this machine")
        got_loss = sum(result["losses"][step] for result in results) / world_size
        expect(abs(got_loss - loss) <= 1e-5 * max(1.0, abs(loss)), f"{what}: the loss at step {step} "
               "(the mean of the ranks')", f"{loss:.6f} (one process, the global batch)",
               f"{got_loss:.6f}", "each unit must compute with its own full parameters, every "
               "rank's shard in rank order")
        for unit, flat in enumerate(expected):
            full = torch.cat([result["shards"][step][unit].detach().flatten() for result in results])
            full = full[:flat.numel()]
            if full.numel() == flat.numel() and close(full, flat):
                continue
            scale = next((s for s in (world_size, world_size / 2) if full.numel() == flat.numel() and
                          step == 0 and close(full - initial[unit], s * (flat - initial[unit]))), None)
            raise GradingError(f"{what}: unit {unit}'s weights after step {step}",
                               "one process's SGD weights on the global batch (and torch's "
                               "fully_shard's)", "other weights (the ranks' shards put together)",
                               f"the update is {world_size} times too large: divide the "
                               "reduce-scattered gradient by world_size, as DDP does" if scale == world_size
                               else f"the update is {scale:g} times too large: the sum divided by 2, "
                               "not by the world size" if scale else
                               "each shard's gradient is the mean over the ranks of that slice of "
                               "the unit's full gradient")
