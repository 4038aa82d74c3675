"""DDP from hooks: all-reduce each gradient (or each bucket) the moment backward produces it.

    ddp = DDPFromScratch(model, bucket_cap_mb=None)   # None: one all-reduce per parameter
    loss_fn(ddp(X), y).backward()                     # the all-reduces start, and end, in backward()
    optimizer.step()                                  # torch's DDP's loop: the gradients are averaged

What torch's DistributedDataParallel does in C++ (its Reducer), here in Python: rank 0's
parameters and buffers are broadcast at construction; a hook on each parameter
(`register_post_accumulate_grad_hook`, called once its .grad holds this backward's whole
gradient, also for a weight shared by two layers) launches an asynchronous all-reduce
(`async_op=True`) so communication overlaps the rest of backward. The first hook of each backward
queues `finish_gradient_sync` with the autograd engine (`Variable._execution_engine.queue_callback`,
run once this backward's graph is done: torch's DDP queues its Reducer's finalize_backward, the
wait, the same way (reducer.cpp, once the last bucket is launched), FSDP2 its root's post-backward,
picotron its bucketed DDP's wait), so backward() returns with the gradients averaged. Parameters that do not
require grad get no hook and are never reduced. `ddp.events` records every launch (see events.py).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Optional

import torch.distributed as dist
from torch import nn
from torch.autograd import Variable

from .buckets import Bucket, assign_buckets
from .events import record


class DDPFromScratch(nn.Module):
    """Wraps `module` (then `ddp.module`) so each backward() averages its gradients over ranks.

    bucket_cap_mb: None, one all-reduce per parameter as each gradient is ready; a number, the
    gradients grouped in reverse registration order into buckets of at most that many MiB, each
    flattened into one buffer and all-reduced when its last gradient is ready.
    broadcast_buffers: also broadcast rank 0's buffers before every forward, as torch's DDP does.
    record_events: keep `events` (each all-reduce's launch, and its completion from a callback that
    gloo's thread runs); False saves that Python work (benchmarks/from_scratch_ddp.py).
    overlap: False holds every launch back until backward's compute is over (lesson 04's DDP, with
    the same buckets): lesson 15 measures what the overlap saves against it.
    backward() waits for the all-reduces at its end (a callback it runs); finish_gradient_sync()
    is that wait, and a no-op when called again.
    """

    def __init__(self, module: nn.Module, bucket_cap_mb: Optional[float] = None,
                 broadcast_buffers: bool = True, record_events: bool = True, process_group=None,
                 overlap: bool = True):
        super().__init__()
        self.module = module
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.source = dist.get_global_rank(process_group, 0) if process_group is not None else 0
        self.broadcast_buffers, self.record_events = broadcast_buffers, record_events
        self.overlap, self.deferred = overlap, []
        self.sync_gradients, self.finish_queued = True, False
        self.events = []
        self._broadcast(list(module.parameters()) + list(module.buffers()))
        # named_parameters() lists a shared (tied) parameter once: it gets one hook, one all-reduce.
        named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        self.names = {id(p): name for name, p in named}
        self.pending = []  # per parameter: (parameter, work); with buckets: the launched buckets
        self.buckets, self.slot = [], {}
        if bucket_cap_mb is not None:
            for index, parameters in enumerate(assign_buckets([p for _, p in named], bucket_cap_mb)):
                bucket = Bucket(index, parameters, [self.names[id(p)] for p in parameters])
                self.buckets.append(bucket)
                for position, parameter in enumerate(parameters):
                    self.slot[id(parameter)] = (bucket, position)
        self._hooks = [p.register_post_accumulate_grad_hook(self._gradient_ready) for _, p in named]

    def forward(self, *args, **kwargs):
        self.events = []  # a new step
        if self.broadcast_buffers and self.world_size > 1:
            self._broadcast(list(self.module.buffers()))
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally (no all-reduce) for the backward passes inside."""
        self.sync_gradients = False
        try:
            yield
        finally:
            self.sync_gradients = True

    def _gradient_ready(self, parameter: nn.Parameter) -> None:
        """Called by autograd inside backward(), once parameter.grad is complete."""
        if not self.sync_gradients:
            return
        if not self.finish_queued:  # the first gradient of this backward: wait at its end
            self.finish_queued = True
            Variable._execution_engine.queue_callback(self._end_of_backward)
        if not self.overlap:
            self.deferred.append(parameter)  # launched by _end_of_backward
            return
        self._launch(parameter)

    def _launch(self, parameter: nn.Parameter) -> None:
        if not self.buckets:
            work = dist.all_reduce(parameter.grad, group=self.process_group, async_op=True)
            if self.record_events:
                record(self.events, "all_reduce", [self.names[id(parameter)]], parameter.grad.nbytes, work)
            self.pending.append((parameter, work))
            return
        bucket, position = self.slot[id(parameter)]
        if bucket.copy_in(position):
            bucket.work = dist.all_reduce(bucket.buffer, group=self.process_group, async_op=True)
            if self.record_events:
                record(self.events, "all_reduce", bucket.names, bucket.nbytes, bucket.work, bucket=bucket.index)
            self.pending.append(bucket)

    def _end_of_backward(self) -> None:
        self.finish_queued = False
        deferred, self.deferred = self.deferred, []
        for parameter in deferred:
            self._launch(parameter)
        self._wait_and_average()

    def finish_gradient_sync(self) -> None:
        """Run for you at the end of backward(); when called again, nothing is left to wait for."""
        if self.pending:
            self._wait_and_average()

    def _wait_and_average(self) -> None:
        """Wait for every all-reduce launched by backward, then average the gradients."""
        launched = {id(p) for p, _ in self.pending} if not self.buckets else \
            {id(p) for bucket in self.pending for p in bucket.parameters}
        missing = [name for key, name in self.names.items() if key not in launched]
        for item in self.pending:
            if self.buckets:
                item.work.wait()
                item.copy_out(self.world_size)
            else:
                parameter, work = item
                work.wait()
                parameter.grad.div_(self.world_size)
        self.pending = []
        if missing and self.sync_gradients:
            for bucket in self.buckets:
                bucket.ready.clear()
            raise RuntimeError(
                f"no gradient reached {', '.join(missing)} in this backward, so it was never "
                "all-reduced: every parameter that requires grad must take part in the loss on "
                "every rank (freeze the others with requires_grad_(False))")

    def _broadcast(self, tensors) -> None:
        for tensor in tensors:
            dist.broadcast(tensor.detach(), src=self.source, group=self.process_group)
