"""Lesson 16's graders (ZeRO-1, gather, an FSDP unit): the watch the FSDP unit's grader stands on
sees what it claims to.

Correct answers written differently from the solution, and wrong ones, are in
tests/checks/answers/lesson16.py (run by test_checks_alternatives.py and test_checks.py).
"""
import pytest
import torch

from answers.lesson16 import GATHER
from course_lib import launch
from course_lib.checks.lesson16.unit import WatchUnits

pytestmark = pytest.mark.timeout(300)


def _gather_then(how):
    """Two all-gathers (of a 6- and an 8-element tensor); what the watch sees in memory after."""
    watch = WatchUnits([6, 8])
    with watch:
        first, second = torch.empty(6), torch.empty(8)
        GATHER(first, torch.ones(3))
        GATHER(second, torch.ones(4))
        saved = first[2:]  # a view, as autograd saves one for backward
        if how == "resize":
            first.untyped_storage().resize_(0)
        del first
        if how != "keep a view":
            del saved
        watch.memory("end")
    return watch.events[-1][3]


def test_the_watch_sees_what_holds_memory():
    def run():
        return [_gather_then(how) for how in ("keep a view", "drop", "resize")]

    kept_by_a_view, dropped, resized = launch(run, nprocs=2, timeout=60, output="none")[0]
    assert kept_by_a_view == {0: 24, 1: 32}  # dropping `first` frees nothing while a view holds it
    assert dropped == {1: 32}
    assert resized == {1: 32}


# -- the course's unit, which the lesson runs while yours is unfinished ------------------------------
def _course_unit_on_rank():
    from course_lib.checks.lesson16.unit import _train_units
    from course_lib.topics.from_scratch.fsdp_unit import FSDPUnit

    return _train_units(FSDPUnit, 0, 16, 2)


def test_the_course_unit_trains_like_one_process_and_frees_what_it_gathered():
    from course_lib.checks.lesson16.judge_unit import judge_shard_sizes, judge_unit_events
    from course_lib.checks.lesson16.unit import one_process_units

    results = launch(_course_unit_on_rank, nprocs=2, timeout=60, output="none")
    judge_shard_sizes(results, 2, "the course's FSDPUnit")
    for result in results:
        for events in result["events"]:
            judge_unit_events(events, 2, "the course's FSDPUnit")
    losses, oracle = one_process_units(0, 16, 2)
    for step, expected in enumerate(oracle):
        assert abs(sum(r["losses"][step] for r in results) / 2 - losses[step]) < 1e-5
        for unit, flat in enumerate(expected):
            full = torch.cat([r["shards"][step][unit] for r in results])[:flat.numel()]
            torch.testing.assert_close(full, flat, rtol=1e-4, atol=1e-6)
