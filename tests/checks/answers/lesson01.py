"""Lesson 01's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import math
import statistics

import numpy as np

from course_lib.checks import lesson01
from course_lib.checks.lesson01 import BATCH_SIZE, reference_throughput
from test_measured_graders import THROUGHPUT_ALTERNATIVES

from . import answer, wrong_answer


def global_batch_size_by_math_prod(batch_size, grad_accum_steps, world_size):
    return math.prod([batch_size, grad_accum_steps, world_size])


def global_batch_size_as_numpy(batch_size, grad_accum_steps, world_size):
    return np.int64(batch_size) * grad_accum_steps * world_size


ALTERNATIVES = {
    lesson01.check_throughput: THROUGHPUT_ALTERNATIVES,  # measured when the test runs
    lesson01.check_global_batch_size: [
        answer("math.prod", global_batch_size_by_math_prod),
        answer("a numpy integer", global_batch_size_as_numpy),
    ],
}


# Wrong answers

# Step times (seconds) as the lesson's loop records them on a busy CPU: a slow first step, then
# steady ones with a few slow outliers, chosen so each mistake below gives a different number.
RECORDED_STEPS = [9.1e-4, 6.2e-4, 5.5e-4, 4.8e-4,  # warm-up: slower, then settling
                  3.81e-4, 3.93e-4, 3.86e-4, 6.5e-4, 3.79e-4, 3.90e-4, 4.02e-4, 3.84e-4, 3.72e-4,
                  3.95e-4, 1.2e-3, 3.83e-4, 3.91e-4, 4.11e-4, 3.88e-4, 3.80e-4, 3.97e-4, 3.85e-4,
                  3.78e-4, 3.92e-4, 5.2e-4, 3.87e-4, 3.82e-4, 3.99e-4, 3.76e-4, 3.89e-4]


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


def global_batch_as_a_float(batch_size, grad_accum_steps, world_size):
    return batch_size * grad_accum_steps * world_size / 1  # 256.0: equal to 256, not a count


def global_batch_as_a_tensor(batch_size, grad_accum_steps, world_size):
    import torch

    return torch.tensor(batch_size * grad_accum_steps * world_size)


def global_batch_adds(batch_size, grad_accum_steps, world_size):
    return batch_size + grad_accum_steps + world_size


WRONG_ANSWERS = {
    lesson01.check_throughput: [
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
    lesson01.check_global_batch_size: [
        wrong_answer("forgets world_size", global_batch_forgets_world_size),
        wrong_answer("forgets grad_accum_steps", global_batch_forgets_accumulation),
        wrong_answer("divides by grad_accum_steps", global_batch_divides_by_accumulation),
        wrong_answer("adds the factors", global_batch_adds),
        wrong_answer("a float (256.0)", global_batch_as_a_float),
        wrong_answer("a 0-dim tensor", global_batch_as_a_tensor),
    ],
}
