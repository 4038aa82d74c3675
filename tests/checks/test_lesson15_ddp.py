"""Lesson 15's DDP graders: correct answers written differently from the solution pass, and the
machinery the graders stand on (the all-reduce watch, the delayed rank) sees what it claims to.

LESSON15_ALTERNATIVES are listed for every grader in tests/checks/test_checks_alternatives.py;
the wrong answers are lesson15.WRONG_ANSWERS (tests/checks/test_checks.py).
"""
import itertools

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from course_lib import launch
from course_lib.checks import lesson15
from course_lib.checks.engine import GradingError
from course_lib.checks.engine.gradient_sync import TiedNet, WatchAllReduces

pytestmark = pytest.mark.timeout(300)


# -- DDP with overlap, two other ways ----------------------------------------------------------
class OverlapWithAHandlePerParameter(nn.Module):
    """One flat broadcast of the parameters; a dict of handles; the mean taken after the wait."""

    def __init__(self, module):
        super().__init__()
        self.module, self.pending = module, {}
        with torch.no_grad():
            flat = parameters_to_vector(module.parameters())
            dist.broadcast(flat, 0)
            vector_to_parameters(flat, module.parameters())
            for buffer in module.buffers():
                dist.broadcast(buffer, 0)
        for name, param in module.named_parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(
                    lambda p, name=name: self.pending.__setitem__(name, (p, dist.all_reduce(p.grad, async_op=True))))

    def forward(self, tokens):
        return self.module(tokens)

    def finish_gradient_sync(self):
        grads = []
        for param, work in self.pending.values():
            work.wait()
            grads.append(param.grad)
        torch._foreach_div_(grads, dist.get_world_size())
        self.pending = {}


def course_ddp_per_parameter(module):
    from course_lib.topics.from_scratch import DDPFromScratch
    return DDPFromScratch(module, bucket_cap_mb=None)


# -- the bucket plan, two other ways -----------------------------------------------------------
def plan_with_running_totals(parameters, bucket_cap_mb):
    trainable = [p for p in parameters if p.requires_grad][::-1]
    cap, plan, total = int(bucket_cap_mb * 1024 * 1024), [], None
    for param in trainable:
        size = param.nelement() * param.element_size()
        if total is None or total + size > cap:
            plan.append([param])
            total = size
        else:
            plan[-1].append(param)
            total += size
    return plan


def plan_as_tuples(parameters, bucket_cap_mb):
    from course_lib.topics.from_scratch.buckets import assign_buckets
    return tuple(tuple(bucket) for bucket in
                 assign_buckets([p for p in parameters if p.requires_grad], bucket_cap_mb))


# -- DDP with buckets, two other ways -------------------------------------------------------------
class BucketsWithViews(nn.Module):
    """A flat buffer per bucket, allocated once; gradients copied in as they come, views copied out."""

    def __init__(self, module, bucket_cap_mb=25):
        super().__init__()
        self.module = module
        for tensor in itertools.chain(module.parameters(), module.buffers()):
            dist.broadcast(tensor.data, src=0)
        self.plan = plan_with_running_totals(module.parameters(), bucket_cap_mb)
        self.buffers_ = [torch.zeros(sum(p.numel() for p in b)) for b in self.plan]
        self.where, self.left, self.works = {}, {}, []
        for b, bucket in enumerate(self.plan):
            offsets = itertools.accumulate([0] + [p.numel() for p in bucket])
            for param, offset in zip(bucket, offsets):
                self.where[param] = (b, offset)
                param.register_post_accumulate_grad_hook(self._ready)
        self.left = {b: len(bucket) for b, bucket in enumerate(self.plan)}

    def _ready(self, param):
        b, offset = self.where[param]
        self.buffers_[b][offset:offset + param.numel()].copy_(param.grad.flatten())
        self.left[b] -= 1
        if self.left[b] == 0:
            self.works.append((b, dist.all_reduce(self.buffers_[b], async_op=True)))

    def forward(self, tokens):
        return self.module(tokens)

    def finish_gradient_sync(self):
        for b, work in self.works:
            work.wait()
            self.buffers_[b] /= dist.get_world_size()
            for param in self.plan[b]:
                offset = self.where[param][1]
                param.grad.copy_(self.buffers_[b][offset:offset + param.numel()].view_as(param.grad))
        self.works = []
        self.left = {b: len(bucket) for b, bucket in enumerate(self.plan)}


def course_ddp_with_buckets(module, bucket_cap_mb):
    from course_lib.topics.from_scratch import DDPFromScratch
    return DDPFromScratch(module, bucket_cap_mb=bucket_cap_mb)


def _answer(description, *args):
    return pytest.param(args, {}, id=description)


LESSON15_ALTERNATIVES = {
    lesson15.check_overlapping_ddp: [
        _answer("flat broadcast, a handle per name, foreach mean after the wait",
                OverlapWithAHandlePerParameter),
        _answer("the course's DDPFromScratch (buffers broadcast every forward)", course_ddp_per_parameter),
    ],
    lesson15.check_plan_buckets: [
        _answer("running totals, nelement", plan_with_running_totals),
        _answer("tuples, from the course's assign_buckets", plan_as_tuples),
    ],
    lesson15.check_bucketed_ddp: [
        _answer("preallocated buffers, gradients copied in as they come", BucketsWithViews),
        _answer("the course's DDPFromScratch with buckets", course_ddp_with_buckets),
    ],
}


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
