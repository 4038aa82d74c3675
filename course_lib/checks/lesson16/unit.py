"""Running a learner's FSDP unit on ranks, and watching what each rank holds (lesson 16, exercise 3).

Every rank builds `unit_stack` (Linear layers, the first frozen, flat sizes that 2 and 3 ranks do
not divide, each size its own so that an all-gather's size says whose it is), makes each Linear a
unit of the learner's class (`shard_units`), and trains with SGD. A dispatch mode notes every
all-gather, reduce-scatter and all-reduce, and, when each unit starts computing and when each
backward is over, the bytes of full parameters still in memory: the size of every storage an
all-gather wrote into, each unit's `full` and each layer's weight and bias, that still holds memory
and is referenced (`resize_(0)` frees a storage that autograd's saved views still reference;
dropping one's own reference does not).
Then the same model and data under torch's `fully_shard`. The rank returns plain observations;
the grader compares.
"""
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ...topics.from_scratch.fsdp_unit import shard_units
from ..engine.gradient_sync import shard

STEPS, SGD_LR, GLOBAL_BATCH_SIZE, FEATURES, CLASSES = 3, 0.2, 12, 16, 4
LAYERS = ((16, 13), (13, 11), (11, 14), (14, CLASSES))  # flat sizes 221, 154, 168, 60
SETTLE_S = 0.2
FROZEN_UNITS = 1  # the first unit needs no gradient: its output needs none, backward never reaches it


def unit_stack(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers = []
    for index, (inputs, outputs) in enumerate(LAYERS):
        layers += [nn.Linear(inputs, outputs)] + ([nn.Tanh()] if index < len(LAYERS) - 1 else [])
    model = nn.Sequential(*layers)
    model[0].requires_grad_(False)
    return model


def linears(model) -> list:
    return [module for module in model if isinstance(module, nn.Linear)]


def flat_numels() -> list:
    return [outputs * inputs + outputs for inputs, outputs in LAYERS]


def padded_numels(world_size: int) -> list:
    return [numel + (-numel % world_size) for numel in flat_numels()]


def unit_batches(seed: int, steps: int = STEPS) -> list:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(GLOBAL_BATCH_SIZE, FEATURES, generator=generator),
             torch.randint(0, CLASSES, (GLOBAL_BATCH_SIZE,), generator=generator)) for _ in range(steps)]


def flat_of(layer: nn.Linear) -> torch.Tensor:
    return torch.cat([layer.weight.detach().flatten(), layer.bias.detach()]).clone()


