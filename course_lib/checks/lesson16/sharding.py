"""Running a learner's ZeRO-1 optimizer and FSDP layer on ranks, and watching what each rank holds
(lesson 16).

ZeRO-1: every rank trains TiedNet (lesson 15's model: a tied weight, a frozen layer, a buffer)
under torch's DDP with the learner's ShardedOptimizer(AdamW), then with torch's
ZeroRedundancyOptimizer on the same shards; it returns its weights after each step and the
parameters its local optimizer holds state for.

FSDP: every rank shards TiedStack (a stack of Linear layers, the first used twice, one frozen, a
buffer) with ShardedStack, which runs each layer through the learner's autograd Function, and
trains with SGD. A dispatch mode (as in gradient_sync) notes each all-gather (and whether an
earlier gathered tensor is still alive then), each reduce-scatter and each all-reduce.
"""
import time
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector
from torch.utils._python_dispatch import TorchDispatchMode

from ..engine.gradient_sync import TiedNet, batches, one_process, shard, train_on_shards

STEPS, ADAMW = 3, dict(lr=0.05, weight_decay=0.1)
FEATURES, CLASSES, GLOBAL_BATCH_SIZE, SGD_LR = 16, 4, 12, 0.2
SETTLE_S = 0.2


# -- ZeRO-1 ----------------------------------------------------------------------------------------
def one_process_adamw(steps: int = STEPS) -> list:
    return one_process(steps, optimizer=lambda parameters: torch.optim.AdamW(parameters, **ADAMW))


def zero_on_rank(optimizer_class, steps: int = STEPS) -> dict:
    """The learner's optimizer trained, then torch's; a call of the course's ShardedOptimizer or
    torch's ZeroRedundancyOptimizer by the learner's comes back as {"library_calls": [names]}."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from ...topics.from_scratch.zero import ShardedOptimizer
    from ..engine.call_watch import calls_of

    rank, world_size = dist.get_rank(), dist.get_world_size()
    with calls_of(ShardedOptimizer.__init__, ZeroRedundancyOptimizer.__init__) as library_calls:
        weights, owned = _train_zero(lambda params: optimizer_class(params, torch.optim.AdamW, **ADAMW),
                                     rank, world_size, steps)
    if library_calls:
        return {"library_calls": library_calls}
    torch_weights, _ = _train_zero(lambda params: ZeroRedundancyOptimizer(
        params, optimizer_class=torch.optim.AdamW, **ADAMW), rank, world_size, steps)
    return dict(weights=weights, owned=owned, torch_zero=torch_weights)


def _train_zero(make_optimizer, rank, world_size, steps):
    model = TiedNet(seed=0)
    names = {param: name for name, param in model.named_parameters()}
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = make_optimizer([p for p in ddp.parameters() if p.requires_grad])
    weights = train_on_shards(ddp, optimizer, batches(steps), rank, world_size,
                              lambda: parameters_to_vector(model.parameters()).detach().clone())
    local = getattr(optimizer, "local_optimizer", getattr(optimizer, "optim", None))
    if local is None:
        return weights, None
    owned = {names.get(param, "a tensor not in the model"): sum(
        value.numel() * value.element_size() for value in state.values() if torch.is_tensor(value))
        for param, state in local.state.items() if state}
    return weights, owned


# -- FSDP ----------------------------------------------------------------------------------------
def shard_for(rank: int, numel: int, dtype=torch.float32) -> torch.Tensor:
    """A shard whose values say whose it is and where: rank r's element i is 100 r + i."""
    return (100 * rank + torch.arange(numel)).to(dtype)


GATHER_CASES = ((5, torch.float32), (1, torch.float32), (4, torch.float64))  # (numel, dtype)


def gather_on_rank(gather_full, cases=GATHER_CASES) -> list:
    rank = dist.get_rank()
    return [gather_full(shard_for(rank, numel, dtype)) for numel, dtype in cases]


PLAN = ("first", "frozen", "middle", "first", "head")  # the order TiedStack runs its layers


def run_stack(x, run_layer, scale):
    """TiedStack's forward, whatever runs each layer: run_layer(name, x)."""
    for index, name in enumerate(PLAN):
        x = run_layer(name, x)
        x = x * scale if name == "middle" else x
        x = torch.tanh(x) if index < len(PLAN) - 1 else x
    return x


