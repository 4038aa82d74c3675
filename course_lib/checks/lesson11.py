"""Graders for lesson 11, memory: the largest batch that fits a budget, from a measured step;
bytes per parameter under each ZeRO stage; which training recipes fit a large model on given GPUs.

- the largest batch that fits: a whole number of samples at which a real step of the lesson's
  model (256 wide, Adam, fp32) fits in BUDGET_BYTES and one sample more does not. The grader
  measures both steps again: counted tensor bytes on the CPU are the same on every machine and
  every run, so re-measuring is exact, and any honest way of finding the number passes.
- bytes per parameter under ZeRO: the bytes each rank holds per parameter, for stages 0 to 3
  (any kind of number: int, float, Fraction, numpy, a 0-dim tensor).
- which recipes fit: the recipes of RECIPES that fit, in RECIPES' order (list or tuple).

The references are course_lib.topics.memory's estimator, so the lesson and its graders count alike.
"""
import numbers

import torch

from . import GradingError, expect, expect_close, expect_whole_number, grader, wrong_answer
from ..topics.memory import (RECIPES, GiB, Recipe, estimate_memory, fitting_recipes,
                             measure_training_step)
from ..training.data import N_CLASSES, N_FEATURES
from ..training.models import make_model

STAGE_STRATEGIES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}


# -- exercise 1: the largest batch that fits, from a measured step ------------------------------

BUDGET_BYTES = 1_000_000  # a toy card for the lesson's toy model
MODEL_HIDDEN = 256        # the lesson's MLP, trained with Adam in fp32


def measured_step_bytes(batch_size: int) -> int:
    """The bytes a real training step of the lesson's model holds at `batch_size` (counted on the
    CPU: parameters, gradients, Adam's state and the saved activations; the same on any machine)."""
    model = make_model(seed=0, hidden=MODEL_HIDDEN)
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(batch_size, N_FEATURES, generator=generator)
    y = torch.randint(0, N_CLASSES, (batch_size,), generator=generator)
    return measure_training_step(model, torch.optim.Adam(model.parameters(), lr=1e-3), X, y).total


@grader("the largest batch that fits")
def check_largest_batch(largest_batch):
    expect_whole_number(largest_batch, "largest_batch",
                        "a batch is a whole number of samples: round down with int() or //")
    expect(largest_batch >= 1, "largest_batch", "at least 1 sample", repr(largest_batch))
    hint = ("the model state (parameters, gradients, optimizer state) does not grow with the "
            "batch; the activations grow in proportion to it: largest = (budget - model state) "
            "// activation bytes per sample, with both measured (take the activations' slope "
            "between two batch sizes, or measure at a large batch, so the batch's constant "
            "bytes do not skew it)")
    fits = measured_step_bytes(largest_batch)
    expect(fits <= BUDGET_BYTES, f"a step measured at largest_batch = {largest_batch}",
           f"at most the budget, {BUDGET_BYTES:,} bytes", f"{fits:,} bytes", hint)
    above = measured_step_bytes(largest_batch + 1)
    expect(above > BUDGET_BYTES, f"a step measured at largest_batch + 1 = {largest_batch + 1}",
           f"more than the budget, {BUDGET_BYTES:,} bytes (else largest_batch is not the largest)",
           f"{above:,} bytes", hint)


# The step at batch b holds 86,096 bytes of model state (21,520 + 21,520 + 43,056: Adam's step
# counters are 4 scalars), plus 1,112 bytes of activations per sample and one 4-byte scalar.
REFERENCE_LARGEST_BATCH = 821  # 86,100 + 1,112 x 821 = 999,052; with 822: 1,000,164


# -- exercise 2: bytes per parameter under ZeRO --------------------------------------------------

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
    check_largest_batch: [
        wrong_answer("forgets the model state: the budget over the bytes per sample", 899),
        wrong_answer("forgets Adam's state (SGD's memory)", 860),
        wrong_answer("rounds up", REFERENCE_LARGEST_BATCH + 1),
        wrong_answer("one short (a strict inequality)", REFERENCE_LARGEST_BATCH - 1),
        wrong_answer("per-sample bytes from a batch of 1, where the scalar weighs", 818),
        wrong_answer("not rounded", 821.85),
    ],
    check_recipes_that_fit: [
        wrong_answer("ignores the activations", _fit_ignoring_activations),
        wrong_answer("estimates every recipe on one rank (no sharding)", _fit_without_world_size),
        wrong_answer("returns only the first recipe that fits", _first_that_fits),
        wrong_answer("compares GB of model state with GiB of memory", _fit_counting_gb_as_gib),
        wrong_answer("the stub", _recipes_stub),
    ],
}
