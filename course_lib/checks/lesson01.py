"""Graders for lesson 01 (single-device baseline): the throughput of the learner's own loop,
measured; the global batch.

- throughput: the learner's recorded step times (at least 21, warm-up included), the number of
  warm-up steps they chose to leave out (at least 1, leaving at least 20), and samples per second,
  32 over the median of the rest (statistics.median's, within 1e-6; numpy's agrees). Timings
  vary from run to run, so the grader judges the number against the times the learner recorded.
- global batch size: the samples one optimizer step sees, batch_size x grad_accum_steps x
  world_size."""
import statistics

from . import expect, expect_close, expect_equal, expect_whole_number, grader, wrong_answer

BATCH_SIZE = 32          # the exercise times steps of 32 samples
MIN_TIMED_STEPS = 20     # steps left after the warm-up: enough for a median to mean something
# Step times (seconds) as the lesson's loop records them on a busy CPU: a slow first step, then
# steady ones with a few slow outliers, chosen so each mistake below gives a different number.
RECORDED_STEPS = [9.1e-4, 6.2e-4, 5.5e-4, 4.8e-4,  # warm-up: slower, then settling
                  3.81e-4, 3.93e-4, 3.86e-4, 6.5e-4, 3.79e-4, 3.90e-4, 4.02e-4, 3.84e-4, 3.72e-4,
                  3.95e-4, 1.2e-3, 3.83e-4, 3.91e-4, 4.11e-4, 3.88e-4, 3.80e-4, 3.97e-4, 3.85e-4,
                  3.78e-4, 3.92e-4, 5.2e-4, 3.87e-4, 3.82e-4, 3.99e-4, 3.76e-4, 3.89e-4]


def reference_throughput(step_seconds, warmup_steps):
    return BATCH_SIZE / statistics.median(step_seconds[warmup_steps:])


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
                 hint="leave out the first warmup_steps times, take the median of the rest, "
                      f"and return samples per second: batch size ({BATCH_SIZE}) / median",
                 rtol=1e-6)


@grader("global batch size")
def check_global_batch_size(global_batch_size):
    for batch_size, grad_accum_steps, world_size in [(32, 1, 1), (8, 4, 2), (16, 2, 8), (4, 1, 2),
                                                     (8, 3, 1)]:
        expect_equal(global_batch_size(batch_size, grad_accum_steps, world_size),
                     batch_size * grad_accum_steps * world_size,
                     f"global_batch_size({batch_size}, {grad_accum_steps}, {world_size})",
                     hint="one optimizer step sees batch_size samples per micro-batch, "
                          "grad_accum_steps micro-batches, on each of world_size ranks")


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
    ],
    check_global_batch_size: [
        wrong_answer("forgets world_size", global_batch_forgets_world_size),
        wrong_answer("forgets grad_accum_steps", global_batch_forgets_accumulation),
        wrong_answer("divides by grad_accum_steps", global_batch_divides_by_accumulation),
        wrong_answer("adds the factors", global_batch_adds),
    ],
}
