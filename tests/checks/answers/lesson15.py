"""Lesson 15's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones, each one mistake away from right
(WRONG_ANSWERS, each must be rejected).
"""
import itertools

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from course_lib.checks import lesson15

from . import answer, wrong_answer


class _QueuesItsFinish(nn.Module):
    """The lesson's given scaffold (solutions/15_from_scratch.ipynb, OverlappingDDP): a hook calls
    queue_finish(), and autograd runs finish_gradient_sync() once at the end of that backward."""

    finish_queued = False

    def queue_finish(self):
        """Once per backward: autograd calls finish_gradient_sync() when this backward ends."""
        if not self.finish_queued:
            self.finish_queued = True
            Variable._execution_engine.queue_callback(self._end_of_backward)

    def _end_of_backward(self):
        self.finish_queued = False
        self.finish_gradient_sync()


# -- DDP with overlap, two other ways ----------------------------------------------------------
class OverlapWithAHandlePerParameter(_QueuesItsFinish):
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
                param.register_post_accumulate_grad_hook(lambda p, name=name: self._ready(name, p))

    def _ready(self, name, param):
        self.queue_finish()
        self.pending[name] = (param, dist.all_reduce(param.grad, async_op=True))

    def forward(self, tokens):
        return self.module(tokens)

    def finish_gradient_sync(self):
        grads = []
        for param, work in self.pending.values():
            work.wait()
            grads.append(param.grad)
        torch._foreach_div_(grads, dist.get_world_size())
        self.pending = {}


class OverlapWaitingOnFutures(_QueuesItsFinish):
    """Keeps each all-reduce's Future, not its Work, and waits on them all with wait_all."""

    def __init__(self, module):
        super().__init__()
        self.module, self.futures = module, []
        with torch.no_grad():
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                dist.broadcast(tensor, src=0)
        for param in module.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, param):
        self.queue_finish()
        param.grad.div_(dist.get_world_size())
        self.futures.append(dist.all_reduce(param.grad, async_op=True).get_future())

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_sync(self):
        torch.futures.wait_all(self.futures)
        self.futures = []




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


def plan_in_mib_as_tuples(parameters, bucket_cap_mb):
    """Sizes summed in MiB (exact: every size is a multiple of 2**-20 MiB), tuples out."""
    plan, current, mib = [], (), 0.0
    for param in reversed(list(parameters)):
        if not param.requires_grad:
            continue
        size_mib = param.nbytes / 2**20
        if current and mib + size_mib > bucket_cap_mb:
            plan.append(current)
            current, mib = (), 0.0
        current, mib = current + (param,), mib + size_mib
    return tuple(plan + [current])


# -- DDP with buckets, two other ways -------------------------------------------------------------
class BucketsWithViews(_QueuesItsFinish):
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
        self.queue_finish()
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


class BucketsWaitingOnFutures(_QueuesItsFinish):
    """Each bucket's Future kept; fut.wait() gives the reduced flat tensor, copied back with split."""

    def __init__(self, module, bucket_cap_mb=25):
        super().__init__()
        self.module = module
        with torch.no_grad():
            for tensor in itertools.chain(module.parameters(), module.buffers()):
                dist.broadcast(tensor, src=0)
        self.plan = plan_with_running_totals(module.parameters(), bucket_cap_mb)
        self.index = {param: b for b, bucket in enumerate(self.plan) for param in bucket}
        self.ready, self.futures = [set() for _ in self.plan], []
        for bucket in self.plan:
            for param in bucket:
                param.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, param):
        self.queue_finish()
        b = self.index[param]
        self.ready[b].add(param)
        if len(self.ready[b]) == len(self.plan[b]):
            flat = torch.cat([p.grad.reshape(-1) for p in self.plan[b]]) / dist.get_world_size()
            self.futures.append((b, dist.all_reduce(flat, async_op=True).get_future()))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_sync(self):
        for b, future in self.futures:
            flat = future.wait()[0]
            for param, piece in zip(self.plan[b], flat.split([p.numel() for p in self.plan[b]])):
                param.grad.copy_(piece.view_as(param.grad))
            self.ready[b].clear()
        self.futures = []




ALTERNATIVES = {
    lesson15.check_overlapping_ddp: [
        answer("flat broadcast, a handle per name, foreach mean after the wait",
               OverlapWithAHandlePerParameter),
        answer("Futures kept, torch.futures.wait_all", OverlapWaitingOnFutures),
    ],
    lesson15.check_plan_buckets: [
        answer("running totals, nelement", plan_with_running_totals),
        answer("sizes in MiB, tuples", plan_in_mib_as_tuples),
    ],
    lesson15.check_bucketed_ddp: [
        answer("preallocated buffers, gradients copied in as they come", BucketsWithViews),
        answer("Futures kept, fut.wait() per bucket", BucketsWaitingOnFutures),
    ],
}


