"""Graders for lesson 11, memory: bytes per parameter under each ZeRO stage, the smallest
world_size for ZeRO-3 to fit, and which training recipes fit a large model on given GPUs.

- bytes per parameter under ZeRO: the bytes each rank holds per parameter, for stages 0 to 3
  (any kind of number: int, float, Fraction, numpy, a 0-dim tensor).
- the smallest world_size for ZeRO-3: the fewest ranks whose shard of 16 bytes per parameter fits
  next to the activations, a whole number (any integer type); a ValueError when nothing fits.
- which recipes fit: the recipes of RECIPES that fit, in RECIPES' order (list or tuple).

The references are course_lib.topics.memory's estimator, so the lesson and its graders count alike.
"""
import math
import numbers

import torch

from . import (GradingError, expect, expect_close, expect_value_error, expect_whole_number, grader,
               wrong_answer)
from ..topics.memory import RECIPES, GiB, Recipe, estimate_memory, fitting_recipes

STAGE_STRATEGIES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
# The ZeRO paper's layout: bf16 weights 2 + bf16 gradients 2 + fp32 master 4 + Adam's two fp32 values 8
MIXED_ADAM_BYTES = 16


# -- exercise 1: bytes per parameter under ZeRO --------------------------------------------------

ZERO_CASES = [(stage, world_size) for stage in (0, 1, 2, 3) for world_size in (1, 2, 4, 8, 64)]


def reference_zero_bytes_per_parameter(stage, world_size):
    n_parameters = 2**40  # divisible by every world_size graded: no rounding in the shards
    return estimate_memory(n_parameters, "adam", "bf16-mixed", STAGE_STRATEGIES[stage],
                           world_size).total / n_parameters


@grader("bytes per parameter under ZeRO")
def check_zero_bytes_per_parameter(zero_bytes_per_parameter):
    for stage, world_size in ZERO_CASES:
        call = f"zero_bytes_per_parameter(stage={stage}, world_size={world_size})"
        got = zero_bytes_per_parameter(stage, world_size)
        is_number = (isinstance(got, numbers.Real)
                     or (isinstance(got, torch.Tensor) and got.numel() == 1))
        expect(is_number and not isinstance(got, bool), call, "a number",
               f"{got!r} ({type(got).__name__})", "return the bytes as a number")
        expect_close(float(got), reference_zero_bytes_per_parameter(stage, world_size), call,
                     rtol=1e-9, hint=_zero_hint(stage))


def _zero_hint(stage):
    kept = {0: "DDP replicates all 16 bytes (2 weights + 2 gradients + 12 optimizer state, "
               "master copy included)",
            1: "stage 1 shards the 12 bytes of optimizer state (master copy included) only",
            2: "stage 2 shards the optimizer state and the 2 bytes of gradients",
            3: "stage 3 shards all 16 bytes, the weights too"}
    return kept[stage]


def _shards_one_stage_too_many(stage, world_size):
    sharded = {0: 12, 1: 14, 2: 16, 3: 16}[stage]
    return 16 - sharded + sharded / world_size


def _forgets_master_copy(stage, world_size):  # Adam's two values only: 8 bytes of state
    replicated = {0: 12, 1: 4, 2: 2, 3: 0}[stage]
    return replicated + (12 - replicated) / world_size


def _stage3_keeps_weights(stage, world_size):
    replicated = {0: 16, 1: 4, 2: 2, 3: 2}[stage]
    return replicated + (16 - replicated) / world_size


def _zero_stub(stage, world_size):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


# -- exercise 2: the smallest world_size for ZeRO-3 ----------------------------------------------

WORLD_SIZE_CASES = [  # (n_parameters, gpu_memory_bytes, activation_bytes)
    (8_400_000_000, 48 * GiB, 8 * GiB),
    (8_400_000_000, 80 * GiB, 2 * GiB),
    (70_000_000_000, 80 * GiB, 10 * GiB),
    (1_300_000_000, 24 * GiB, 2 * GiB),
    (175_000_000_000, 40 * GiB, 30 * GiB),
    (13_000_000_000, 24 * GiB, 20 * GiB),
]
IMPOSSIBLE_WORLD_SIZE_CASES = [(1_300_000_000, 16 * GiB, 16 * GiB),
                               (8_400_000_000, 24 * GiB, 30 * GiB)]


