"""How many learners one node serves: a lesson step (a 2-rank launch that trains a model of the
course's size with DDP) timed alone, then with K learners running one at the same moment.

`python -m course_lib doctor` prints the estimate; the assumption is stated with it.
"""
import math
import multiprocessing
import statistics
import time
from typing import List, NamedTuple

from ..shared import env

DDP_STEPS = 20        # one lesson step: a launch, a model wrapped in DDP, 20 optimizer steps
TARGET_S = 2.0        # the speed stated: a lesson step a learner waits for, at most
MOST_LEARNERS_MEASURED = 8
ASSUMPTION = ("if every learner runs a lesson step at the same moment (a class that reads between "
              "cells is served more), and the time grows in proportion to the learners past those measured")


class Capacity(NamedTuple):
    alone_s: float      # median lesson step, one learner
    at_once_s: float    # median lesson step, `measured` learners at once
    measured: int
    learners: int       # served at <= target_s per lesson step
    target_s: float


def lesson_model():
    """make_model()'s shape: 16 features, 32 hidden, 4 classes (the runtime does not import the
    training layer; tests/runtime/test_doctor.py keeps the two alike)."""
    from torch import nn

    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def lesson_step(steps: int = DDP_STEPS) -> None:
    """On each rank: the course's model in DDP, `steps` SGD steps on a batch of 32."""
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(lesson_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    X, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    for _ in range(steps):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(X), y).backward()
        optimizer.step()


def timed_lesson_step() -> float:
    from .launch import launch

    start = time.perf_counter()
    launch(lesson_step, nprocs=2, output="none", timeout=120)
    return time.perf_counter() - start


def _learner(replies, rounds: int) -> None:
    try:
        replies.put([timed_lesson_step() for _ in range(rounds)])
    except BaseException as error:  # noqa: BLE001 - said by the parent
        replies.put(f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}")


def lesson_steps_at_once(learners: int, rounds: int = 2) -> List[float]:
    """Each learner a forked process launching its own 2-rank lesson steps, all at once; every
    step's seconds. Raises RuntimeError when one failed."""
    context = multiprocessing.get_context("fork")
    replies = context.Queue()
    processes = [context.Process(target=_learner, args=(replies, rounds)) for _ in range(learners)]
    for process in processes:
        process.start()
    try:
        got = [replies.get(timeout=300) for _ in processes]
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
    failed = [reply for reply in got if isinstance(reply, str)]
    if failed:
        raise RuntimeError(f"a learner's lesson step failed: {failed[0]}")
    return [seconds for reply in got for seconds in reply]


def learners_served(at_once_s: float, measured: int, target_s: float) -> int:
    """Learners whose lesson steps at the same moment each take <= target_s, the time growing in
    proportion to the learners (the cores are shared): measured * target / at_once, rounded down."""
    return max(0, math.floor(measured * target_s / at_once_s)) if at_once_s > 0 else 0


def measure(target_s: float = TARGET_S) -> Capacity:
    """A few seconds: two lesson steps alone, then two each with K learners at once (K fills the
    cores with 2 ranks a learner, at least 2)."""
    measured = min(MOST_LEARNERS_MEASURED, max(2, env.cpu_cores() // 2))
    timed_lesson_step()  # the first launch imports what ranks share
    alone = statistics.median(timed_lesson_step() for _ in range(2))
    at_once = statistics.median(lesson_steps_at_once(measured))
    return Capacity(alone, at_once, measured, learners_served(at_once, measured, target_s), target_s)


def sentence(capacity: Capacity) -> str:
    return (f"This node serves about {capacity.learners} learner{'s' if capacity.learners != 1 else ''} "
            f"at <= {capacity.target_s:g} s per lesson step ({DDP_STEPS} DDP steps on 2 ranks: "
            f"{capacity.alone_s:.2f} s alone, {capacity.at_once_s:.2f} s with {capacity.measured} learners "
            f"at once), {ASSUMPTION}.")
