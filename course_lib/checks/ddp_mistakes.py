"""Plausible wrong answers to lesson 15's DDP exercises, each one mistake away from right.

The graders must reject every one (tests/checks/test_checks.py runs them from WRONG_ANSWERS).
"""
import torch
import torch.distributed as dist
from torch import nn


# -- the bucket plan ---------------------------------------------------------------------------
def _plan(parameters, bucket_cap_mb, order=reversed, cap_bytes=2**20, close_after=False):
    cap, buckets, size = bucket_cap_mb * cap_bytes, [], 0
    for param in order([p for p in parameters if p.requires_grad]):
        nbytes = param.numel() * param.element_size()
        if not buckets or (not close_after and size + nbytes > cap) or (close_after and size >= cap):
            buckets.append([])
            size = 0
        buckets[-1].append(param)
        size += nbytes
    return buckets


def plan_forward_order(parameters, bucket_cap_mb):
    return _plan(parameters, bucket_cap_mb, order=list)


def plan_past_the_cap(parameters, bucket_cap_mb):  # torch's Reducer closes a bucket this way
    return _plan(parameters, bucket_cap_mb, close_after=True)


def plan_with_frozen(parameters, bucket_cap_mb):
    cap, buckets, size = bucket_cap_mb * 2**20, [], 0
    for param in reversed(list(parameters)):
        nbytes = param.numel() * param.element_size()
        if not buckets or size + nbytes > cap:
            buckets.append([])
            size = 0
        buckets[-1].append(param)
        size += nbytes
    return buckets


def plan_in_megabytes(parameters, bucket_cap_mb):
    return _plan(parameters, bucket_cap_mb, cap_bytes=10**6)


# -- one all-reduce per gradient -----------------------------------------------------------------
class _Overlapping(nn.Module):
    """Right, but for what a subclass changes."""

    def __init__(self, module, **_):
        super().__init__()
        self.module, self.handles = module, []
        with torch.no_grad():
            for tensor in self._to_broadcast():
                dist.broadcast(tensor, src=0)
        for param in self._to_hook():
            param.register_post_accumulate_grad_hook(self._ready)

    def _to_broadcast(self):
        return [*self.module.parameters(), *self.module.buffers()]

    def _to_hook(self):
        return [p for p in self.module.parameters() if p.requires_grad]

    def _ready(self, param):
        param.grad.div_(dist.get_world_size())
        self.handles.append(dist.all_reduce(param.grad, async_op=True))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_sync(self):
        for handle in self.handles:
            handle.wait()
        self.handles.clear()


class AllReduceAfterBackward(_Overlapping):
    def _ready(self, param):
        pass

    def finish_gradient_sync(self):
        for param in self._to_hook():
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()


class NeverWaits(_Overlapping):
    def finish_gradient_sync(self):
        self.handles.clear()


class HooksPerModule(_Overlapping):
    def _to_hook(self):
        return [p for m in self.module.modules() for p in m.parameters(recurse=False) if p.requires_grad]


class WaitsInTheHook(_Overlapping):
    def _ready(self, param):
        param.grad.div_(dist.get_world_size())
        dist.all_reduce(param.grad)


class ForgetsBuffers(_Overlapping):
    def _to_broadcast(self):
        return list(self.module.parameters())


class SumsGradients(_Overlapping):
    def _ready(self, param):
        self.handles.append(dist.all_reduce(param.grad, async_op=True))


# -- buckets -------------------------------------------------------------------------------------
class _Bucketed(_Overlapping):
    plan = staticmethod(_plan)

    def __init__(self, module, bucket_cap_mb=25):
        self.buckets = self.plan(module.parameters(), bucket_cap_mb)
        self.bucket_of = {param: b for b, bucket in enumerate(self.buckets) for param in bucket}
        self.waiting = [len(bucket) for bucket in self.buckets]
        super().__init__(module)

    def _ready(self, param):
        b = self.bucket_of[param]
        self.waiting[b] -= 1
        if self.waiting[b] == 0:
            self._launch(b)

    def _launch(self, b):
        flat = torch.cat([p.grad.flatten() for p in self.buckets[b]]).div_(dist.get_world_size())
        self.handles.append((b, flat, dist.all_reduce(flat, async_op=True)))

    def finish_gradient_sync(self):
        for b, flat, handle in self.handles:
            handle.wait()
            self._copy_back(b, flat)
        self.handles.clear()
        self.waiting = [len(bucket) for bucket in self.buckets]

    def _copy_back(self, b, flat):
        offset = 0
        for param in self.buckets[b]:
            param.grad.copy_(flat[offset:offset + param.numel()].view_as(param))
            offset += param.numel()


class BucketsAfterBackward(_Bucketed):
    def _ready(self, param):
        pass

    def finish_gradient_sync(self):
        for b in range(len(self.buckets)):
            self._launch(b)
        super().finish_gradient_sync()


class ForwardOrderBuckets(_Bucketed):
    plan = staticmethod(plan_forward_order)


class NeverCopiesBack(_Bucketed):
    def _copy_back(self, b, flat):
        pass


class OnePerGradient(_Overlapping):
    def __init__(self, module, bucket_cap_mb=25):
        super().__init__(module)
