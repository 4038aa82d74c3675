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
from course_lib.checks.engine import GradingError
from course_lib.checks.engine.gradient_sync import TiedNet, WatchAllReduces

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
        in_flight_after_backward = [not work.is_completed() for work in works]
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
