"""Lesson 21's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones, each one mistake away from right
(WRONG_ANSWERS, each must be rejected).
"""
import itertools
import math

from course_lib.checks import lesson21
from course_lib.topics.cost_model import ring_all_reduce_time
from course_lib.topics.memory import bytes_per_parameter
from course_lib.topics.planning import ParallelRecipe, activation_bytes_per_gpu, parameters_per_gpu, plan_memory
from course_lib.topics.step_time import search

from . import answer, wrong_answer


# -- bytes per GPU: the solution's arithmetic, each mistake a switch -------------------------------
def bytes_per_gpu_with(layer_norms_split=False, one_in_flight=False, all_layers_on_each_stage=False,
                       checkpointing_ignored=False, bf16_optimizer=False, offload_ignored=False,
                       zero1_shards_parameters=False):
    def bytes_per_gpu(shape, recipe, micro_batch, microbatches, precision="bf16-mixed"):
        h, t, p = shape.hidden, recipe.tp, recipe.pp
        layer = (12 * h * h + 13 * h) / t if layer_norms_split else (12 * h * h + 7 * h) / t + 6 * h
        layers = shape.layers if all_layers_on_each_stage else shape.layers // p
        n = layers * layer + shape.vocab * h / t + shape.positions * h + (2 * h if p == 1 else 0)
        weight, state = (4, 8) if precision == "fp32" else (2, 4 if bf16_optimizer else 12)
        shard = math.ceil(n / recipe.dp)
        value = 4 if precision == "fp32" else 2
        tokens = shape.seq_len * micro_batch * h
        full_layer = tokens * (10 + 24 / t) * value / 2
        in_flight = 1 if one_in_flight else min(p, microbatches)
        if recipe.checkpointing and not checkpointing_ignored:
            activations = in_flight * layers * tokens * value + full_layer
        else:
            activations = in_flight * layers * full_layer
        sharded_parameters = recipe.zero >= 3 or (zero1_shards_parameters and recipe.zero >= 1)
        return {"parameters": weight * (shard if sharded_parameters else n),
                "gradients": weight * (shard if recipe.zero >= 2 else n),
                "optimizer_state": 0 if recipe.offload and not offload_ignored else
                state * (shard if recipe.zero >= 1 else n),
                "activations": activations}
    return bytes_per_gpu


