"""Lesson 11's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
from fractions import Fraction

import numpy as np
import torch

from course_lib.checks import lesson11
from course_lib.topics.memory import (RECIPES, GiB, estimate_memory, fitting_recipes,
                                      measure_training_step)

from . import answer, wrong_answer


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


# Wrong answers

# The step at batch b holds 86,096 bytes of model state (21,520 + 21,520 + 43,056: Adam's step
# counters are 4 scalars), plus 1,112 bytes of activations per sample and one 4-byte scalar.
REFERENCE_LARGEST_BATCH = 821  # 86,100 + 1,112 x 821 = 999,052; with 822: 1,000,164


def shards_one_stage_too_many(stage, world_size):
    sharded = {0: 12, 1: 14, 2: 16, 3: 16}[stage]
    return 16 - sharded + sharded / world_size


def forgets_master_copy(stage, world_size):  # Adam's two values only: 8 bytes of state
    replicated = {0: 12, 1: 4, 2: 2, 3: 0}[stage]
    return replicated + (12 - replicated) / world_size


def stage3_keeps_weights(stage, world_size):
    replicated = {0: 16, 1: 4, 2: 2, 3: 2}[stage]
    return replicated + (16 - replicated) / world_size


def zero_stub(stage, world_size):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


def _judged_in_a_loop(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    """The recipes that fit, judged one by one (the wrong answers below change one input)."""
    return [recipe for recipe in RECIPES
            if estimate_memory(n_parameters, recipe.optimizer, recipe.precision, recipe.strategy,
                               world_size, activation_bytes).fits(gpu_memory_bytes)]


def fit_ignoring_activations(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    return _judged_in_a_loop(n_parameters, gpu_memory_bytes, world_size, 0)


def fit_without_world_size(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    return _judged_in_a_loop(n_parameters, gpu_memory_bytes, 1, activation_bytes)


def first_that_fits(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    return _judged_in_a_loop(n_parameters, gpu_memory_bytes, world_size, activation_bytes)[:1]


def fit_counting_gb_as_gib(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    return [recipe for recipe in RECIPES
            if estimate_memory(n_parameters, recipe.optimizer, recipe.precision, recipe.strategy,
                               world_size, activation_bytes).total / 10**9
            <= gpu_memory_bytes / GiB]


def fit_by_calling_the_library(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    return fitting_recipes(n_parameters, gpu_memory_bytes, world_size, activation_bytes)


def fit_by_the_library_imported_inside(n_parameters, gpu_memory_bytes, world_size,
                                       activation_bytes):
    from course_lib.topics import memory

    return list(memory.fitting_recipes(n_parameters, gpu_memory_bytes, world_size,
                                       activation_bytes, memory.RECIPES))


def zero_bytes_from_the_estimator(stage, world_size):
    n_parameters = 2**40
    return estimate_memory(n_parameters, "adam", "bf16-mixed", lesson11.STAGE_STRATEGIES[stage],
                           world_size).total / n_parameters


def recipes_stub(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


WRONG_ANSWERS = {
    lesson11.check_zero_bytes_per_parameter: [
        wrong_answer("shards one stage too many (stage 1 shards the gradients)",
                     shards_one_stage_too_many),
        wrong_answer("forgets the fp32 master copy of the weights", forgets_master_copy),
        wrong_answer("stage 3 keeps the weights whole", stage3_keeps_weights),
        wrong_answer("calls the library's estimate_memory", zero_bytes_from_the_estimator),
        wrong_answer("the stub", zero_stub),
    ],
    lesson11.check_largest_batch: [
        wrong_answer("forgets the model state: the budget over the bytes per sample", 899),
        wrong_answer("forgets Adam's state (SGD's memory)", 860),
        wrong_answer("rounds up", REFERENCE_LARGEST_BATCH + 1),
        wrong_answer("one short (a strict inequality)", REFERENCE_LARGEST_BATCH - 1),
        wrong_answer("per-sample bytes from a batch of 1, where the scalar weighs", 818),
        wrong_answer("not rounded", 821.85),
        wrong_answer("the budget taken as 1 MiB (2**20 bytes)", 865),
        wrong_answer("a round guess", 800),
        wrong_answer("the bytes of the step, not the number of samples", 999_052),
        wrong_answer("the bytes per sample counted in float32 values (278), not bytes", 3287),
    ],
    lesson11.check_recipes_that_fit: [
        wrong_answer("ignores the activations", fit_ignoring_activations),
        wrong_answer("estimates every recipe on one rank (no sharding)", fit_without_world_size),
        wrong_answer("returns only the first recipe that fits", first_that_fits),
        wrong_answer("compares GB of model state with GiB of memory", fit_counting_gb_as_gib),
        wrong_answer("returns the library's fitting_recipes", fit_by_calling_the_library),
        wrong_answer("the library's fitting_recipes, imported inside the function",
                     fit_by_the_library_imported_inside),
        wrong_answer("the stub", recipes_stub),
    ],
}
