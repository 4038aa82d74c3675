"""Runs what lesson 03's graders judge on gloo ranks: the puzzle, and the learner's ring on
tensors chosen here, with the traffic each rank made; a crash or a hang becomes a verdict.

Gloo on the CPU, so the ring grades the same on a laptop and a GPU node.
"""
import torch
import torch.distributed as dist

from ...topics.collectives import count_traffic
from ...topics.collectives import ring_all_reduce as course_ring
from ..engine.call_watch import calls_of
from ..engine.ranks import run_on_ranks

LAUNCH_TIMEOUT_S = 20


def launch_for_grading(fn, *args, nprocs, what, learner=True):
    """Run fn on nprocs gloo ranks, silently; a failure or a hang becomes a GradingError.
    `learner`: whether the ranks run learner code (a crossing, boundary.py) or only the course's."""
    return run_on_ranks(fn, *args, nprocs=nprocs, what=what, timeout=LAUNCH_TIMEOUT_S,
                        learner=learner,
                        hang_hint="a blocking send waits for its receiver: if every rank sends "
                                  "first, nobody receives. In each step every rank must be "
                                  "sending and receiving at the same time",
                        crash_hint="the traceback above shows where the rank failed")


def grading_tensor(rank, world_size, shape, seed=0):
    """The tensor rank `rank` reduces: whole numbers, so every summation order gives the same
    sum. `seed` is the grader's grading_seed(0) (boundary.py): 0 in a notebook."""
    generator = torch.Generator().manual_seed(seed + 1000 * world_size + 10 * rank + len(shape))
    return torch.randint(-50, 51, shape, generator=generator).float()


def reduce_grading_tensors(ring_all_reduce, shapes, seed=0):
    """On each rank: the learner's ring on this rank's grading tensor of each shape, as
    [(the tensor after it, the traffic it made)], the traffic as plain data: {"collectives":
    names in call order, "bytes_sent_to" and "bytes_received_from": {peer rank: bytes},
    "course_ring": whether it called the course's own ring_all_reduce}."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    runs = []
    for shape in shapes:
        tensor = grading_tensor(rank, world_size, shape, seed)
        with count_traffic() as traffic, calls_of(course_ring) as course_calls:
            ring_all_reduce(tensor)
        runs.append((tensor.detach(), {"collectives": list(traffic.collectives),
                                       "bytes_sent_to": dict(traffic.bytes_sent_to),
                                       "bytes_received_from": dict(traffic.bytes_received_from),
                                       "course_ring": bool(course_calls)}))
    return runs
