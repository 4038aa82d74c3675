"""Graders for lesson 01 (single-device baseline): the throughput of the learner's own loop,
measured; the global batch.

- throughput: the learner's recorded step times in seconds (at least 21, warm-up included), the
  number of warm-up steps they chose to leave out (at least 1, leaving at least 20), and samples
  per second, 32 over the median of the rest (statistics.median's, within 1e-6; numpy's agrees).
  The times must be a measurement of this machine: they differ from step to step, and the fast
  end of them (the lower quartile of the kept steps) lies within BAND (3x) of the lower quartile
  of 40 steps of the same loop that the check times itself (the lesson's loader of batches of 32,
  make_model(seed=0), SGD, on the same device and one thread, as the lesson). The band: runs
  of the loop on this 2-core machine, shared by other jobs, agreed within 1.1x (lower quartiles
  of 317-340 us); the lower quartile is made of the steps no other program interrupted, so load
  moves it little, and the check re-measures 4 more times, over 4 s, before it rejects. A
  unit slip is 1000x off; a made-up time is off the band, or the same number at every step.
- global batch size: the samples one optimizer step sees, batch_size x grad_accum_steps x
  world_size."""
import random
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ..runtime.shared.env import device_for_rank
from ..topics.timing import synchronize
from ..training.data import make_dataset
from ..training.models import make_model
from .engine import expect, expect_close, expect_equal, expect_whole_number, grader
from .engine.boundary import grading_seed
from .engine.learner_call import call_learner
from .engine.measured import expect_varies, expect_within_band
from .engine.observations import as_plain

BATCH_SIZE = 32          # the exercise times steps of 32 samples
MIN_TIMED_STEPS = 20     # steps left after the warm-up: enough for a median to mean something
BAND = 3                 # the learner's fast steps within 3x of the check's own (docstring)


def reference_throughput(step_seconds, warmup_steps):
    return BATCH_SIZE / statistics.median(step_seconds[warmup_steps:])


def time_the_loop(steps: int = 40) -> list:
    """The seconds of each of `steps` steps of the lesson's loop (data, forward, backward,
    optimizer), warm-up included, timed here and now, on one thread as the lesson sets it: what
    the exercise asks the learner to time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # more threads on a shared 2-core machine: far noisier steps
    try:
        return _time_steps(steps)
    finally:
        torch.set_num_threads(threads)


def _time_steps(steps):
    device = device_for_rank()
    loader = DataLoader(make_dataset(n_samples=4096, seed=0), batch_size=BATCH_SIZE, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model = make_model(seed=0).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches, seconds = iter(loader), []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        X, y = next(batches)
        loss = F.cross_entropy(model(X.to(device)), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def fast_end(step_seconds) -> float:
    """The lower quartile: the steps that ran without another program taking the core."""
    return statistics.quantiles(step_seconds, n=4)[0]


@grader("throughput")
def check_throughput(step_seconds, warmup_steps, samples_per_second):
    try:
        recorded = [float(seconds) for seconds in step_seconds]
    except (TypeError, ValueError):
        recorded = []
    expect(len(recorded) >= MIN_TIMED_STEPS + 1 and all(seconds > 0 for seconds in recorded),
           "step_seconds", f"the seconds of every step you timed, in order: at least "
           f"{MIN_TIMED_STEPS + 1} positive numbers", repr(step_seconds)[:120],
           "time each step on its own, warm-up included: time_phases(..., warmup=0) keeps them all")
    expect_whole_number(warmup_steps, "warmup_steps", "a number of steps: a whole number")
    expect(1 <= warmup_steps <= len(recorded) - MIN_TIMED_STEPS, "warmup_steps",
           f"from 1 (the first step is always warm-up) to {len(recorded) - MIN_TIMED_STEPS} "
           f"(leaving at least {MIN_TIMED_STEPS} timed steps)", str(warmup_steps),
           "look at your first step times: leave out those that are slower than the rest")
    expect_close(samples_per_second, reference_throughput(recorded, warmup_steps),
                 f"samples_per_second, from your {len(recorded)} step times without the first "
                 f"{warmup_steps}",
                 hint=f"samples per second from the median of the steps after the first "
                      f"{warmup_steps}, with {BATCH_SIZE} samples per step; the mean, or the "
                      "warm-up steps, give another number", rtol=1e-6)
    kept = recorded[warmup_steps:]
    expect_varies(kept, "step_seconds", "time every step of your loop with the clock: typed-in "
                  "or copied times are no measurement")
    expect_within_band(fast_end(kept), lambda: fast_end(time_the_loop()[5:]), BAND,
                       "the fast end of your step times (their lower quartile)", "s",
                       "time this notebook's loop on this machine, in seconds, and pass those "
                       "times as you recorded them")


GLOBAL_BATCH_CASES = [(32, 1, 1), (8, 4, 2), (16, 2, 8), (4, 1, 2), (8, 3, 1)]


def global_batch_cases() -> list:
    """The exercise's cases, then one drawn at grading time (the same one in a notebook)."""
    draw = random.Random(grading_seed(0))
    return GLOBAL_BATCH_CASES + [(draw.choice([2, 4, 16, 64]), draw.randint(2, 6),
                                  draw.choice([3, 4, 8, 16]))]


@grader("global batch size")
def check_global_batch_size(global_batch_size):
    for batch_size, grad_accum_steps, world_size in global_batch_cases():
        expected = batch_size * grad_accum_steps * world_size
        call = f"global_batch_size({batch_size}, {grad_accum_steps}, {world_size})"
        got = call_learner(lambda: as_plain(global_batch_size(batch_size, grad_accum_steps,
                                                              world_size)), what=call)
        expect_equal(got, expected, call,
                     hint=f"one optimizer step here averages over {expected} samples: count "
                          f"what each rank sees in one step, then all ranks")
        expect(isinstance(got, int) and not isinstance(got, bool), f"{call}: its type", "an int",
               type(got).__name__, f"{got!r} equals {expected}, but a batch size is a count: "
               "DataLoader(batch_size=...) and range() refuse a float or a tensor")

