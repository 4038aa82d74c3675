"""A module's parameters as views of one flat buffer whose memory comes and goes: the ground an
FSDP unit stands on (lesson 16), with the hook points FSDP2 uses (`pre_forward` ... `post_backward`).

    class MyUnit(FlatParameters):            # a subclass makes self.shard, and fills in the hooks
        def pre_forward(self): ...           # before the forward: bring its parameters into self.full
        def post_forward(self): ...          # after its forward
        def pre_backward(self): ...          # when backward reaches the module's output
        def post_backward(self): ...         # once every parameter's gradient is in (self.flat_gradient())

The module's parameters are taken out of it (`self.flat` keeps their values, flattened, unpadded).
`self.full` is the flat buffer of every rank's shard; `allocate_full()` gives it memory,
`free_full()` takes it back (`resize_(0)` of its storage, as FSDP2's `free_storage`): that frees it
even though autograd saved views of it for backward, and refilling the same storage in backward
makes those saved views valid again. Each forward, the module's parameters become fresh leaves that
view `self.full` (made with `set_`, so refilling `full` in place is no in-place change to them).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class FlatParameters:
    """`module`'s parameters as views of `self.full`; the subclass fills in the four hooks."""

    def __init__(self, module: nn.Module):
        self.module, self.full, self.pending_gather = module, None, None
        self.slots, parameters = [], []
        for sub in module.modules():
            for attribute, parameter in list(sub._parameters.items()):
                if parameter is not None:
                    self.slots.append((sub, attribute))
                    parameters.append(parameter)
        if len({p.requires_grad for p in parameters}) != 1:
            raise ValueError("a unit's parameters must all need a gradient, or none")
        self.requires_grad = parameters[0].requires_grad
        self.shapes = [p.shape for p in parameters]
        self.numels = [p.numel() for p in parameters]
        self.flat = torch.cat([p.detach().reshape(-1) for p in parameters])
        for sub, attribute in self.slots:
            del sub._parameters[attribute]
            setattr(sub, attribute, None)  # until a forward gathers it
        self.leaves, self._ready = [], 0
        module.register_forward_pre_hook(self._before_forward)
        module.register_forward_hook(self._after_forward)

    # -- what a subclass uses ---------------------------------------------------------------------------
    def allocate_full(self, dtype=None) -> torch.Tensor:
        """self.full (world_size shards long), with its memory back; its values are whatever was there.
        dtype: the full parameters' (and so the compute's) dtype, when not the shard's (lesson 19)."""
        if self.full is None:
            self.full = torch.empty(self.shard.numel() * dist.get_world_size(), dtype=dtype or self.shard.dtype,
                                    device=self.shard.device)
        storage, size = self.full.untyped_storage(), self.full.numel() * self.full.element_size()
        if storage.nbytes() != size:  # as FSDP2's alloc_storage: resizing moves the memory
            storage.resize_(size)
        return self.full

    def free_full(self) -> None:
        """Give self.full's memory back (the tensors viewing it stay, empty, until it is allocated again)."""
        if self.full is not None:
            self.full.untyped_storage().resize_(0)

    def full_bytes(self) -> int:
        """The bytes of full parameters this unit holds now."""
        return 0 if self.full is None else self.full.untyped_storage().nbytes()

    def flat_gradient(self) -> torch.Tensor:
        """The gradient of the full flat parameters from this backward, zero-padded like self.full."""
        gradient = torch.zeros(self.full.numel(), dtype=self.full.dtype, device=self.full.device)
        torch.cat([leaf.grad.reshape(-1) for leaf in self.leaves], out=gradient[:sum(self.numels)])
        for leaf in self.leaves:
            leaf.grad = None
        return gradient

    # -- the hooks a subclass fills in ------------------------------------------------------------------
    def pre_forward(self) -> None:
        raise NotImplementedError

    def post_forward(self) -> None:
        raise NotImplementedError

    def pre_backward(self) -> None:
        raise NotImplementedError

    def post_backward(self) -> None:
        raise NotImplementedError

    # -- the plumbing: module and autograd hooks that call them -----------------------------------------
    def _before_forward(self, module, args):
        self.pre_forward()
        if self.full_bytes() == 0:
            raise RuntimeError(f"{type(module).__name__}'s forward starts with no full parameters in "
                               "memory: pre_forward must gather them (or wait for their prefetch)")
        self.leaves, self._ready, offset = [], 0, 0
        storage = self.full.untyped_storage()
        for (sub, attribute), shape, numel in zip(self.slots, self.shapes, self.numels):
            leaf = torch.empty(0, dtype=self.full.dtype, device=self.full.device)
            leaf.set_(storage, self.full.storage_offset() + offset, shape)
            leaf.requires_grad_(self.requires_grad)
            if self.requires_grad:
                leaf.register_post_accumulate_grad_hook(self._gradient_in)
            setattr(sub, attribute, leaf)
            self.leaves.append(leaf)
            offset += numel

    def _after_forward(self, module, args, output):
        self.post_forward()
        if torch.is_tensor(output) and output.requires_grad:
            output.register_hook(self._gradient_reaches_output)

    def _gradient_reaches_output(self, gradient) -> None:
        self.pre_backward()  # returns None: the gradient goes on unchanged
        if self.full_bytes() == 0:
            raise RuntimeError(f"backward reached {type(self.module).__name__} with no full parameters "
                               "in memory: pre_backward must gather them again")

    def _gradient_in(self, leaf) -> None:
        self._ready += 1
        if self._ready == len(self.leaves):
            self.post_backward()