class TiedStack(nn.Module):
    """Linear layers run in PLAN order: `first` twice (tied: one weight, two uses), `frozen` needs
    no gradient, and the buffer `scale` multiplies what `middle` gives."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.first, self.frozen = nn.Linear(16, 16), nn.Linear(16, 12)
        self.middle, self.head = nn.Linear(12, 16), nn.Linear(16, CLASSES)
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", 1 + torch.rand(16))

    def forward(self, x):
        return run_stack(x, lambda name, x: getattr(self, name)(x), self.scale)


def flat_parameters(layer: nn.Linear, world_size: int) -> torch.Tensor:
    """weight, then bias, flattened into one tensor, zero-padded to a multiple of world_size."""
    flat = torch.cat([layer.weight.detach().flatten(), layer.bias.detach()])
    return F.pad(flat, (0, -flat.numel() % world_size))


class ShardedStack(nn.Module):
    """FSDP for TiedStack: rank r keeps slice r of each layer's flat parameters; `function` runs a
    layer from its shard (function.apply(x, shard, out_features, in_features))."""

    def __init__(self, model: TiedStack, function):
        super().__init__()
        rank, world_size = dist.get_rank(), dist.get_world_size()
        self.function, self.shapes, self.shards = function, {}, nn.ParameterDict()
        for name in dict.fromkeys(PLAN):
            layer = getattr(model, name)
            flat = flat_parameters(layer, world_size)
            size = flat.numel() // world_size
            self.shards[name] = nn.Parameter(flat[rank * size:(rank + 1) * size].clone(),
                                             requires_grad=layer.weight.requires_grad)
            self.shapes[name] = (layer.out_features, layer.in_features)
        self.register_buffer("scale", model.scale.clone())

    def forward(self, x):
        return run_stack(x, lambda name, x: self.function.apply(x, self.shards[name], *self.shapes[name]),
                         self.scale)


def fsdp_batches(steps: int = STEPS):
    generator = torch.Generator().manual_seed(16)
    return [(torch.randn(GLOBAL_BATCH_SIZE, FEATURES, generator=generator),
             torch.randint(0, CLASSES, (GLOBAL_BATCH_SIZE,), generator=generator)) for _ in range(steps)]


def one_process_stack(steps: int = STEPS) -> list:
    """[{layer: its flat parameters, unpadded}] after each step of SGD on the global batch."""
    model = TiedStack(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    after = []
    for X, y in fsdp_batches(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(X), y).backward()
        optimizer.step()
        after.append({name: flat_parameters(getattr(model, name), 1) for name in dict.fromkeys(PLAN)})
    return after


class WatchSharding(TorchDispatchMode):
    """Notes each all-gather (its size, how many earlier gathered tensors are still alive),
    reduce-scatter (its input's size) and all-reduce, with the phase the loop says it is in."""

    GATHER = ("c10d::_allgather_base_", "c10d::allgather_into_tensor_coalesced_", "c10d::allgather_")
    SCATTER = ("c10d::_reduce_scatter_base_", "c10d::reduce_scatter_tensor_coalesced_",
               "c10d::reduce_scatter_")

    def __init__(self):
        super().__init__()
        self.events, self.gathered, self.phase = [], [], "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if name in self.GATHER:  # args[0]: the output (a tensor, or lists of chunks)
            self.events.append(("all_gather", self.phase, _numel(args[0]), self._alive()))
            self.gathered.append([weakref.ref(t) for t in _tensors(args[0])])
        elif name in self.SCATTER:  # args[1]: the input, the full gradient
            self.events.append(("reduce_scatter", self.phase, _numel(args[1]), 0))
        elif name.startswith("c10d::allreduce"):
            self.events.append(("all_reduce", self.phase, _numel(args[0]), 0))
        return func(*args, **(kwargs or {}))


    def _alive(self) -> int:
        """How many earlier gathered tensors are alive. The backend may hold a finished
        collective's tensors a moment longer (gloo: until its worker thread lets go of the work),
        so wait up to SETTLE_S for that before counting what the learner's code still holds."""
        deadline = time.perf_counter() + SETTLE_S
        while True:
            self.gathered = [refs for refs in self.gathered if any(ref() is not None for ref in refs)]
            if not self.gathered or time.perf_counter() > deadline:
                return len(self.gathered)
            time.sleep(0.002)


def _tensors(value) -> list:
    return [value] if torch.is_tensor(value) else [t for item in value for t in _tensors(item)]


def _numel(value) -> int:
    return sum(t.numel() for t in _tensors(value))


def fsdp_on_rank(function, steps: int = STEPS) -> dict:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    sharded = ShardedStack(TiedStack(seed=0), function)
    optimizer = torch.optim.SGD(sharded.parameters(), lr=SGD_LR)
    shards, events = [], []
    for X, y in fsdp_batches(steps):
        X_local, y_local = shard(X, y, rank, world_size)
        optimizer.zero_grad()
        with WatchSharding() as watch:
            loss = F.cross_entropy(sharded(X_local), y_local)
            watch.phase = "backward"
            loss.backward()
        optimizer.step()
        events.append(watch.events)
        shards.append({name: shard_.detach().clone() for name, shard_ in sharded.shards.items()})
    return dict(shards=shards, events=events, torch_fsdp=_torch_fully_shard(rank, world_size, steps))


def _torch_fully_shard(rank: int, world_size: int, steps: int) -> list:
    """torch's FSDP2 on the same shards of data: `middle` and `head` units, the rest (the tied
    `first`, `frozen`) in the root's; [{layer: full flat parameters}] after each step."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, mesh = TiedStack(seed=0), init_device_mesh("cpu", (world_size,))
    for name in ("middle", "head"):
        fully_shard(getattr(model, name), mesh=mesh)
    fully_shard(model, mesh=mesh)
    return train_on_shards(model, torch.optim.SGD(model.parameters(), lr=SGD_LR), fsdp_batches(steps),
                           rank, world_size, lambda: {
                               name: torch.cat([getattr(model, name).weight.full_tensor().flatten(),
                                                getattr(model, name).bias.full_tensor()])
                               for name in dict.fromkeys(PLAN)})


def padded_sizes(world_size: int) -> dict:
    model = TiedStack()
    return {name: flat_parameters(getattr(model, name), world_size).numel()
            for name in dict.fromkeys(PLAN)}
