"""Lesson 09's graders draw one more case from the grading seed (engine/boundary.grading_seed):
its expected answer is worked out by the grader, so it must be the right one for every seed."""
import pytest

from course_lib.checks import lesson09
from course_lib.topics.cost_model import ring_all_reduce_time


def fewest_micro_batches(global_batch_size, max_batch_size, world_size):
    """The plan by brute force: every (batch_size, steps) that gives the global batch and fits."""
    plans = [(batch_size, steps) for steps in range(1, global_batch_size + 1)
             for batch_size in range(1, max_batch_size + 1)
             if batch_size * steps * world_size == global_batch_size]
    return min(plans, key=lambda plan: plan[1])


@pytest.mark.parametrize("seed", [0, 1, 7919, 123456])
def test_the_drawn_plan_is_the_fewest_micro_batches_that_fit(seed):
    cases = lesson09.plan_cases(seed)
    assert cases[:-1] == lesson09.PLAN_CASES
    *case, expected = cases[-1]
    assert expected == fewest_micro_batches(*case)


def test_the_drawn_cases_change_with_the_seed():
    assert lesson09.plan_cases(1)[-1] != lesson09.plan_cases(2)[-1]
    drawn = [lesson09.all_reduce_cases(seed)[-1] for seed in (1, 2)]
    assert drawn[0] != drawn[1]
    for n_parameters, world_size, alpha, beta, bytes_per_parameter in drawn:  # a ring with work
        assert world_size >= 2 and ring_all_reduce_time(n_parameters * bytes_per_parameter,
                                                        world_size, alpha, beta) > 0