def one_process_units(model_seed: int, data_seed: int, steps: int = STEPS):
    """(losses, [[each Linear's flat parameters] after each step]) of SGD on the global batch."""
    model = unit_stack(model_seed)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=SGD_LR)
    losses, after = [], []
    for X, y in unit_batches(data_seed, steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        after.append([flat_of(layer) for layer in linears(model)])
    return losses, after


class WatchUnits(TorchDispatchMode):
    """Each collective as (kind, phase, unit index or -1, numel); and `memory(where)` notes
    (where, {unit index: bytes}): the storages the all-gathers wrote into that still hold memory
    and that something besides this watch references (a tensor of the learner's, or one autograd
    saved for backward). `start_step()` forgets the previous step's."""

    GATHER = ("c10d::_allgather_base_", "c10d::allgather_into_tensor_coalesced_", "c10d::allgather_")
    SCATTER = ("c10d::_reduce_scatter_base_", "c10d::reduce_scatter_tensor_coalesced_",
               "c10d::reduce_scatter_")

    def __init__(self, numels: list):
        super().__init__()
        self.unit_of = {numel: index for index, numel in enumerate(numels)}
        self.events, self.storages, self.phase = [], {}, "forward"
        self.settled_once, self.units, self.layers = False, [], []

    def start_step(self) -> None:
        self.events, self.storages, self.phase = [], {}, "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name in self.GATHER:  # args[0]: the output, the full flat parameters (or views of them)
            numel = _numel(args[0])
            unit = self.unit_of.get(numel, -1)
            self.events.append(("all_gather", self.phase, unit, numel))
            for tensor in _tensors(args[0]):
                storage = tensor.untyped_storage()
                self.storages[storage._cdata] = (unit, storage)
        elif name in self.SCATTER:  # args[1]: the input, the full flat gradient
            numel = _numel(args[1])
            self.events.append(("reduce_scatter", self.phase, self.unit_of.get(numel, -1), numel))
        elif name.startswith("c10d::allreduce"):
            self.events.append(("all_reduce", self.phase, -1, _numel(args[0])))
        return func(*args, **(kwargs or {}))

    def watch_units(self, units: list, layers: list) -> None:
        """Also count each unit's `full` and the tensors its layer computes with (filled by a copy,
        say, rather than by the all-gather itself)."""
        self.units, self.layers = units, layers

    def memory(self, where) -> None:
        """Gloo's worker thread may hold a finished collective's tensors a moment longer: when more
        than unit `where`'s and the next one's is in memory (anything, at the end), look again for
        up to SETTLE_S before noting it (once per run: a unit that really keeps them costs it once)."""
        expected = {where, where + 1} if where != "end" else set()
        deadline = time.perf_counter() + (SETTLE_S if not self.settled_once else 0)
        while True:
            alive = self._alive()
            if set(alive) <= expected or time.perf_counter() > deadline:
                break
            time.sleep(0.002)
        self.settled_once = self.settled_once or not set(alive) <= expected
        self.events.append(("memory", self.phase, where, alive))

    def _alive(self) -> dict:
        for unit, (owner, layer) in enumerate(zip(self.units, self.layers)):
            for tensor in (getattr(owner, "full", None), layer.weight, layer.bias):
                if torch.is_tensor(tensor):
                    storage = tensor.untyped_storage()
                    self.storages.setdefault(storage._cdata, (unit, storage))
        alive = {}
        for unit, storage in self.storages.values():
            # one use is this watch's own reference; resize_(0) frees the memory whoever holds it
            if storage.nbytes() and torch._C._storage_Use_Count(storage._cdata) > 1:
                alive[unit] = alive.get(unit, 0) + storage.nbytes()
        return alive


def _tensors(value) -> list:
    return [value] if torch.is_tensor(value) else [t for item in value for t in _tensors(item)]


def _numel(value) -> int:
    return sum(t.numel() for t in _tensors(value))


def unit_on_rank(unit_class, model_seed: int, data_seed: int, steps: int = STEPS) -> dict:
    """The learner's units trained, then torch's; a call of the course's FSDPUnit's methods by the
    learner's class comes back as {"library_calls": [names]}."""
    from ...topics.from_scratch.fsdp_unit import FSDPUnit
    from ..engine.call_watch import calls_of

    course = [getattr(FSDPUnit, name) for name in ("__init__", "unshard", "pre_forward", "post_forward",
                                                   "pre_backward", "post_backward")]
    with calls_of(*course) as library_calls:
        result = _train_units(unit_class, model_seed, data_seed, steps)
    if library_calls:
        return {"library_calls": sorted(set(library_calls))}
    rank, world_size = dist.get_rank(), dist.get_world_size()
    result["torch_fsdp"] = _torch_fully_shard(model_seed, data_seed, rank, world_size, steps)
    return result


def _train_units(unit_class, model_seed: int, data_seed: int, steps: int) -> dict:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = unit_stack(model_seed)
    units = shard_units(model, unit_class)
    shard_numels = [int(unit.shard.numel()) for unit in units]
    held = [(int(u.shard.untyped_storage().nbytes()), u.shard.numel() * u.shard.element_size())
            for u in units]  # (bytes of its storage, its own bytes): a view keeps the whole
    optimizer = torch.optim.SGD([unit.shard for unit in units], lr=SGD_LR)
    watch = WatchUnits(padded_numels(world_size))
    watch.watch_units(units, linears(model))
    for index, layer in enumerate(linears(model)):  # after the unit's own hook: as the layer computes
        layer.register_forward_pre_hook(lambda module, args, index=index: watch.memory(index))
    losses, shards, events = [], [], []
    for X, y in unit_batches(data_seed, steps):
        X_local, y_local = shard(X, y, rank, world_size)
        optimizer.zero_grad()
        watch.start_step()
        with watch:
            loss = F.cross_entropy(model(X_local), y_local)
            watch.phase = "backward"
            loss.backward()
            watch.memory("end")
        optimizer.step()
        losses.append(loss.item())
        events.append(watch.events)
        shards.append([unit.shard.detach().clone() for unit in units])
    return dict(shard_numels=shard_numels, shard_storage=held, losses=losses, shards=shards,
                events=events)


def _torch_fully_shard(model_seed, data_seed, rank, world_size, steps) -> list:
    """torch's FSDP2 on the same model and shards of data, each Linear a unit: [[each Linear's
    full flat parameters] after each step]."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, mesh = unit_stack(model_seed), init_device_mesh("cpu", (world_size,))
    for layer in linears(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=SGD_LR)
    after = []
    for X, y in unit_batches(data_seed, steps):
        X_local, y_local = shard(X, y, rank, world_size)
        optimizer.zero_grad()
        F.cross_entropy(model(X_local), y_local).backward()
        optimizer.step()
        after.append([torch.cat([layer.weight.full_tensor().flatten(), layer.bias.full_tensor()])
                      for layer in linears(model)])
    return after
