"""What a DataParallel forward and backward did, seen from the model's own hooks.

Replicas keep the hooks of the model they copy (course_lib.training.dp and nn.DataParallel both
copy the module's hook dicts), so hooks put on the model before a learner's function runs see
every replica's forward: which module ran, in which thread, on which rows, and the gradient that
reached its output. From that a grader tells the four steps apart by what they did: scatter (one
chunk per replica), replicate (a copy per chunk, not the model itself), parallel_apply (each
replica in a thread of its own) and gather (every output reached one loss over the whole batch).
"""
import contextlib
import threading
from dataclasses import dataclass, field

import torch


@dataclass
class ReplicaForward:
    """One forward of the model or of one of its replicas."""

    module: object
    thread: threading.Thread
    inputs: torch.Tensor
    output_gradients: list = field(default_factory=list)  # what backward sent to its output

    @property
    def output_gradient(self):
        return sum(self.output_gradients) if self.output_gradients else None


@contextlib.contextmanager
def replica_forwards(model):
    """Within the block, [ReplicaForward] of every forward of `model` or of a copy of it."""
    forwards, by_call = [], threading.local()

    def before(module, args):
        record = ReplicaForward(module, threading.current_thread(), args[0].detach().clone())
        forwards.append(record)
        by_call.record = record

    def after(module, args, output):
        record = by_call.record
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda gradient: record.output_gradients.append(
                gradient.detach().clone()))

    handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    try:
        yield forwards
    finally:
        for handle in handles:
            handle.remove()


def chunk_of(forward, chunks):
    """The index of the chunk `forward` ran on, or None when its rows are no chunk."""
    return next((index for index, chunk in enumerate(chunks)
                 if forward.inputs.shape == chunk.shape and torch.equal(forward.inputs, chunk)),
                None)


def gradient_scale(got, expected):
    """c when `got` is c times `expected` (up to rounding), else None."""
    denominator = float((expected * expected).sum())
    if denominator == 0:
        return None
    scale = float((got * expected).sum()) / denominator
    return scale if torch.allclose(got, scale * expected, rtol=1e-4, atol=1e-7) else None
