"""Lesson 21, exercise 2: the recipes that fit, and each one's predicted step time.

Your fitting_plans(shape, cluster, global_batch) returns {recipe: seconds} for every recipe of
dp * tp * pp = the cluster's GPUs (t dividing the heads, p the layers, ZeRO stages only with dp > 1,
checkpointing and offload on or off) whose dp ranks split the batch into whole micro-batches of one
sequence and whose stage 0 fits (planning.plan_memory), each with the step time of
step_time.step_seconds' model. Judged against step_time.search on the lesson's cluster, on one
where tensor parallelism can cross nodes, and on a model and cluster drawn from grading_seed. A
call of the library's search, step_seconds or candidate_recipes is the library's answer, not yours.
"""
import math
import random
from dataclasses import astuple, is_dataclass

from ...topics.memory import GB
from ...topics.planning import ParallelRecipe, plan_memory
from ...topics.step_time import Cluster, STATED_CLUSTER, candidate_recipes, search, step_seconds
from ..engine import GradingError, expect, grader
from ..engine.boundary import grading_seed
from ..engine.learner_call import call_learner
from .cases import BIG, drawn_shape

SEED, GLOBAL_BATCH = 21, 16  # the lesson's batch: 16 sequences of 8,192 tokens
NARROW_NODES = Cluster(nodes=4, gpus_per_node=2, gpu_memory_bytes=int(40e9), peak_flops=312e12, mfu=0.45,
                       intra_node_busbw=200e9, inter_node_busbw=12.5e9, host_bandwidth=25e9)


def plan_cases(seed: int) -> list:
    """(shape, cluster, global_batch): the lesson's, narrow nodes, and one drawn."""
    draw = random.Random(seed + 1)
    shape = drawn_shape(draw)
    gpus_per_node = draw.choice((2, 4, 8))
    cluster = Cluster(nodes=draw.choice((2, 4)) if gpus_per_node < 8 else 2, gpus_per_node=gpus_per_node,
                      gpu_memory_bytes=draw.choice((16, 24, 40, 80)) * 10**9,
                      peak_flops=draw.choice((125e12, 312e12, 989e12)), mfu=draw.uniform(0.3, 0.5),
                      intra_node_busbw=draw.choice((50e9, 150e9, 400e9)),
                      inter_node_busbw=draw.choice((5e9, 12.5e9, 50e9)), host_bandwidth=25e9)
    return [(BIG, STATED_CLUSTER, GLOBAL_BATCH), (BIG, NARROW_NODES, 32),
            (shape, cluster, 16 * draw.randint(1, 8))]


def _plans(fitting_plans, cases) -> list:
    """On the learner's side: each case's plans as [dp, tp, pp, zero, checkpointing, offload, seconds]
    (None when the answer is not a dict of recipes), and what it showed."""
    answers = []
    for case in cases:
        got = fitting_plans(*case)
        try:
            plans = [[*(int(field) for field in astuple(ParallelRecipe(*_fields(recipe)))), float(seconds)]
                     for recipe, seconds in got.items()]
        except (AttributeError, TypeError, ValueError):
            plans = None
        answers.append({"plans": plans, "shown": repr(got)[:200]})
    return answers


def _fields(recipe) -> tuple:
    return astuple(recipe) if is_dataclass(recipe) else tuple(recipe)


def _why(recipe, shape, cluster, global_batch) -> str:
    if recipe.world_size != cluster.world_size:
        return f"dp * tp * pp = {recipe.world_size}, not the cluster's {cluster.world_size} GPUs"
    if shape.heads % recipe.tp or shape.layers % recipe.pp:
        return f"tp={recipe.tp} must divide the {shape.heads} heads and pp={recipe.pp} the {shape.layers} layers"
    if recipe.dp == 1 and recipe.zero:
        return "ZeRO shards over the dp ranks: with dp=1 it is DDP (zero=0), one recipe, not four"
    if global_batch % recipe.dp:
        return f"{global_batch} sequences do not split into whole micro-batches over dp={recipe.dp}"
    held = plan_memory(shape, recipe, 1, global_batch // recipe.dp).total
    fits = held <= cluster.gpu_memory_bytes
    return (f"stage 0 holds {held / GB:.1f} GB against the GPU's {cluster.gpu_memory_bytes / GB:.1f} GB: "
            f"it {'fits' if fits else 'does not fit'}")


def _time_hint(recipe, got, shape, cluster, global_batch) -> str:
    parts = step_seconds(shape, recipe, cluster, global_batch)
    total = sum(parts.values())
    if parts["pipeline bubble"] and math.isclose(got, total - parts["pipeline bubble"], rel_tol=1e-4):
        return (f"that is the step without its pipeline bubble: p - 1 of the m + p - 1 slots idle, "
                f"{parts['pipeline bubble']:.3g} s here")
    if recipe.tp > cluster.gpus_per_node:
        return (f"tp={recipe.tp} spans more than a node's {cluster.gpus_per_node} GPUs: its all-reduces "
                f"cross the network, at {cluster.inter_node_busbw / GB:g} GB/s, not the node's links")
    return "the model's parts here: " + ", ".join(f"{name} {seconds:.4g} s" for name, seconds in parts.items())


@grader("fitting plans")
def check_fitting_plans(fitting_plans):
    cases = plan_cases(grading_seed(SEED))
    answers = call_learner(_plans, fitting_plans, cases, what="fitting_plans(shape, cluster, global_batch)",
                           hint="the error was raised in your function (its traceback is below)",
                           written_by_you=(search, step_seconds, candidate_recipes))
    for (shape, cluster, global_batch), answer in zip(cases, answers):
        what = (f"fitting_plans on {'the 8.36 B model' if shape == BIG else shape}, "
                f"{cluster.nodes} nodes of {cluster.gpus_per_node} GPUs, {global_batch} sequences")
        if answer["plans"] is None:
            raise GradingError(what, "a dict {recipe: seconds}", answer["shown"],
                               "key each time by its ParallelRecipe(dp, tp, pp, zero, checkpointing, offload)")
        got = {ParallelRecipe(*plan[:3], plan[3], bool(plan[4]), bool(plan[5])): plan[6] for plan in answer["plans"]}
        expected = search(shape, cluster, global_batch)
        for recipe in list(got) + list(expected):
            if (recipe in got) != (recipe in expected):
                raise GradingError(what, f"{len(expected)} recipes that fit", f"{len(got)}; "
                                   f"{recipe.describe()} {'missing' if recipe in expected else 'should not be there'}",
                                   _why(recipe, shape, cluster, global_batch))
        for recipe, seconds in expected.items():
            expect(math.isclose(got[recipe], seconds, rel_tol=1e-6), f"{what}: the step time of {recipe.describe()}",
                   f"{seconds:.4g} s", f"{got[recipe]:.4g} s", _time_hint(recipe, got[recipe], shape, cluster,
                                                                          global_batch))
