"""The planner (topics/planning.py, step_time.py): its counts against real modules on gloo ranks, lesson
11's estimator and lesson 18's bubble; the search's rules."""
import dataclasses

import pytest

from course_lib import launch
from course_lib.topics.cost_model import ring_all_reduce_time
from course_lib.topics.from_scratch.pipeline_schedules import bubble_fraction
from course_lib.topics.memory import estimate_memory, transformer_activation_bytes
from course_lib.topics.plan_measured import Stack, measure_on_rank, small_shape
from course_lib.topics.planning import ParallelRecipe, TransformerShape, plan_memory
from course_lib.topics.step_time import STATED_CLUSTER, candidate_recipes, search, step_seconds

BIG = TransformerShape(layers=40, hidden=4096, heads=32, vocab=65536, positions=8192, seq_len=8192)


def test_the_lessons_model_has_8_36_billion_parameters_and_a_real_stack_has_its_count():
    assert BIG.parameters == 8_357_191_680
    small = small_shape(layers=3, hidden=32, heads=4)
    assert sum(p.numel() for p in Stack(small).parameters()) == small.parameters


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_data_parallel_alone_is_lesson_11s_estimate(zero):
    recipe = ParallelRecipe(4, 1, 1, zero=zero, checkpointing=bool(zero % 2))
    planned = plan_memory(BIG, recipe, micro_batch=2)
    strategy = "ddp" if zero == 0 else f"zero{zero}"
    activations = transformer_activation_bytes(2, BIG.seq_len, BIG.hidden, BIG.layers, BIG.heads,
                                               checkpointing=recipe.checkpointing)
    assert planned == estimate_memory(BIG.parameters, "adam", "bf16-mixed", strategy, 4, activations)


def _both_runs(shape):
    return [measure_on_rank(shape, 4, checkpointing) for checkpointing in (False, True)]


def test_the_estimate_meets_a_tensor_parallel_run_on_two_ranks():
    shape = small_shape(layers=2, hidden=48, heads=4, seq_len=16)
    runs = launch(_both_runs, shape, nprocs=2, timeout=120, output="none")
    for measured in runs:
        for checkpointing, held in zip((False, True), measured):
            estimate = plan_memory(shape, ParallelRecipe(1, 2, 1, checkpointing=checkpointing), 4, 1, "fp32")
            assert (held["parameters"], held["gradients"]) == (estimate.parameters, estimate.gradients)
            assert held["optimizer_state"] - estimate.optimizer_state == 4 * (12 * shape.layers + 2)  # steps
            if not checkpointing:
                assert abs(estimate.activations / held["activations"] - 1) < 0.05
            else:  # the meter sees each layer's input, not the one layer the backward recomputes
                assert held["activations"] < estimate.activations


def test_pipeline_stage_0_holds_min_p_m_micro_batches_and_the_bubble_is_lesson_18s():
    one, four = (plan_memory(BIG, ParallelRecipe(1, 1, 4), 1, m).activations for m in (1, 16))
    assert four == 4 * one
    assert plan_memory(BIG, ParallelRecipe(1, 1, 4), 1, 2).activations == 2 * one
    parts = step_seconds(BIG, ParallelRecipe(2, 1, 4), STATED_CLUSTER, global_batch=16)
    idle = parts["pipeline bubble"] / (parts["compute"] + parts["pipeline bubble"])
    assert idle == pytest.approx(bubble_fraction(4, 8))


def test_tensor_parallel_across_nodes_is_priced_at_the_network():
    recipe = ParallelRecipe(1, 8, 1)
    one_node = dataclasses.replace(STATED_CLUSTER, nodes=1, gpus_per_node=8)
    across = step_seconds(BIG, recipe, STATED_CLUSTER, 16)["tensor parallel"]
    inside = step_seconds(BIG, recipe, one_node, 16)["tensor parallel"]
    message, all_reduces = BIG.seq_len * BIG.hidden * 2, 4 * BIG.layers * 16  # bf16, a layer and micro-batch
    for seconds, busbw in ((across, STATED_CLUSTER.inter_node_busbw), (inside, STATED_CLUSTER.intra_node_busbw)):
        assert seconds == pytest.approx(all_reduces * ring_all_reduce_time(message, 8, STATED_CLUSTER.latency, 1 / busbw))


def test_the_search_keeps_whole_recipes_that_fit_fastest_first():
    recipes = candidate_recipes(BIG, 8)
    assert all(r.world_size == 8 and BIG.heads % r.tp == 0 and (r.dp > 1 or r.zero == 0) for r in recipes)
    assert len(recipes) == len(set(recipes)) == 112
    plans = search(BIG, STATED_CLUSTER, 16)
    assert list(plans.values()) == sorted(plans.values())
    for recipe in recipes:
        fits = plan_memory(BIG, recipe, 1, 16 // recipe.dp).fits(STATED_CLUSTER.gpu_memory_bytes)
        assert (recipe in plans) == fits
    assert ParallelRecipe(8, 1, 1) not in plans  # DDP: 134 GB of model state
