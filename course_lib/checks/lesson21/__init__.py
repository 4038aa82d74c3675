"""Graders for lesson 21, planning a model that does not fit.

- bytes per GPU: your bytes_per_gpu(shape, recipe, micro_batch, microbatches, precision) for many
  recipes (tensor, pipeline and data parallel sizes, ZeRO stages, checkpointing, offload; bf16-mixed
  and fp32 Adam) on the lesson's 8.36 B model and on a model drawn from grading_seed, judged against
  course_lib.topics.planning.plan_memory part by part; then against a measured small run: lesson 17's
  tensor-parallel layers trained one Adam step on 2 gloo ranks, what each rank holds counted by
  memory.py's meters (the parameters and gradients to the byte, the optimizer state but for Adam's
  step counters, the activations within ACTIVATION_BAND).
- fitting plans: see plans.py.
"""
import math
import random

from ...topics.memory import GB
from ...topics.plan_measured import measure_on_rank, small_shape
from ...topics.planning import (ParallelRecipe, activation_bytes_per_gpu, layer_activation_bytes,
                                parameters_per_gpu, plan_memory)
from ...topics.step_time import candidate_recipes
from ..engine import GradingError, expect, grader
from ..engine.boundary import grading_seed
from ..engine.learner_call import call_learner
from ..engine.ranks import run_on_ranks
from .cases import BIG, drawn_shape
from .plans import check_fitting_plans  # noqa: F401  (exercise 2)

SEED = 21
# the course's answer and its pieces: the learner writes these parts (exercise 2 may call them)
COURSE_ANSWER = (plan_memory, parameters_per_gpu, activation_bytes_per_gpu, layer_activation_bytes)
PARTS = ("parameters", "gradients", "optimizer_state", "activations")
ACTIVATION_BAND = 0.05  # the estimate's activations within 5% of the measured ones (1% off for a right answer)
BIG_CASES = [  # (recipe, micro_batch, microbatches, precision): each mistake shows in one of them
    (ParallelRecipe(8, 1, 1), 1, 8, "bf16-mixed"),
    (ParallelRecipe(2, 4, 1, zero=1), 1, 16, "bf16-mixed"),
    (ParallelRecipe(1, 2, 4), 1, 16, "bf16-mixed"),
    (ParallelRecipe(2, 1, 4, zero=2, checkpointing=True), 1, 2, "bf16-mixed"),
    (ParallelRecipe(4, 2, 1, zero=3, checkpointing=True), 2, 8, "bf16-mixed"),
    (ParallelRecipe(8, 1, 1, zero=1, offload=True), 1, 8, "bf16-mixed"),
    (ParallelRecipe(2, 2, 2, zero=2, checkpointing=True, offload=True), 1, 8, "fp32"),
]


def memory_cases(seed: int) -> list:
    """(shape, recipe, micro_batch, microbatches, precision): the lesson's model, a drawn one."""
    draw = random.Random(seed)
    shape = drawn_shape(draw)
    drawn = draw.sample(candidate_recipes(shape, draw.choice((8, 16))), 6)
    return ([(BIG, *case) for case in BIG_CASES] +
            [(shape, recipe, draw.choice((1, 2)), draw.choice((1, 3, 8)), draw.choice(("bf16-mixed", "fp32")))
             for recipe in drawn])


def _estimates(bytes_per_gpu, cases) -> list:
    """On the learner's side: for each case, {part: number or None} and what came back, shown."""
    answers = []
    for case in cases:
        got = bytes_per_gpu(*case)
        if not isinstance(got, dict):
            got = {part: getattr(got, part, None) for part in PARTS}
        answers.append({"parts": {part: _number(got.get(part)) for part in PARTS}, "shown": repr(got)[:160]})
    return answers


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _call(shape, recipe, micro_batch, microbatches, precision) -> str:
    model = "the 8.36 B model" if shape == BIG else f"{shape}"
    return (f"bytes_per_gpu({model}, {recipe.describe()}, micro_batch={micro_batch}, "
            f"microbatches={microbatches}, {precision!r})")


HINTS = {
    "parameters": "tensor parallelism divides each layer's 12h^2 + 7h split weights and biases by t; the two "
                  "LayerNorms and the row-parallel biases (6h) stay whole on every TP rank; stage 0 holds L/p "
                  "layers and the embeddings (vocab/t rows, the positions whole); ZeRO-3 divides by dp",
    "gradients": "one gradient per parameter this GPU holds, in the parameters' dtype; ZeRO-2 and 3 divide by dp",
    "optimizer_state": "Adam in fp32: its two values and, under bf16-mixed, the fp32 master copy (12 bytes a "
                       "parameter; 8 in fp32), divided by dp from ZeRO-1; offload leaves none on the GPU",
    "activations": "1F1B's stage 0 holds min(p, m) micro-batches at once; a layer keeps s*b*h*(10 + 24/t) "
                   "16-bit values' bytes (twice in fp32); with checkpointing only each layer's input, "
                   "s*b*h values, plus one layer recomputed whole",
}


def _judge(answer, expected, what) -> None:
    for part in PARTS:
        got, want = answer["parts"][part], getattr(expected, part)
        expect(got is not None, f"{what}: {part}", "a number of bytes", answer["shown"],
               "return a dict with the keys " + ", ".join(PARTS))
        expect(math.isclose(got, want, rel_tol=1e-6, abs_tol=1), f"{what}: {part}",
               f"{want / GB:.4g} GB ({want:,} bytes)", f"{got / GB:.4g} GB ({got:,.0f} bytes)", HINTS[part])


@grader("bytes per GPU")
def check_bytes_per_gpu(bytes_per_gpu):
    seed = grading_seed(SEED)
    small = small_shape(layers=2, hidden=16 * random.Random(seed).randint(3, 6), heads=4, seq_len=32)
    small_case = (small, ParallelRecipe(1, 2, 1), 4, 1, "fp32")
    cases = memory_cases(seed) + [small_case]
    answers = call_learner(_estimates, bytes_per_gpu, cases,
                           what="bytes_per_gpu(shape, recipe, micro_batch, microbatches, precision)",
                           hint="it returns {part: bytes} for one GPU", written_by_you=COURSE_ANSWER)
    for case, answer in zip(cases, answers):
        _judge(answer, plan_memory(*case), _call(*case))
    measured = run_on_ranks(measure_on_rank, small, 4, False, nprocs=2, learner=False,
                            what="the small tensor-parallel run", hang_hint="the course's run hung: tell the course")
    estimate = answers[-1]["parts"]
    for rank, held in enumerate(measured):
        what = f"your estimate of {small} on tensor-parallel rank {rank} of 2, against the measured run"
        for part in ("parameters", "gradients"):
            expect(estimate[part] == held[part], f"{what}: {part}", f"{held[part]:,} bytes (measured)",
                   f"{estimate[part]:,.0f}", HINTS[part])
        steps = held["optimizer_state"] - estimate["optimizer_state"]
        expect(0 <= steps <= 4 * (12 * small.layers + 2), f"{what}: optimizer state",  # a counter a tensor
               f"{held['optimizer_state']:,} bytes (measured, Adam's 4-byte step counters included)",
               f"{estimate['optimizer_state']:,.0f}", HINTS["optimizer_state"])
        band = abs(estimate["activations"] / held["activations"] - 1)
        if band > ACTIVATION_BAND:
            raise GradingError(f"{what}: activations", f"within {ACTIVATION_BAND:.0%} of "
                               f"{held['activations']:,} bytes (measured)",
                               f"{estimate['activations']:,.0f} ({band:.0%} off)", HINTS["activations"])
