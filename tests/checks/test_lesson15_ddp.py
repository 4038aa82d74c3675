"""Lesson 15's DDP graders: the machinery they stand on (the all-reduce watch, the delayed rank)
sees what it claims to, and a stub gets the usual advice.

Correct answers written differently from the solution, and wrong ones, are in
tests/checks/answers/lesson15.py (run by test_checks_alternatives.py and test_checks.py).
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_lib import launch
from course_lib.checks import lesson15
from course_lib.checks.engine import GradingError, boundary
from course_lib.checks.engine.gradient_sync import TiedNet, WatchAllReduces, batches, in_flight

pytestmark = pytest.mark.timeout(300)


# -- the machinery -------------------------------------------------------------------------------
def test_tied_net_has_each_trap():
    model = TiedNet()
    assert model.head.weight is model.embed.weight
    assert not any(p.requires_grad for p in model.frozen.parameters())
    assert [name for name, _ in model.named_buffers()] == ["scale"]


def _watch_one_backward(delay):
    events, works = [], []
    param = nn.Parameter(torch.ones(5))
    handles = []
    param.register_post_accumulate_grad_hook(
        lambda p: handles.append(dist.all_reduce(p.grad, async_op=True)))
    with WatchAllReduces(events, works) as watch:
        if dist.get_rank() == 1:
            watch.delay_next = delay
        (param * 3).sum().backward()
        in_flight_after_backward = [in_flight([work]) == 1 for work in works]
    for handle in handles:
        handle.wait()
    return [e[:2] for e in events], in_flight_after_backward, param.grad.tolist()


def test_the_watch_sees_an_all_reduce_started_in_backward_and_the_delay_holds_the_others():
    results = launch(_watch_one_backward, 0.5, nprocs=2, timeout=60, output="none")
    for events, _, grad in results:
        assert events == [("allreduce", 5)]
        assert grad == [6.0] * 5
    assert results[0][1] == [True]  # rank 0's all-reduce waits for the delayed rank 1


def test_a_stub_gets_the_usual_advice(capsys):
    class Stub(nn.Module):
        def __init__(self, module, **_):
            raise NotImplementedError("replace this line")

    with pytest.raises(GradingError, match="NotImplementedError"):
        lesson15.check_overlapping_ddp(Stub)
    assert capsys.readouterr().out == ""


def _waited_through_futures(count):
    """`count` all-reduces, each waited for through its Future: how many the grader saw running."""
    seen_running = 0
    for _ in range(count):
        with WatchAllReduces([], works := []):
            future = dist.all_reduce(torch.ones(4), async_op=True).get_future()
        future.wait()
        seen_running += in_flight(works)
    return seen_running


def test_an_all_reduce_waited_for_through_its_future_is_done():
    # gloo completes the Future first and marks the Work completed after (finishWorkGloo), so
    # work.is_completed() is still False after fut.wait() now and then; a learner's wait on the
    # Future is a wait all the same
    assert launch(_waited_through_futures, 300, nprocs=2, timeout=120, output="none") == [0, 0]


def test_a_crash_in_plan_buckets_is_a_verdict_with_the_learners_frames_only():
    def plan_buckets(parameters, bucket_cap_mb):
        return [[p] for p in parameters if p.nbytes() > 0]  # nbytes is not a method: TypeError

    with pytest.raises(GradingError) as caught:
        lesson15.check_plan_buckets(plan_buckets)
    rendered = "\n".join(caught.value._render_traceback_())
    assert "TypeError: 'int' object is not callable" in rendered
    assert "in plan_buckets" in rendered and "p.nbytes()" in rendered  # the learner's own line
    assert "course_lib/checks" not in rendered  # none of the grader's frames


def test_counts_never_reset_are_named_not_the_order():
    from answers.lesson15 import NeverResetsTheCounts

    with pytest.raises(GradingError) as caught:
        lesson15.check_bucketed_ddp(NeverResetsTheCounts)
    assert "at step 1" in caught.value.what  # step 0 was right
    assert "not reset" in caught.value.hint and "order" not in caught.value.hint


def test_a_finish_never_queued_is_judged_when_backward_returns():
    # the grader calls nothing after backward(): a right wait that autograd never runs is no wait
    from answers.lesson15 import NeverQueuesItsFinish

    with pytest.raises(GradingError) as caught:
        lesson15.check_overlapping_ddp(NeverQueuesItsFinish)
    assert "when backward() returns" in caught.value.expected
    assert "self.queue_finish()" in caught.value.hint


# -- inputs drawn at grading time ------------------------------------------------------------------
def _at_offset(offset, function):
    token = boundary._seed_offset.set(offset)
    try:
        return function()
    finally:
        boundary._seed_offset.reset(token)


def test_the_plan_grader_adds_a_case_drawn_at_grading_time():
    cases = [_at_offset(offset, lesson15.plan_cases) for offset in range(12)]
    assert all(drawn[:-1] == lesson15.PLAN_CASES for drawn in cases)
    extra = {drawn[-1] for drawn in cases}
    assert len(extra) > 6  # another model and cap at another offset
    for hidden_layers, cap, dtype in extra:
        assert 2 <= hidden_layers <= 5 and 1024 <= cap * 2**20 < 7 * 1024 and dtype == torch.float32
        assert cap * 2**20 % 4 == 0  # whole float32 elements


def test_the_ddp_graders_batches_come_from_the_grading_seed():
    seeds = [_at_offset(offset, lambda: boundary.grading_seed(15)) for offset in (0, 7919)]
    assert seeds == [15, 15 + 7919]
    first, other = (batches(seed=seed)[0][0] for seed in seeds)
    assert torch.equal(batches()[0][0], first) and not torch.equal(first, other)
