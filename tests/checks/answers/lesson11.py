"""Lesson 11's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import numpy as np
import torch
import torch.distributed as dist

from course_lib.checks import lesson11
from course_lib.topics.memory import (
    RECIPES,
    GiB,
    estimate_memory,
    fitting_recipes,
    measure_model_state,
    measure_training_step,
)

from . import answer, wrong_answer


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def held_by_storage_spans(model, optimizer):
    """Each tensor's bytes from its shape, the state found wherever it lives, numpy ints back."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local optimizer
    state = [_local(value) for per_parameter in inner.state.values()
             for value in per_parameter.values() if torch.is_tensor(value)]
    params = [_local(parameter) for parameter in model.parameters()]

    def nbytes(tensors):
        return np.int64(sum(tensor.numel() * tensor.element_size() for tensor in tensors))
    return {"parameters": nbytes(params), "gradients": nbytes(_local(p.grad) for p in
                                                              model.parameters()),
            "optimizer_state": nbytes(state)}


class Held:
    """An object with the three counts as attributes, as 0-dim integer tensors."""

    def __init__(self, model, optimizer):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        states = (optimizer.optim.state if isinstance(optimizer, ZeroRedundancyOptimizer)
                  else optimizer.state)
        self.parameters = torch.tensor(sum(p.to_local().nbytes if hasattr(p, "to_local") else
                                           p.nbytes for p in model.parameters()))
        self.gradients = torch.tensor(sum(p.grad.to_local().nbytes if hasattr(p.grad, "to_local")
                                          else p.grad.nbytes for p in model.parameters()))
        self.optimizer_state = torch.tensor(sum(
            (value.to_local() if hasattr(value, "to_local") else value).nbytes
            for state in states.values() for value in state.values()))


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
    lesson11.check_held_bytes: [
        answer("numel x element_size, numpy ints", held_by_storage_spans),
        answer("an object of 0-dim tensors, .nbytes", Held),
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


def _held(model, optimizer, local=True, state_of=None, keep=lambda name: True):
    """A count as a learner might write it; the wrong answers below change one part."""
    inner = getattr(optimizer, "optim", optimizer) if state_of is None else state_of(optimizer)
    view = _local if local else (lambda tensor: tensor)

    def nbytes(tensors):
        return sum(view(tensor).numel() * view(tensor).element_size() for tensor in tensors)
    return {"parameters": nbytes(model.parameters()),
            "gradients": nbytes(p.grad for p in model.parameters()),
            "optimizer_state": nbytes(value for per_parameter in inner.state.values()
                                      for name, value in per_parameter.items()
                                      if torch.is_tensor(value) and keep(name))}


def held_full_dtensors(model, optimizer):  # numel() of a DTensor is the full tensor's
    return _held(model, optimizer, local=False)


def held_zero_state_of_the_wrapper(model, optimizer):  # ZeroRedundancyOptimizer's own .state
    return _held(model, optimizer, state_of=lambda optimizer: optimizer)


def held_without_step_counters(model, optimizer):
    return _held(model, optimizer, keep=lambda name: name != "step")


def held_state_as_one_copy(model, optimizer):  # AdamW's state counted as 1x the parameters
    count = _held(model, optimizer)
    count["optimizer_state"] = count["parameters"]
    return count


def held_without_gradients(model, optimizer):
    return {**_held(model, optimizer), "gradients": 0}


def held_zero1_divides_parameters(model, optimizer):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    count = _held(model, optimizer)
    if isinstance(optimizer, ZeroRedundancyOptimizer):  # "ZeRO shards": but stage 1 not these
        count["parameters"] //= dist.get_world_size()
        count["gradients"] //= dist.get_world_size()
    return count


def held_by_the_library(model, optimizer):
    return measure_model_state(model, optimizer).parts()


def held_stub(model, optimizer):
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


def recipes_stub(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


WRONG_ANSWERS = {
    lesson11.check_held_bytes: [
        wrong_answer("counts a DTensor's numel(): the full tensor, not this rank's shard",
                     held_full_dtensors),
        wrong_answer("reads ZeroRedundancyOptimizer's own .state (empty)",
                     held_zero_state_of_the_wrapper),
        wrong_answer("leaves out AdamW's step counters", held_without_step_counters),
        wrong_answer("AdamW's state counted as 1x the parameters", held_state_as_one_copy),
        wrong_answer("forgets the gradients", held_without_gradients),
        wrong_answer("divides parameters and gradients by N under ZeRO-1",
                     held_zero1_divides_parameters),
        wrong_answer("returns the library's measure_model_state", held_by_the_library),
        wrong_answer("the stub", held_stub),
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
