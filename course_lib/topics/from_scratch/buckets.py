"""Gradient buckets: parameters grouped, in reverse order of registration, up to a size cap.

Backward computes the last layer's gradients first, so walking the parameters backwards puts
the gradients that are ready together into the same bucket, and the first bucket can be
all-reduced while earlier layers are still computing. Torch's DDP learns that order instead: by
default its first step all-reduces one bucket of every gradient, and from the second it buckets
them in the order they became ready (Reducer::rebuild_buckets), its first bucket capped at 1 MiB
unless `bucket_cap_mb` is given; ours are all equal, and closed before they pass the cap where
torch's close once they reach it (lesson 15).
"""
from __future__ import annotations

from typing import List, Sequence

import torch
from torch import nn


def assign_buckets(parameters: Sequence[nn.Parameter], bucket_cap_mb: float) -> List[List[nn.Parameter]]:
    """Buckets of parameters, last registered first; each holds at most bucket_cap_mb megabytes
    (MiB, as torch's DDP counts them), except a parameter bigger than the cap, alone in its own.
    A bucket holds one dtype on one device: it is flattened into one buffer."""
    if bucket_cap_mb <= 0:
        raise ValueError(f"bucket_cap_mb={bucket_cap_mb} must be positive (None: no buckets)")
    cap_bytes = bucket_cap_mb * 1024 * 1024
    buckets, current, current_bytes = [], [], 0
    for parameter in reversed(list(parameters)):
        nbytes = parameter.numel() * parameter.element_size()
        fits = current_bytes + nbytes <= cap_bytes
        same_kind = not current or (current[0].dtype, current[0].device) == (parameter.dtype, parameter.device)
        if current and not (fits and same_kind):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(parameter)
        current_bytes += nbytes
    if current:
        buckets.append(current)
    return buckets


class Bucket:
    """One flat buffer for some parameters' gradients, all-reduced when the last one is ready."""

    def __init__(self, index: int, parameters: List[nn.Parameter], names: List[str]):
        self.index, self.parameters, self.names = index, parameters, names
        self.offsets, total = [], 0
        for parameter in parameters:
            self.offsets.append(total)
            total += parameter.numel()
        first = parameters[0]
        self.buffer = torch.zeros(total, dtype=first.dtype, device=first.device)
        self.nbytes = total * self.buffer.element_size()
        self.ready = set()   # positions of the parameters whose gradient is in the buffer
        self.work = None     # the all-reduce's handle, once launched

    def view_of(self, position: int, parameter: nn.Parameter) -> torch.Tensor:
        start = self.offsets[position]
        return self.buffer[start:start + parameter.numel()].view_as(parameter)

    def copy_in(self, position: int) -> bool:
        """Copy the gradient of parameters[position] into the buffer; True when every one is in."""
        parameter = self.parameters[position]
        self.view_of(position, parameter).copy_(parameter.grad)
        self.ready.add(position)
        return len(self.ready) == len(self.parameters)

    def copy_out(self, world_size: int) -> None:
        """Average the summed buffer and write each slice back into its parameter's gradient."""
        self.buffer.div_(world_size)
        for position, parameter in enumerate(self.parameters):
            parameter.grad.copy_(self.view_of(position, parameter))
        self.ready.clear()
        self.work = None
