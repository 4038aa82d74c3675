"""What lesson 12's graders run inside each rank: the node variables torchrun would set for a
layout, then the learner's function; and the health check with dist.all_reduce watched (each
call's bytes and time) while one rank plays a slow one. Each returns plain data."""
import numbers
import os
import time
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from ..engine.call_watch import calls_of
from ..engine.observations import as_plain
from ...topics import cost_model


def placed_global_rank(global_rank, layout, order):
    """The variables torchrun's agent gives layout[order[rank]], without RANK and WORLD_SIZE
    (what the learner computes); then the learner's global_rank()."""
    place = layout[order[dist.get_rank()]]
    for name in ("RANK", "WORLD_SIZE"):
        os.environ.pop(name, None)
    os.environ.update(GROUP_RANK=str(place.node_rank), LOCAL_RANK=str(place.local_rank),
                      LOCAL_WORLD_SIZE=str(place.local_world_size),
                      GROUP_WORLD_SIZE=str(layout[-1].node_rank + 1))
    got = global_rank()
    try:
        rank, world_size = got
    except (TypeError, ValueError):
        return {"shown": repr(got)[:120], "rank": None, "world_size": None}
    return {"shown": repr(got)[:120], "rank": _plain_number(rank),
            "world_size": _plain_number(world_size)}


def _plain_number(value):
    """A whole number as an int, a float as a float (to be rejected with its type), else a repr."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) \
        else repr(value)[:60]


def placed_ranks_on_my_node(ranks_on_my_node, layout):
    """Set the node variables torchrun would on `layout`, then call the learner's function."""
    place = layout[dist.get_rank()]
    os.environ.update(GROUP_RANK=str(place.node_rank), LOCAL_RANK=str(place.local_rank),
                      LOCAL_WORLD_SIZE=str(place.local_world_size))
    return as_plain(ranks_on_my_node())


def watched_health_check(health_check, sizes, expected, slow_rank, delay_s):
    """The learner's health_check(sizes, expected) with every dist.all_reduce recorded as
    [bytes, seconds] in call order. On `slow_rank` each all-reduce of one of `sizes` returns
    `delay_s` late, as a slow GPU or link would finish late: its own clock sees the delay, the
    other ranks' clocks must not (they start together), and the slowest rank's time includes it."""
    real, calls, rank = distributed_c10d.all_reduce, [], dist.get_rank()

    def all_reduce(tensor, *args, **kwargs):
        start = time.perf_counter()
        work = real(tensor, *args, **kwargs)
        nbytes = tensor.numel() * tensor.element_size()
        if rank == slow_rank and nbytes in sizes:
            time.sleep(delay_s)
        calls.append([nbytes, time.perf_counter() - start])
        return work

    with mock.patch.object(dist, "all_reduce", all_reduce), \
            mock.patch.object(distributed_c10d, "all_reduce", all_reduce), \
            calls_of(cost_model.measure_all_reduce, cost_model.all_reduce_health) as library:
        result = health_check(list(sizes), expected)
    return {"result": as_plain(result), "calls": calls, "library": list(library)}
