"""Lesson 09's graders draw cases from the grading seed (engine/boundary.grading_seed): their
expected answers are worked out by the grader, so they must be the right ones for every seed, and
the diagnosis cases must keep the traps they were built for."""
import numpy as np
import pytest

from course_lib.checks import lesson09
from course_lib.topics.scaling import communication_share


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


@pytest.mark.parametrize("seed", range(0, 4000, 97))
def test_each_drawn_diagnosis_is_the_one_its_case_was_built_for(seed):
    verdicts = [communication_share(with_sync, without_sync)[2]
                for _, with_sync, without_sync in lesson09.share_cases(seed)]
    assert verdicts == ["communication-bound", "compute-bound", "undecided", "compute-bound"]


def test_the_drawn_diagnosis_cases_set_their_traps_for_every_seed():
    for seed in range(0, 4000, 97):
        (_, with_a, without_a), *_, (_, with_d, without_d) = lesson09.share_cases(seed)
        shares = [(synced - alone) / synced for synced, alone in zip(with_a, without_a)]
        assert min(shares) < 0.5  # the odd pair: a minimum-maximum interval says undecided
        middle = [(synced - alone) / synced for synced, alone in zip(*lesson09.share_cases(seed)[2][1:])]
        assert np.percentile(middle, 10) < 0.5 < np.percentile(middle, 90)
        of_compute = [(synced - alone) / alone for synced, alone in zip(with_d, without_d)]
        assert min(of_compute) > 0.5  # a share of the compute says communication-bound
    assert lesson09.share_cases(1) != lesson09.share_cases(2)