# Wrong answers, each one mistake away from right

# -- the bucket plan ---------------------------------------------------------------------------
def _plan(parameters, bucket_cap_mb, order=reversed, cap_bytes=2**20, close_after=False,
          cut_at_the_cap=False, element_bytes=None):
    cap, buckets, size = bucket_cap_mb * cap_bytes, [], 0
    for param in order([p for p in parameters if p.requires_grad]):
        nbytes = param.numel() * (element_bytes or param.element_size())
        past = size + nbytes >= cap if cut_at_the_cap else size + nbytes > cap
        if not buckets or (not close_after and past) or (close_after and size >= cap):
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


def plan_cut_at_the_cap(parameters, bucket_cap_mb):
    """A new bucket when the next gradient would fill the current one exactly: `>=`, not `>`."""
    return _plan(parameters, bucket_cap_mb, cut_at_the_cap=True)


def plan_four_bytes_an_element(parameters, bucket_cap_mb):
    """numel() * 4, as if every gradient were float32 (the notebook's own print does it)."""
    return _plan(parameters, bucket_cap_mb, element_bytes=4)


def plan_cap_in_bytes(parameters, bucket_cap_mb):
    """bucket_cap_mb read as a number of bytes: every gradient a bucket of its own."""
    return _plan(parameters, bucket_cap_mb, cap_bytes=1)


def plan_by_the_course(parameters, bucket_cap_mb):
    from course_lib.topics.from_scratch.buckets import assign_buckets
    return assign_buckets([p for p in parameters if p.requires_grad], bucket_cap_mb)


# -- one all-reduce per gradient -----------------------------------------------------------------
class _Overlapping(_QueuesItsFinish):
    """Right, but for what a subclass changes: gradient_ready queues the finish (as given), then
    hands the gradient to _ready."""

    def __init__(self, module, **_):
        super().__init__()
        self.module, self.handles = module, []
        with torch.no_grad():
            for tensor in self._to_broadcast():
                dist.broadcast(tensor, src=0)
        for param in self._to_hook():
            param.register_post_accumulate_grad_hook(self.gradient_ready)

    def gradient_ready(self, param):
        self.queue_finish()
        self._ready(param)

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


class NeverQueuesItsFinish(_Overlapping):
    """Right wait, never queued: finish_gradient_sync() waits only when someone calls it."""

    def gradient_ready(self, param):
        self._ready(param)


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


class KeepsItsHandles(_Overlapping):
    """Waits for every handle, but never forgets one: they pile up, step after step."""

    def finish_gradient_sync(self):
        for handle in self.handles:
            handle.wait()


class KeepsItsFutures(_Overlapping):
    """Waits on the Futures, and keeps every one (each holds the gradient it reduced)."""

    def _ready(self, param):
        param.grad.div_(dist.get_world_size())
        self.handles.append(dist.all_reduce(param.grad, async_op=True).get_future())

    def finish_gradient_sync(self):
        torch.futures.wait_all(self.handles)


class TensorHooksBeforeAccumulation(_Overlapping):
    """Tensor hooks (register_hook) in place of post-accumulate ones: the hook all-reduces the
    gradient on its way into .grad; AccumulateGrad copies a tensor that something else still holds
    (here the Work) rather than taking it (torch/csrc/autograd/functions/accumulate_grad.cpp,
    num_expected_refs), so .grad keeps the values from before the all-reduce."""

    def _to_hook(self):
        for param in super()._to_hook():
            param.register_hook(self._on_its_way)
        return []

    def _on_its_way(self, grad):
        self.queue_finish()
        grad = grad / dist.get_world_size()
        self.handles.append(dist.all_reduce(grad, async_op=True))
        return grad


class BroadcastsTrainableOnly(_Overlapping):
    """The frozen layer left out of the broadcast: "it never changes" (it differs from rank 0's)."""

    def _to_broadcast(self):
        return [p for p in self.module.parameters() if p.requires_grad] + list(self.module.buffers())


def course_ddp_per_parameter(module):
    from course_lib.topics.from_scratch import DDPFromScratch
    return DDPFromScratch(module, bucket_cap_mb=None)


class SubclassesTheCourseDDP:
    """The course's DDPFromScratch under another name."""

    def __new__(cls, module, bucket_cap_mb=None):
        from course_lib.topics.from_scratch.ddp import DDPFromScratch

        class MyDDP(DDPFromScratch):
            pass

        return MyDDP(module, bucket_cap_mb=bucket_cap_mb)


