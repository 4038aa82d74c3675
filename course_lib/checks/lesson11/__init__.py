"""Graders for lesson 11, memory: the largest batch that fits a budget, from a measured step;
what each rank holds under DDP, ZeRO-1 and FSDP, counted on ranks (held.py); which training
recipes fit a large model on given GPUs.

- the largest batch that fits: a whole number of samples at which a real step of the lesson's
  model (256 wide, Adam, fp32) fits in BUDGET_BYTES and one sample more does not. The grader
  measures both steps again: counted tensor bytes on the CPU are the same on every machine and
  every run, so re-measuring is exact, and any honest way of finding the number passes.
- what each rank holds: see held.py.
- which recipes fit: the recipes of RECIPES that fit, in RECIPES' order (list or tuple), each
  judged by the answer itself: a call of the library's fitting_recipes is not an answer.

The references are course_lib.topics.memory's estimator, so the lesson and its graders count alike;
course_lib.checks.engine.call_watch sees which of them the learner's function called.
"""

import torch

from ...topics.memory import (
    RECIPES,
    GiB,
    Recipe,
    estimate_memory,
    fitting_recipes,
    measure_training_step,
)
from ...training.data import N_CLASSES, N_FEATURES
from ...training.models import make_model
from ..engine import GradingError, expect, expect_whole_number, grader
from ..engine.boundary import grading_seed
from ..engine.call_watch import calls_of
from ..engine.learner_call import call_learner
from ..engine.observations import as_plain
from .held import check_held_bytes  # noqa: F401  (exercise 2)

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
    # largest_batch is data (the learner's number), and no learner code runs here: the grader
    # measures the steps itself, on inputs whose values do not change the bytes counted.
    expect_whole_number(largest_batch, "largest_batch",
                        "a batch is a whole number of samples, and yours is not one")
    expect(largest_batch >= 1, "largest_batch", "at least 1 sample", repr(largest_batch))
    input_bytes = 4 * N_FEATURES * largest_batch  # measured below only when this much could fit
    expect(input_bytes <= BUDGET_BYTES, "largest_batch", "a number of samples whose step fits in "
           f"{BUDGET_BYTES:,} bytes", f"{largest_batch:,}",
           f"the input batch alone, {largest_batch:,} x {N_FEATURES} float32 values, is "
           f"{input_bytes:,} bytes: is this a number of bytes rather than of samples?")
    fits = measured_step_bytes(largest_batch)
    expect(fits <= BUDGET_BYTES, f"a step measured at largest_batch = {largest_batch}",
           f"at most the budget, {BUDGET_BYTES:,} bytes", f"{fits:,} bytes",
           f"at {largest_batch} samples the step holds {fits - BUDGET_BYTES:,} bytes more than the "
           f"budget: the batch is too large")
    above = measured_step_bytes(largest_batch + 1)
    expect(above > BUDGET_BYTES, f"a step measured at largest_batch + 1 = {largest_batch + 1}",
           f"more than the budget, {BUDGET_BYTES:,} bytes (else largest_batch is not the largest)",
           f"{above:,} bytes", f"at {largest_batch + 1} samples the step still fits, with "
                               f"{BUDGET_BYTES - above:,} bytes to spare: a larger batch fits")


# -- exercise 3: which recipes fit ---------------------------------------------------------------

FIT_CASES = [  # (n_parameters, gpu_memory_bytes, world_size, activation_bytes)
    (8_400_000_000, 48 * GiB, 8, 6 * GiB),
    (8_400_000_000, 48 * GiB, 2, 6 * GiB),
    (1_300_000_000, 16 * GiB, 1, 4 * GiB),
    (70_000_000_000, 80 * GiB, 16, 12 * GiB),
]


