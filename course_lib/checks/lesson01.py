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
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ..runtime.shared.env import device_for_rank
from ..topics.timing import synchronize
from ..training.data import make_dataset
from ..training.models import make_model
from .engine import expect, expect_close, expect_equal, expect_whole_number, grader, wrong_answer
from .engine.measured import expect_varies, expect_within_band

BATCH_SIZE = 32          # the exercise times steps of 32 samples
MIN_TIMED_STEPS = 20     # steps left after the warm-up: enough for a median to mean something
BAND = 3                 # the learner's fast steps within 3x of the check's own (docstring)
# Step times (seconds) as the lesson's loop records them on a busy CPU: a slow first step, then
# steady ones with a few slow outliers, chosen so each mistake below gives a different number.
RECORDED_STEPS = [9.1e-4, 6.2e-4, 5.5e-4, 4.8e-4,  # warm-up: slower, then settling
                  3.81e-4, 3.93e-4, 3.86e-4, 6.5e-4, 3.79e-4, 3.90e-4, 4.02e-4, 3.84e-4, 3.72e-4,
                  3.95e-4, 1.2e-3, 3.83e-4, 3.91e-4, 4.11e-4, 3.88e-4, 3.80e-4, 3.97e-4, 3.85e-4,
                  3.78e-4, 3.92e-4, 5.2e-4, 3.87e-4, 3.82e-4, 3.99e-4, 3.76e-4, 3.89e-4]


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


@grader("global batch size")
def check_global_batch_size(global_batch_size):
    for batch_size, grad_accum_steps, world_size in [(32, 1, 1), (8, 4, 2), (16, 2, 8), (4, 1, 2),
                                                     (8, 3, 1)]:
        expected = batch_size * grad_accum_steps * world_size
        got = global_batch_size(batch_size, grad_accum_steps, world_size)
        expect_equal(got, expected,
                     f"global_batch_size({batch_size}, {grad_accum_steps}, {world_size})",
                     hint=f"one optimizer step here averages over {expected} samples: count "
                          f"what each rank sees in one step, then all ranks")


# Plausible mistakes.

def _report(throughput, warmup_steps=4, step_seconds=RECORDED_STEPS):
    return step_seconds, warmup_steps, throughput(step_seconds[warmup_steps:], step_seconds)


def _median(kept, _):
    return statistics.median(kept)


def global_batch_forgets_world_size(batch_size, grad_accum_steps, world_size):
    return batch_size * grad_accum_steps


def global_batch_forgets_accumulation(batch_size, grad_accum_steps, world_size):
    return batch_size * world_size


def global_batch_divides_by_accumulation(batch_size, grad_accum_steps, world_size):
    return batch_size * world_size // grad_accum_steps


def global_batch_adds(batch_size, grad_accum_steps, world_size):
    return batch_size + grad_accum_steps + world_size


WRONG_ANSWERS = {
    check_throughput: [
        wrong_answer("averages with the mean (slow outliers count)",
                     *_report(lambda kept, _: BATCH_SIZE / statistics.mean(kept))),
        wrong_answer("keeps the warm-up steps in the median",
                     *_report(lambda kept, everything: BATCH_SIZE / statistics.median(everything))),
        wrong_answer("leaves nothing out (warmup_steps=0)",
                     *_report(lambda kept, _: BATCH_SIZE / _median(kept, _), warmup_steps=0)),
        wrong_answer("steps per second, not samples",
                     *_report(lambda kept, _: 1 / _median(kept, _))),
        wrong_answer("seconds per sample", *_report(lambda kept, _: _median(kept, _) / BATCH_SIZE)),
        wrong_answer("times 5 steps only", RECORDED_STEPS[:5], 1,
                     reference_throughput(RECORDED_STEPS[:5], 1)),
        wrong_answer("made up: the same 1 ms typed in for every step", [1e-3] * 21, 1,
                     reference_throughput([1e-3] * 21, 1)),
        wrong_answer("made up: steps of about 200 ms, far from this machine's",
                     *_report(lambda kept, _: BATCH_SIZE / _median(kept, _),
                              step_seconds=[0.2 + 1e-4 * k for k in range(30)])),
        wrong_answer("step times in microseconds",
                     *_report(lambda kept, _: BATCH_SIZE / _median(kept, _),
                              step_seconds=[seconds * 1e6 for seconds in RECORDED_STEPS])),
    ],
    check_global_batch_size: [
        wrong_answer("forgets world_size", global_batch_forgets_world_size),
        wrong_answer("forgets grad_accum_steps", global_batch_forgets_accumulation),
        wrong_answer("divides by grad_accum_steps", global_batch_divides_by_accumulation),
        wrong_answer("adds the factors", global_batch_adds),
    ],
}