class TorchDDPWithANoOpFinish(nn.parallel.DistributedDataParallel):
    """torch's own DDP, its wait already inside backward()."""

    def __init__(self, module, bucket_cap_mb=25):
        super().__init__(module, bucket_cap_mb=bucket_cap_mb)

    def finish_gradient_sync(self):
        pass


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


class NeverResetsTheCounts(_Bucketed):
    """Step 0 right; then every bucket's count is past zero, and no bucket is ever launched again."""

    def finish_gradient_sync(self):
        for b, flat, handle in self.handles:
            handle.wait()
            self._copy_back(b, flat)
        self.handles.clear()


class KeepsItsBuckets(_Bucketed):
    """Right gradients (the old buckets are copied back first, the new ones over them), but every
    step's handles and flat tensors are kept."""

    def finish_gradient_sync(self):
        for b, flat, handle in self.handles:
            handle.wait()
            self._copy_back(b, flat)
        self.waiting = [len(bucket) for bucket in self.buckets]


class LaunchesOnItsLastListedGradient(_Bucketed):
    """A bucket launched when its last parameter in the plan is ready, not when all of them are:
    right while gradients come in the reverse of registration order."""

    def _ready(self, param):
        b = self.bucket_of[param]
        if param is self.buckets[b][-1]:
            self._launch(b)


def course_ddp_with_buckets(module, bucket_cap_mb):
    from course_lib.topics.from_scratch import DDPFromScratch
    return DDPFromScratch(module, bucket_cap_mb=bucket_cap_mb)


WRONG_ANSWERS = {
    lesson15.check_overlapping_ddp: [
        wrong_answer("all-reduces every gradient after backward: right numbers, no overlap",
                     AllReduceAfterBackward),
        wrong_answer("never waits for its all-reduces", NeverWaits),
        wrong_answer("never queues its finish (waits only when called)", NeverQueuesItsFinish),
        wrong_answer("hooks each module's parameters: the tied weight twice", HooksPerModule),
        wrong_answer("waits for each all-reduce inside its hook", WaitsInTheHook),
        wrong_answer("broadcasts the parameters but not the buffers", ForgetsBuffers),
        wrong_answer("sums the gradients instead of averaging", SumsGradients),
        wrong_answer("waits for its handles, never forgets them", KeepsItsHandles),
        wrong_answer("waits on the Futures, never forgets them", KeepsItsFutures),
        wrong_answer("the course's DDPFromScratch", course_ddp_per_parameter),
        wrong_answer("a subclass of the course's DDPFromScratch", SubclassesTheCourseDDP),
        wrong_answer("torch's DDP with a finish_gradient_sync that does nothing",
                     TorchDDPWithANoOpFinish),
        wrong_answer("tensor hooks: the all-reduce races the copy into .grad",
                     TensorHooksBeforeAccumulation),
        wrong_answer("the frozen layer left out of the broadcast", BroadcastsTrainableOnly),
    ],
    lesson15.check_plan_buckets: [
        wrong_answer("buckets in forward order", plan_forward_order),
        wrong_answer("closes a bucket once it reaches the cap: past it", plan_past_the_cap),
        wrong_answer("puts the frozen layer in a bucket", plan_with_frozen),
        wrong_answer("reads the cap in megabytes (10**6 bytes)", plan_in_megabytes),
        wrong_answer("a new bucket when the next gradient would fill the cap exactly",
                     plan_cut_at_the_cap),
        wrong_answer("the course's assign_buckets", plan_by_the_course),
        wrong_answer("numel() * 4 bytes, whatever the dtype", plan_four_bytes_an_element),
        wrong_answer("the cap read as bytes", plan_cap_in_bytes),
    ],
    lesson15.check_bucketed_ddp: [
        wrong_answer("all-reduces every bucket after backward", BucketsAfterBackward),
        wrong_answer("buckets in forward order", ForwardOrderBuckets),
        wrong_answer("never copies the reduced bucket back", NeverCopiesBack),
        wrong_answer("one all-reduce per gradient, not per bucket", OnePerGradient),
        wrong_answer("never resets each bucket's count for the next step", NeverResetsTheCounts),
        wrong_answer("keeps every step's handles and flat tensors", KeepsItsBuckets),
        wrong_answer("the course's DDPFromScratch with buckets", course_ddp_with_buckets),
        wrong_answer("launches a bucket on its last listed gradient, not when all are in",
                     LaunchesOnItsLastListedGradient),
        wrong_answer("torch's DDP with a finish_gradient_sync that does nothing",
                     TorchDDPWithANoOpFinish),
    ],
}
