"""Lesson 09's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import itertools
import math

import numpy as np

from course_lib.checks import lesson09
from test_measured_graders import (SCALING_ALTERNATIVES)


from . import answer, wrong_answer  # noqa: F401


def all_reduce_seconds_from_the_cost_model(n_parameters, world_size, alpha, beta,
                                           bytes_per_parameter=4):
    from course_lib.topics.cost_model import ring_all_reduce_time

    return ring_all_reduce_time(n_parameters * bytes_per_parameter, world_size, alpha, beta)


def all_reduce_seconds_per_step(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    steps = 2 * (world_size - 1)
    chunk_bytes = n_parameters * bytes_per_parameter / world_size
    return np.float64(steps * (alpha + chunk_bytes * beta))


def plan_by_decreasing_batch(global_batch_size, max_batch_size, world_size):
    per_rank, remainder = divmod(global_batch_size, world_size)
    if remainder:
        raise ValueError("the global batch does not split evenly over the ranks")
    for batch_size in range(min(max_batch_size, per_rank), 0, -1):
        if per_rank % batch_size == 0:
            return [batch_size, per_rank // batch_size]


def plan_from_divisors(global_batch_size, max_batch_size, world_size):
    if global_batch_size % world_size != 0:
        raise ValueError(f"{global_batch_size} does not divide by {world_size}")
    per_rank = global_batch_size // world_size
    steps = next(k for k in itertools.count(math.ceil(per_rank / max_batch_size))
                 if per_rank % k == 0)
    return np.int64(per_rank // steps), np.int64(steps)


ALTERNATIVES = {
    lesson09.check_scaling_efficiency: SCALING_ALTERNATIVES,
    lesson09.check_all_reduce_seconds: [
        answer("the course's cost model", all_reduce_seconds_from_the_cost_model),
        answer("per ring step, a numpy float", all_reduce_seconds_per_step),
    ],
    lesson09.check_accumulation_plan: [
        answer("decreasing batch sizes, a list", plan_by_decreasing_batch),
        answer("divisors from the ceiling, numpy ints", plan_from_divisors),
    ],
}
