"""A small FSDP: each rank keeps a shard of every unit's parameters, gathered only while it runs.

    fsdp = FSDPFromScratch(model)                       # the shards are fsdp.parameters()
    optimizer = torch.optim.AdamW(fsdp.parameters())    # so the optimizer state is sharded too
    loss_fn(fsdp(X), y).backward(); optimizer.step()  # backward() returns with the shards' gradients averaged

Granularity: each direct child of `module` that has parameters is a unit (or the modules given
as `units`); what is left (the root's own parameters, and any parameter shared by two units, a
tied weight) forms the root unit, which stays gathered for the whole forward, and for backward
from its first gradient to its last. A unit's parameters are flattened (trainable and frozen ones
apart) and padded to a multiple of world_size; rank r keeps slice r as an nn.Parameter, which is
what the optimizer sees: fsdp.parameters() are the shards.

- Before a unit's forward (a forward pre-hook), all-gather the full flat parameters and point
  the unit's modules at views of them; after its forward (a forward hook) free their storage.
- Backward needs them again: a hook on the unit's outputs (run when their gradient arrives,
  before the unit's own backward) gathers them back into the same storage, which the tensors
  autograd saved still point to.
- Each gathered parameter is a fresh leaf; a post-accumulate-grad hook counts them, and once the
  unit's last gradient is in, the flat gradient is reduce-scattered (async) into the shards and
  the full parameters freed (a frozen unit's: when its backward is over, seen by an identity
  autograd Function on its inputs). The first gradient of a backward queues the wait with the
  autograd engine (`Variable._execution_engine.queue_callback`, as ddp.py does and FSDP2 its root's
  post-backward), so backward() returns once every reduce-scatter is done and averaged.
- Outside a unit's forward its modules' parameters are None: full_state_dict() gathers them.
- compute_dtype: the gather, the forward, backward and the reduce-scatter run in that dtype (each
  unit's floating-point inputs are cast to it); the shards and the optimizer keep their own dtype.

No prefetch (each gather waits: fsdp_unit.py, lesson 16's unit, shows one); torch's `fully_shard`
(FSDP2) overlaps them and shards each parameter along dim 0 instead of a flat buffer.
`fsdp.events` and `fsdp.gathered()` show what is in memory when.
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd import Variable
from torch.utils._pytree import tree_flatten, tree_unflatten

from .events import record


def _all_gather(output, input, group, async_op=False):
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch < 2.13
    return gather(output, input, group=group, async_op=async_op)


def _reduce_scatter(output, input, group, async_op=False):
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor  # torch < 2.13
    return scatter(output, input, group=group, async_op=async_op)


class _AfterBackward(torch.autograd.Function):
    """Identity on a unit's inputs; its backward runs once the unit's backward has produced their
    gradient, i.e. when the unit's backward is over (FSDP2's RegisterPostBackwardFunction)."""

    @staticmethod
    def forward(ctx, callback, *inputs):
        ctx.callback = callback
        return inputs

    @staticmethod
    def backward(ctx, *gradients):
        ctx.callback()
        return (None, *gradients)


class FlatGroup:
    """Some parameters of one unit as one flat tensor: this rank's shard and, when gathered, all of it."""

    def __init__(self, unit: str, key: str, names: List[str], slots: List[list], parameters: List[nn.Parameter],
                 rank: int, world_size: int, compute_dtype, group):
        self.unit, self.key, self.names, self.slots, self.group = unit, key, names, slots, group
        self.shapes = [p.shape for p in parameters]
        self.numels = [p.numel() for p in parameters]
        self.requires_grad = parameters[0].requires_grad
        total = sum(self.numels)
        self.shard_numel = -(-total // world_size)
        flat = torch.zeros(self.shard_numel * world_size, dtype=parameters[0].dtype,
                           device=parameters[0].device)
        torch.cat([p.detach().reshape(-1) for p in parameters], out=flat[:total])
        start = rank * self.shard_numel
        self.shard = nn.Parameter(flat[start:start + self.shard_numel].clone(),
                                  requires_grad=self.requires_grad)
        self.dtype = compute_dtype or self.shard.dtype
        self.full = torch.empty(flat.numel(), dtype=self.dtype, device=flat.device)
        self.full.untyped_storage().resize_(0)  # nothing gathered yet
        self.leaves, self.ready, self.work, self.gradient = [], 0, None, None

    @property
    def is_gathered(self) -> bool:
        return self.full.untyped_storage().size() > 0

    def gather(self, events: list, phase: str) -> bool:
        """All-gather the shards into `full`; for forward, give every slot a fresh leaf viewing it.
        False if it was gathered already."""
        if self.is_gathered:
            return False
        self.full.untyped_storage().resize_(self.full.numel() * self.full.element_size())
        shard = self.shard.detach().to(self.dtype)
        # Writing into `full` must not look like an in-place change to autograd: the tensors saved
        # for backward view this storage, and this write refills it with the same values.
        started = time.perf_counter()
        with torch.autograd._unsafe_preserve_version_counter(self.full):
            _all_gather(self.full, shard, self.group)
        record(events, "all_gather", [self.unit], shard.numel() * shard.element_size(), started=started,
               completed=time.perf_counter(), phase=phase)
        if phase == "forward":
            self.leaves, offset = [], 0
            for numel, shape, slots in zip(self.numels, self.shapes, self.slots):
                leaf = self.full[offset:offset + numel].view(shape).detach().requires_grad_(self.requires_grad)
                for module, attribute in slots:
                    setattr(module, attribute, leaf)
                self.leaves.append(leaf)
                offset += numel
            self.ready = 0
        return True

    def free(self, events: list) -> None:
        if self.is_gathered:
            self.full.untyped_storage().resize_(0)  # autograd's saved views keep the (empty) storage
            for slots in self.slots:
                for module, attribute in slots:
                    setattr(module, attribute, None)  # no view of freed memory left to read
            record(events, "free", [self.unit], 0)

    def gradient_ready(self, events: list) -> bool:
        """One more leaf's gradient is complete; when all are, launch the reduce-scatter."""
        self.ready += 1
        if self.ready < len(self.leaves):
            return False
        flat = torch.zeros_like(self.full)
        torch.cat([leaf.grad.reshape(-1) for leaf in self.leaves], out=flat[:sum(self.numels)])
        for leaf in self.leaves:
            leaf.grad = None
        self.gradient = torch.empty(self.shard_numel, dtype=self.dtype, device=flat.device)
        self.work = _reduce_scatter(self.gradient, flat, self.group, async_op=True)
        self.event = record(events, "reduce_scatter", [self.unit], flat.numel() * flat.element_size(),
                            self.work)
        return True

    def finish(self, world_size: int) -> None:
        self.work.wait()
        if self.event.completed is None:  # gloo's reduce-scatter has no future: when the wait returned
            self.event.completed = time.perf_counter()
        gradient = self.gradient.to(self.shard.dtype).div_(world_size)
        if self.shard.grad is None:
            self.shard.grad = gradient
        else:
            self.shard.grad += gradient
        self.work = self.gradient = None
        self.ready = 0

    def full_parameters(self) -> List[torch.Tensor]:
        """A collective: every parameter of the group at full size, in the shard's dtype."""
        full = torch.empty(self.shard_numel * dist.get_world_size(self.group), dtype=self.shard.dtype,
                           device=self.shard.device)
        _all_gather(full, self.shard.detach(), self.group)
        return [piece.view(shape).clone() for piece, shape in
                zip(full[:sum(self.numels)].split(self.numels), self.shapes)]


class FSDPFromScratch(nn.Module):
    """Shards `module`'s parameters over the ranks, unit by unit (see the module's docstring).

    compute_dtype: e.g. torch.bfloat16 to compute in it while the shards stay fp32 (None: the
    parameters' own dtype). units: the modules to shard as units (default: each direct child of
    `module` with parameters). Rank 0's parameters and buffers are broadcast first; buffers are
    not sharded. backward() returns with the shards' gradients averaged, ready for the step.
    """

    def __init__(self, module: nn.Module, compute_dtype: Optional[torch.dtype] = None,
                 units: Optional[Sequence[nn.Module]] = None, process_group=None):
        super().__init__()
        self.module, self.process_group, self.compute_dtype = module, process_group, compute_dtype
        self.rank, self.world_size = dist.get_rank(process_group), dist.get_world_size(process_group)
        source = dist.get_global_rank(process_group, 0) if process_group is not None else 0
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.detach(), src=source, group=process_group)
        self.events = []
        self.unit_groups: Dict[str, List[FlatGroup]] = {}
        self.names = [name for name, _ in module.named_parameters()]
        self._build_units(module, units)
        self.shards = nn.ParameterList([g.shard for groups in self.unit_groups.values() for g in groups])
        self._handles, self.finish_queued = [], False
        for unit_name, unit_module in self.unit_modules.items():
            self._handles += [unit_module.register_forward_pre_hook(self._before_forward(unit_name)),
                              unit_module.register_forward_hook(self._after_forward(unit_name))]

    def _build_units(self, module: nn.Module, units) -> None:
        """Which unit owns each parameter; then remove the parameters from the modules."""
        if units is None:
            units = [child for child in module.children() if next(child.parameters(), None) is not None]
        unit_of_module = {}
        named_children = {id(child): name for name, child in module.named_modules() if name}
        self.unit_modules = {"": module}
        for unit in units:
            unit_name = named_children[id(unit)]
            self.unit_modules[unit_name] = unit
            for sub in unit.modules():
                unit_of_module.setdefault(id(sub), unit_name)
        # Every (module, attribute) slot holding each parameter, and the units that use it.
        slots, users, first_name = {}, {}, {}
        for module_name, sub in module.named_modules():
            for attribute, parameter in list(sub._parameters.items()):
                if parameter is None:
                    continue
                key = id(parameter)
                slots.setdefault(key, []).append([sub, attribute])
                users.setdefault(key, set()).add(unit_of_module.get(id(sub), ""))
                first_name.setdefault(key, (f"{module_name}.{attribute}" if module_name else attribute,
                                            parameter))
        members = {name: [] for name in self.unit_modules}
        for key, (name, parameter) in first_name.items():
            owner = users[key].pop() if len(users[key]) == 1 else ""  # shared by two units: the root's
            members[owner].append((name, parameter, slots[key]))
        for unit_name, owned in members.items():
            groups = []
            for trainable in (True, False):
                chosen = [item for item in owned if item[1].requires_grad == trainable]
                if chosen:
                    groups.append(FlatGroup(unit_name or "(root)", unit_name, [n for n, _, _ in chosen],
                                            [s for _, _, s in chosen], [p for _, p, _ in chosen],
                                            self.rank, self.world_size, self.compute_dtype,
                                            self.process_group))
            self.unit_groups[unit_name] = groups
        for owned in members.values():
            for _, parameter, parameter_slots in owned:
                for sub, attribute in parameter_slots:
                    del sub._parameters[attribute]
                    setattr(sub, attribute, None)  # until the unit's forward gathers it

    def forward(self, *args, **kwargs):
        self.events = []
        return self.module(*args, **kwargs)

    # -- the hooks ----------------------------------------------------------------------------------
    def _before_forward(self, unit_name: str):
        def hook(module, args):
            for group in self.unit_groups[unit_name]:
                if group.gather(self.events, "forward") and group.requires_grad:
                    for leaf in group.leaves:
                        leaf.register_post_accumulate_grad_hook(self._gradient_hook(group))
            flat, spec = tree_flatten(args)
            if self.compute_dtype is not None:  # as FSDP2's MixedPrecisionPolicy(cast_forward_inputs=True)
                flat = [self._cast(value) for value in flat]
            needing = [i for i, value in enumerate(flat) if torch.is_tensor(value) and value.requires_grad]
            if needing and torch.is_grad_enabled():
                passed = _AfterBackward.apply(self._after_backward(unit_name), *(flat[i] for i in needing))
                for i, tensor in zip(needing, passed):
                    flat[i] = tensor
            return tree_unflatten(flat, spec)
        return hook

    def _after_forward(self, unit_name: str):
        def hook(module, args, output):
            for group in self.unit_groups[unit_name]:
                group.free(self.events)
            for tensor in tree_flatten(output)[0]:
                if torch.is_tensor(tensor) and tensor.requires_grad:
                    tensor.register_hook(self._before_backward(unit_name))
        return hook

    def _before_backward(self, unit_name: str):
        def hook(gradient):
            for group in self.unit_groups[unit_name]:
                if group.work is None:  # not already reduced in this backward
                    group.gather(self.events, "backward")
        return hook

    def _after_backward(self, unit_name: str):
        def hook():
            if all(g.work is not None for g in self.unit_groups[unit_name] if g.requires_grad):
                for group in self.unit_groups[unit_name]:
                    group.free(self.events)
        return hook

    def _gradient_hook(self, group: FlatGroup):
        def hook(leaf):
            if not self.finish_queued:  # the first gradient of this backward: wait at its end
                self.finish_queued = True
                Variable._execution_engine.queue_callback(self._end_of_backward)
            if group.gradient_ready(self.events):
                self._free_unit_if_done(group)
        return hook

    def _free_unit_if_done(self, group: FlatGroup) -> None:
        unit_groups = self.unit_groups[group.key]
        if all(g.work is not None for g in unit_groups if g.requires_grad):
            for g in unit_groups:
                g.free(self.events)

    def _cast(self, value):
        if torch.is_tensor(value) and value.is_floating_point():
            return value.to(self.compute_dtype)
        return value

    # -- after backward -----------------------------------------------------------------------------
    def _end_of_backward(self) -> None:
        self.finish_queued = False
        self._wait_and_average()

    def finish_gradient_sync(self) -> None:
        """Run for you at the end of backward(); when called again, nothing is left to wait for."""
        if any(group.work is not None for groups in self.unit_groups.values() for group in groups):
            self._wait_and_average()

    def _wait_and_average(self) -> None:
        """Wait for every reduce-scatter; each shard's .grad then holds its averaged gradient."""
        missing = [group.unit for groups in self.unit_groups.values() for group in groups
                   if group.requires_grad and group.work is None]
        for groups in self.unit_groups.values():
            for group in groups:
                if group.work is not None:
                    group.finish(self.world_size)
                group.free(self.events)
        if missing:
            raise RuntimeError(
                f"unit(s) {', '.join(missing)} got no complete gradient in this backward: every "
                "trainable parameter must take part in the loss on every rank")

    def gathered(self) -> List[str]:
        """The units whose full parameters are in memory now ("(root)": the root's own)."""
        return [group.unit for groups in self.unit_groups.values() for group in groups if group.is_gathered]

    def full_state_dict(self) -> Dict[str, torch.Tensor]:
        """A collective: {parameter name: full tensor}, on every rank (a tied weight under its first name)."""
        state = {}
        for groups in self.unit_groups.values():
            for group in groups:
                state.update(zip(group.names, group.full_parameters()))
        return {name: state[name] for name in self.names}
