"""Lesson 11's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
from fractions import Fraction

import numpy as np
import torch

from course_lib.checks import lesson11
from course_lib.topics.memory import measure_training_step


from . import answer, wrong_answer  # noqa: F401


def zero_bytes_with_branches(stage, world_size):
    if stage == 0:
        return 16.0
    if stage == 1:
        return 4 + 12 / world_size
    if stage == 2:
        return 2 + 14 / world_size
    return 16 / world_size


def zero_bytes_from_what_is_sharded(stage, world_size):
    parts = {"weights": (2, 3), "gradients": (2, 2), "optimizer state": (12, 1)}
    return sum(Fraction(size, world_size) if stage >= sharded_from else size
               for size, sharded_from in parts.values())  # a Fraction


def largest_batch_by_bisection():
    # Measure real steps, and bisect on the batch size: no model of the memory at all
    def step_bytes(batch_size):
        model = lesson11.make_model(seed=0, hidden=256)
        X, y = torch.zeros(batch_size, 16), torch.zeros(batch_size, dtype=torch.long)
        return measure_training_step(model, torch.optim.Adam(model.parameters()), X, y).total

    low, high = 1, 4096  # step_bytes(low) fits, step_bytes(high) does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if step_bytes(middle) <= 1_000_000 else (low, middle)
    return low


def largest_batch_from_two_measurements():
    steps = {}
    for batch_size in (64, 192):
        model = lesson11.make_model(seed=0, hidden=256)
        X, y = torch.randn(batch_size, 16), torch.randint(0, 4, (batch_size,))
        steps[batch_size] = measure_training_step(model, torch.optim.Adam(model.parameters()), X, y)
    per_sample = (steps[192].activations - steps[64].activations) // 128  # the slope
    fixed = steps[64].total - 64 * per_sample  # model state and the batch's scalar
    return np.int64((1_000_000 - fixed) // per_sample)


def recipes_with_filter(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    from course_lib.topics.memory import estimate_memory

    def fits(recipe):
        estimate = estimate_memory(n_parameters, recipe.optimizer, recipe.precision,
                                   recipe.strategy, world_size, activation_bytes)
        return estimate.total <= gpu_memory_bytes

    return list(filter(fits, lesson11.RECIPES))


def recipes_as_a_tuple_of_plain_tuples(n_parameters, gpu_memory_bytes, world_size,
                                       activation_bytes):
    from course_lib.topics.memory import estimate_memory

    kept = []
    for optimizer, precision, strategy in ((r.optimizer, r.precision, r.strategy)
                                           for r in lesson11.RECIPES):
        if estimate_memory(n_parameters, optimizer, precision, strategy, world_size,
                           activation_bytes).fits(gpu_memory_bytes):
            kept.append(tuple(lesson11.Recipe(optimizer=optimizer, precision=precision,
                                              strategy=strategy)))
    return tuple(kept)


ALTERNATIVES = {
    lesson11.check_zero_bytes_per_parameter: [
        answer("branches", zero_bytes_with_branches),
        answer("what is sharded, a Fraction", zero_bytes_from_what_is_sharded),
    ],
    lesson11.check_largest_batch: [
        answer("bisection on measured steps", largest_batch_by_bisection()),
        answer("the slope of two measurements, a numpy integer",
               largest_batch_from_two_measurements()),
    ],
    lesson11.check_recipes_that_fit: [
        answer("filter and .total", recipes_with_filter),
        answer("a tuple of plain tuples", recipes_as_a_tuple_of_plain_tuples),
    ],
}