def reference_recipes_that_fit(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    return fitting_recipes(n_parameters, gpu_memory_bytes, world_size, activation_bytes, RECIPES)


def fit_cases(seed):
    """FIT_CASES, then one drawn from `seed` (grading_seed): a model, a card and a world size the
    notebook never saw."""
    generator = torch.Generator().manual_seed(seed)
    billions, card, world_size, activations = (
        int(torch.randint(low, high, (1,), generator=generator)) for low, high in
        ((1, 80), (16, 97), (1, 33), (1, 13)))
    return FIT_CASES + [(billions * 1_000_000_000, card * GiB, world_size, activations * GiB)]


def _recipes_answers(recipes_that_fit, cases):
    """On the learner's side: for each case, the recipes returned (each as a plain list of its
    fields; None when the answer is not a list of recipes, with its repr) and the library calls."""
    answers = []
    for case in cases:
        with calls_of(fitting_recipes) as called:
            got = recipes_that_fit(*case)
        try:
            recipes = [as_plain(list(Recipe(*recipe))) for recipe in got]
        except TypeError:
            recipes = None
        answers.append({"called": list(called), "recipes": recipes, "shown": repr(got)[:120]})
    return answers


@grader("which recipes fit")
def check_recipes_that_fit(recipes_that_fit):
    cases = fit_cases(grading_seed(0))
    answers = call_learner(_recipes_answers, recipes_that_fit, cases,
                           what="recipes_that_fit(n_parameters, gpu_memory_bytes, world_size, "
                                "activation_bytes)")
    for (n_parameters, gpu_memory_bytes, world_size, activation_bytes), answer in zip(cases, answers):
        call = (f"recipes_that_fit({n_parameters:_}, {gpu_memory_bytes // GiB} * GiB, "
                f"world_size={world_size}, activation_bytes={activation_bytes // GiB} * GiB)")
        expect(not answer["called"], f"what {call} called", "your own judgement of each recipe",
               "the library's fitting_recipes" if answer["called"] else "",
               "fitting_recipes is the library's answer to this exercise: decide for each recipe "
               "yourself whether its estimate fits")
        expected = reference_recipes_that_fit(n_parameters, gpu_memory_bytes, world_size,
                                              activation_bytes)
        if answer["recipes"] is None:
            raise GradingError(call, "a list of recipes from RECIPES", answer["shown"],
                               "keep the Recipe tuples of RECIPES that fit")
        got = [Recipe(*recipe) for recipe in answer["recipes"]]
        missing = [recipe for recipe in expected if recipe not in got]
        extra = [recipe for recipe in got if recipe not in expected]
        if missing or extra:
            raise GradingError(call, f"{len(expected)} recipes", f"{len(got)} recipes; missing "
                               f"{_short(missing)}; should not fit {_short(extra)}",
                               _fit_hint(missing, extra, n_parameters, gpu_memory_bytes,
                                         world_size, activation_bytes))
        expect(got == expected, call, "the recipes in RECIPES' order", _short(got),
               "the right recipes, in another order than RECIPES'")


def _fit_hint(missing, extra, n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    """The first recipe judged wrong, with its estimate per rank against the card."""
    recipe = (missing or extra)[0]
    estimate = estimate_memory(n_parameters, recipe.optimizer, recipe.precision, recipe.strategy,
                               world_size, activation_bytes)
    sharded = estimate_memory(n_parameters, recipe.optimizer, recipe.precision, recipe.strategy,
                              world_size)
    return (f"{recipe.precision}/{recipe.optimizer}/{recipe.strategy} on {world_size} ranks holds "
            f"{estimate.total / GiB:.1f} GiB per rank ({sharded.total / GiB:.1f} GiB of model "
            f"state + {activation_bytes / GiB:.0f} GiB of activations) against "
            f"{gpu_memory_bytes / GiB:.0f} GiB: it {'fits' if recipe in missing else 'does not fit'}")


def _short(recipes):
    if not recipes:
        return "none"
    names = [f"{recipe.precision}/{recipe.optimizer}/{recipe.strategy}" for recipe in recipes[:3]]
    return ", ".join(names) + (f" and {len(recipes) - 3} more" if len(recipes) > 3 else "")