def bytes_per_gpu_by_parts(shape, recipe, micro_batch, microbatches, precision="bf16-mixed"):
    """The same through memory.bytes_per_parameter and a count per kind of tensor."""
    h = shape.hidden
    whole = 2 * 2 * h + 2 * h                                   # LayerNorms, row-parallel biases
    split = 3 * h * h + 3 * h + h * h + 4 * h * h + 4 * h + 4 * h * h  # qkv, out, fc1, fc2
    n = shape.layers // recipe.pp * (split // recipe.tp + whole) + shape.vocab * h // recipe.tp
    n += shape.positions * h + (2 * h if recipe.pp == 1 else 0)
    per = bytes_per_parameter("adam", precision, "ddp")
    shard = -(-n // recipe.dp)
    value = 4 if precision == "fp32" else 2
    one_layer = shape.seq_len * micro_batch * h * (10 + 24 / recipe.tp) * value // 2
    held = min(recipe.pp, microbatches) * shape.layers // recipe.pp
    activations = (held * shape.seq_len * micro_batch * h * value + one_layer if recipe.checkpointing
                   else held * one_layer)
    return {"parameters": per["parameters"] * (shard if recipe.zero == 3 else n),
            "gradients": per["gradients"] * (shard if recipe.zero >= 2 else n),
            "optimizer_state": 0 if recipe.offload else per["optimizer_state"] * (shard if recipe.zero else n),
            "activations": activations}


def fitting_plans_for_the_lessons_model_only(shape, cluster, global_batch):
    """Plans looked up for the 8.36 B model alone: a KeyError on any other (a verdict, not grader frames)."""
    return {lesson21.BIG: {}}[shape]


def bytes_per_gpu_course(shape, recipe, micro_batch, microbatches, precision="bf16-mixed"):
    return plan_memory(shape, recipe, micro_batch, microbatches, precision).parts()


def bytes_per_gpu_from_the_courses_pieces(shape, recipe, micro_batch, microbatches, precision="bf16-mixed"):
    """Right numbers, with the two counts the exercise is about taken from the course's planner."""
    n = parameters_per_gpu(shape, recipe)
    weight, state = (4, 8) if precision == "fp32" else (2, 12)
    shard = math.ceil(n / recipe.dp)
    return {"parameters": weight * (shard if recipe.zero >= 3 else n),
            "gradients": weight * (shard if recipe.zero >= 2 else n),
            "optimizer_state": 0 if recipe.offload else state * (shard if recipe.zero >= 1 else n),
            "activations": activation_bytes_per_gpu(shape, recipe, micro_batch, microbatches,
                                                    4 if precision == "fp32" else 2)}


# -- fitting plans: the solution's search and step time, each mistake a switch ----------------------
def fitting_plans_with(no_bubble=False, tp_on_node_links=False, any_product=False, no_memory_check=False,
                       zero_without_dp=False, one_forward_with_checkpointing=False):
    def seconds(shape, recipe, cluster, global_batch):
        m = global_batch // recipe.dp
        flops = (6 if one_forward_with_checkpointing or not recipe.checkpointing else 8)
        compute = flops * shape.parameters * global_batch * shape.seq_len / cluster.world_size
        compute /= cluster.peak_flops * cluster.mfu
        bubble = 0 if no_bubble else compute * (recipe.pp - 1) / m

        def all_reduce(nbytes, ranks, consecutive):
            inside = consecutive <= cluster.gpus_per_node or (tp_on_node_links and ranks == recipe.tp)
            busbw = cluster.intra_node_busbw if inside else cluster.inter_node_busbw
            return ring_all_reduce_time(nbytes, ranks, cluster.latency, 1 / busbw) if ranks > 1 else 0.0

        per_layer = 6 if recipe.checkpointing else 4
        tp = per_layer * shape.layers // recipe.pp * m * all_reduce(
            shape.seq_len * shape.hidden * 2, recipe.tp, recipe.tp)
        h = shape.hidden
        n = (shape.layers // recipe.pp * ((12 * h * h + 7 * h) // recipe.tp + 6 * h)
             + shape.vocab * h // recipe.tp + shape.positions * h + (2 * h if recipe.pp == 1 else 0))
        dp = (1.5 if recipe.zero == 3 else 1.0) * all_reduce(2 * n, recipe.dp, recipe.tp * recipe.dp)
        offload = 2 * 2 * n / (recipe.dp if recipe.zero else 1) / cluster.host_bandwidth if recipe.offload else 0
        return compute + bubble + tp + dp + offload

    def fitting_plans(shape, cluster, global_batch):
        n, plans = cluster.world_size, {}
        for dp, tp, pp in itertools.product(range(1, n + 1), repeat=3):
            if (dp * tp * pp != n and not any_product) or shape.heads % tp or shape.layers % pp:
                continue
            if dp * tp * pp > n or global_batch % dp:
                continue
            for zero, checkpointing, offload in itertools.product(range(4), (False, True), (False, True)):
                if zero and dp == 1 and not zero_without_dp:
                    continue
                recipe = ParallelRecipe(dp, tp, pp, zero, checkpointing, offload)
                held = plan_memory(shape, recipe, 1, global_batch // dp)
                if no_memory_check or held.fits(cluster.gpu_memory_bytes):
                    plans[recipe] = seconds(shape, recipe, cluster, global_batch)
        return plans
    return fitting_plans


def fitting_plans_as_tuples(shape, cluster, global_batch):
    """Keys as plain tuples, the times from the same model, built in another order."""
    plans = fitting_plans_with()(shape, cluster, global_batch)
    return {(r.dp, r.tp, r.pp, r.zero, r.checkpointing, r.offload): s for r, s in reversed(plans.items())}


def fitting_plans_course(shape, cluster, global_batch):
    return search(shape, cluster, global_batch)


ALTERNATIVES = {
    lesson21.check_bytes_per_gpu: [
        answer("floats throughout, mistakes switched off", bytes_per_gpu_with()),
        answer("by kind of tensor, through bytes_per_parameter", bytes_per_gpu_by_parts),
    ],
    lesson21.check_fitting_plans: [
        answer("itertools over dp, tp and pp", fitting_plans_with()),
        answer("tuples as keys, in another order", fitting_plans_as_tuples),
    ],
}

WRONG_ANSWERS = {
    lesson21.check_bytes_per_gpu: [
        wrong_answer("TP divides the replicated LayerNorms and biases too", bytes_per_gpu_with(layer_norms_split=True)),
        wrong_answer("PP forgets the micro-batches in flight", bytes_per_gpu_with(one_in_flight=True)),
        wrong_answer("every stage holds every layer", bytes_per_gpu_with(all_layers_on_each_stage=True)),
        wrong_answer("checkpointing keeps all activations", bytes_per_gpu_with(checkpointing_ignored=True)),
        wrong_answer("the optimizer state counted in bf16", bytes_per_gpu_with(bf16_optimizer=True)),
        wrong_answer("offload still counts the state on the GPU", bytes_per_gpu_with(offload_ignored=True)),
        wrong_answer("ZeRO-1 shards the parameters too", bytes_per_gpu_with(zero1_shards_parameters=True)),
        wrong_answer("the course's plan_memory", bytes_per_gpu_course),
        wrong_answer("the course's parameters_per_gpu and activation_bytes_per_gpu", bytes_per_gpu_from_the_courses_pieces),
    ],
    lesson21.check_fitting_plans: [
        wrong_answer("the pipeline bubble ignored", fitting_plans_with(no_bubble=True)),
        wrong_answer("TP across nodes priced as the node's links", fitting_plans_with(tp_on_node_links=True)),
        wrong_answer("recipes whose dp * tp * pp is not the world size", fitting_plans_with(any_product=True)),
        wrong_answer("every recipe, fitting or not", fitting_plans_with(no_memory_check=True)),
        wrong_answer("ZeRO stages with one dp rank", fitting_plans_with(zero_without_dp=True)),
        wrong_answer("checkpointing's recompute left out of the FLOPs",
                     fitting_plans_with(one_forward_with_checkpointing=True)),
        wrong_answer("the course's search", fitting_plans_course),
        wrong_answer("crashes on a model other than the lesson's", fitting_plans_for_the_lessons_model_only),
    ],
}