def reference_smallest_world_size_for_zero3(n_parameters, gpu_memory_bytes, activation_bytes):
    room = gpu_memory_bytes - activation_bytes
    if room < MIXED_ADAM_BYTES:
        raise ValueError(f"the activations alone ({activation_bytes / GiB:.1f} GiB) do not leave "
                         f"room in {gpu_memory_bytes / GiB:.1f} GiB: ZeRO-3 does not shard "
                         f"them; lower the micro-batch or checkpoint activations")
    world_size = max(1, math.ceil(n_parameters / (room // MIXED_ADAM_BYTES)))
    assert estimate_memory(n_parameters, "adam", "bf16-mixed", "zero3", world_size,
                           activation_bytes).fits(gpu_memory_bytes)
    return world_size


@grader("the smallest world_size for ZeRO-3")
def check_smallest_world_size_for_zero3(smallest_world_size_for_zero3):
    for n_parameters, gpu_memory_bytes, activation_bytes in WORLD_SIZE_CASES:
        call = (f"smallest_world_size_for_zero3({n_parameters:_}, {gpu_memory_bytes // GiB} * GiB, "
                f"{activation_bytes // GiB} * GiB)")
        got = smallest_world_size_for_zero3(n_parameters, gpu_memory_bytes, activation_bytes)
        expected = reference_smallest_world_size_for_zero3(n_parameters, gpu_memory_bytes,
                                                           activation_bytes)
        expect_whole_number(got, call, "a number of ranks is whole: round up")
        expect(got == expected, call, str(expected), str(got),
               "each rank holds 16 bytes x n_parameters / world_size of model state plus its own "
               "activations, which ZeRO-3 does not shard; take the smallest whole world_size "
               "whose total fits")
    for n_parameters, gpu_memory_bytes, activation_bytes in IMPOSSIBLE_WORLD_SIZE_CASES:
        call = (f"smallest_world_size_for_zero3({n_parameters:_}, {gpu_memory_bytes // GiB} * GiB, "
                f"{activation_bytes // GiB} * GiB)")
        expect_value_error(
            lambda: smallest_world_size_for_zero3(n_parameters, gpu_memory_bytes, activation_bytes),
            call, "the activations alone fill the GPU, and no number of ranks shards them",
            "raise ValueError when gpu_memory_bytes - activation_bytes leaves no room")


def _ignores_activations(n_parameters, gpu_memory_bytes, activation_bytes):
    return math.ceil(MIXED_ADAM_BYTES * n_parameters / gpu_memory_bytes)


def _rounds_down(n_parameters, gpu_memory_bytes, activation_bytes):
    room = gpu_memory_bytes - activation_bytes
    if room <= 0:
        raise ValueError("no room")
    return max(1, int(MIXED_ADAM_BYTES * n_parameters / room))


def _shards_activations_too(n_parameters, gpu_memory_bytes, activation_bytes):
    total = MIXED_ADAM_BYTES * n_parameters + activation_bytes
    return math.ceil(total / gpu_memory_bytes)


def _forgets_gradients(n_parameters, gpu_memory_bytes, activation_bytes):
    room = gpu_memory_bytes - activation_bytes
    if room <= 0:
        raise ValueError("no room")
    return math.ceil(14 * n_parameters / room)


def _world_size_stub(n_parameters, gpu_memory_bytes, activation_bytes):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


# -- exercise 3: which recipes fit ---------------------------------------------------------------

FIT_CASES = [  # (n_parameters, gpu_memory_bytes, world_size, activation_bytes)
    (8_400_000_000, 48 * GiB, 8, 6 * GiB),
    (8_400_000_000, 48 * GiB, 2, 6 * GiB),
    (1_300_000_000, 16 * GiB, 1, 4 * GiB),
    (70_000_000_000, 80 * GiB, 16, 12 * GiB),
]


def reference_recipes_that_fit(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    return fitting_recipes(n_parameters, gpu_memory_bytes, world_size, activation_bytes, RECIPES)


@grader("which recipes fit")
def check_recipes_that_fit(recipes_that_fit):
    for n_parameters, gpu_memory_bytes, world_size, activation_bytes in FIT_CASES:
        call = (f"recipes_that_fit({n_parameters:_}, {gpu_memory_bytes // GiB} * GiB, "
                f"world_size={world_size}, activation_bytes={activation_bytes // GiB} * GiB)")
        got = recipes_that_fit(n_parameters, gpu_memory_bytes, world_size, activation_bytes)
        expected = reference_recipes_that_fit(n_parameters, gpu_memory_bytes, world_size,
                                              activation_bytes)
        try:
            got = [Recipe(*recipe) for recipe in got]
        except TypeError:
            raise GradingError(call, "a list of recipes from RECIPES", repr(got)[:120],
                               "keep the Recipe tuples of RECIPES that fit") from None
        missing = [recipe for recipe in expected if recipe not in got]
        extra = [recipe for recipe in got if recipe not in expected]
        expect(not missing and not extra, call, f"{len(expected)} recipes",
               f"{len(got)} recipes; missing {_short(missing)}; should not fit {_short(extra)}",
               "for each recipe, estimate_memory(n_parameters, recipe.optimizer, "
               "recipe.precision, recipe.strategy, world_size, activation_bytes) and keep it "
               "when .fits(gpu_memory_bytes)")
        expect(got == expected, call, "the recipes in RECIPES' order", _short(got),
               "loop over RECIPES in order")


def _short(recipes):
    if not recipes:
        return "none"
    names = [f"{recipe.precision}/{recipe.optimizer}/{recipe.strategy}" for recipe in recipes[:3]]
    return ", ".join(names) + (f" and {len(recipes) - 3} more" if len(recipes) > 3 else "")


def _fit_ignoring_activations(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    return reference_recipes_that_fit(n_parameters, gpu_memory_bytes, world_size, 0)


def _fit_without_world_size(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    return reference_recipes_that_fit(n_parameters, gpu_memory_bytes, 1, activation_bytes)


def _first_that_fits(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    return reference_recipes_that_fit(n_parameters, gpu_memory_bytes, world_size,
                                      activation_bytes)[:1]


def _fit_counting_gb_as_gib(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    return [recipe for recipe in RECIPES
            if estimate_memory(n_parameters, recipe.optimizer, recipe.precision, recipe.strategy,
                               world_size, activation_bytes).total / 10**9
            <= gpu_memory_bytes / GiB]


def _recipes_stub(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


WRONG_ANSWERS = {
    check_zero_bytes_per_parameter: [
        wrong_answer("shards one stage too many (stage 1 shards the gradients)",
                     _shards_one_stage_too_many),
        wrong_answer("forgets the fp32 master copy of the weights", _forgets_master_copy),
        wrong_answer("stage 3 keeps the weights whole", _stage3_keeps_weights),
        wrong_answer("the stub", _zero_stub),
    ],
    check_smallest_world_size_for_zero3: [
        wrong_answer("ignores the activations", _ignores_activations),
        wrong_answer("rounds the world_size down", _rounds_down),
        wrong_answer("shards the activations too", _shards_activations_too),
        wrong_answer("forgets the gradients (14 bytes per parameter)", _forgets_gradients),
        wrong_answer("the stub", _world_size_stub),
    ],
    check_recipes_that_fit: [
        wrong_answer("ignores the activations", _fit_ignoring_activations),
        wrong_answer("estimates every recipe on one rank (no sharding)", _fit_without_world_size),
        wrong_answer("returns only the first recipe that fits", _first_that_fits),
        wrong_answer("compares GB of model state with GiB of memory", _fit_counting_gb_as_gib),
        wrong_answer("the stub", _recipes_stub),
    ],
}
