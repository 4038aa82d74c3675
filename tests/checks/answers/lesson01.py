"""Lesson 01's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import math

import numpy as np

from course_lib.checks import lesson01
from test_measured_graders import (THROUGHPUT_ALTERNATIVES)


from . import answer, wrong_answer  # noqa: F401


def global_batch_size_by_math_prod(batch_size, grad_accum_steps, world_size):
    return math.prod([batch_size, grad_accum_steps, world_size])


def global_batch_size_as_numpy(batch_size, grad_accum_steps, world_size):
    return np.int64(batch_size) * grad_accum_steps * world_size


ALTERNATIVES = {
    lesson01.check_throughput: THROUGHPUT_ALTERNATIVES,
    lesson01.check_global_batch_size: [
        answer("math.prod", global_batch_size_by_math_prod),
        answer("a numpy integer", global_batch_size_as_numpy),
    ],
}
