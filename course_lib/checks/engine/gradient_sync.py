"""Running a learner's DDP class on ranks and watching how it syncs the gradients (lesson 15).

Each rank builds TiedNet with its own seed (so the broadcast at construction matters), wraps it in
the learner's class, trains a few steps on its shard of each global batch, and returns its weights
and, per step, what it saw, in order: each gradient becoming ready (the grader's own
post-accumulate-grad hook, registered before the learner's, so it runs first), each all-reduce
the rank started (seen below the Python API, where every torch.distributed call ends in a c10d
operator, as lesson 03's count_traffic counts), backward() returning, and the sync finishing.
The same rank then trains torch's own DDP on the same shards, for comparison.

On the last rank, one step's first all-reduce starts DELAY_S late: on every other rank that
all-reduce cannot finish before then, which shows whether a rank goes on computing while it is in
flight (overlap) and whether it waits for it before the optimizer step.
"""
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector
from torch.utils._python_dispatch import TorchDispatchMode

VOCAB, WIDTH = 12, 16
STEPS, GLOBAL_BATCH_SIZE, LR = 3, 12, 0.2   # 12 samples split evenly over 2 or 3 ranks
DELAYED_STEP, DELAY_S = 1, 0.4


class TiedNet(nn.Module):
    """The traps in one small model: a tied embedding, a frozen layer and a buffer.

    head.weight IS embed.weight (one Parameter, registered by two modules); `frozen` does not
    require grad; `scale` is a buffer (not a parameter) that the forward uses.
    """

    def __init__(self, seed: int = 0, hidden_layers: int = 3):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.hidden = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(hidden_layers)])
        self.frozen = nn.Linear(WIDTH, WIDTH)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied: one tensor, two modules
        self.register_buffer("scale", 1 + torch.rand(WIDTH))

    def forward(self, tokens):
        x = self.embed(tokens).mean(dim=1)
        for layer in self.hidden:
            x = torch.tanh(layer(x))
        return self.head(torch.tanh(self.frozen(x)) * self.scale)


def trainable(model) -> list:
    """[(name, parameter)] that need a gradient, each tensor once, in registration order."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def batches(steps: int = STEPS):
    generator = torch.Generator().manual_seed(15)
    return [(torch.randint(0, VOCAB, (GLOBAL_BATCH_SIZE, 4), generator=generator),
             torch.randint(0, VOCAB, (GLOBAL_BATCH_SIZE,), generator=generator))
            for _ in range(steps)]


def shard(X, y, rank: int, world_size: int):
    return X[rank::world_size], y[rank::world_size]


def state_vector(model) -> torch.Tensor:
    """Every parameter (frozen too) and buffer, flattened: what the broadcast must make equal."""
    return torch.cat([t.detach().flatten() for t in [*model.parameters(), *model.buffers()]]).clone()


def one_process(steps: int = STEPS, hidden_layers: int = 3, optimizer=None) -> list:
    """The oracle: TiedNet(seed=0) trained on each whole global batch, with SGD(lr=LR) or
    `optimizer(parameters)`; the weights after each step."""
    model = TiedNet(seed=0, hidden_layers=hidden_layers)
    optimizer = (optimizer or (lambda parameters: torch.optim.SGD(parameters, lr=LR)))(model.parameters())
    weights = []
    for X, y in batches(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(X), y).backward()
        optimizer.step()
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
    return weights


class WatchAllReduces(TorchDispatchMode):
    """Notes each all-reduce this rank starts (its element count) in `events`; can delay one."""

    def __init__(self, events: list, works: list):
        super().__init__()
        self.events, self.works, self.delay_next = events, works, 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.name() not in ("c10d::allreduce_", "c10d::allreduce_coalesced_"):
            return func(*args, **(kwargs or {}))
        if self.delay_next:
            time.sleep(self.delay_next)
            self.delay_next = 0.0
        numel = sum(t.numel() for t in args[0])
        self.events.append(("allreduce", numel, time.perf_counter()))
        out = func(*args, **(kwargs or {}))
        self.works.append(dist.distributed_c10d.Work.unbox(out[-1]))
        return out


def train_on_rank(ddp_class, ddp_kwargs: dict, hidden_layers: int = 3, steps: int = STEPS) -> dict:
    """Inside a rank: the learner's class on TiedNet(seed=rank), then torch's DDP on the same shards."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = TiedNet(seed=rank, hidden_layers=hidden_layers)
    events, works = [], []
    names = [name for name, _ in trainable(model)]
    for index, (_, param) in enumerate(trainable(model)):
        def ready(param, index=index):  # runs before the learner's hook on the same tensor
            in_flight = sum(not work.is_completed() for work in works)
            events.append(("ready", index, time.perf_counter(), in_flight))
        param.register_post_accumulate_grad_hook(ready)
    wrapped = ddp_class(model, **ddp_kwargs)
    after_construction = state_vector(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    per_step, weights = [], []
    for step, (X, y) in enumerate(batches(steps)):
        events.clear()
        works.clear()
        X_local, y_local = shard(X, y, rank, world_size)
        with WatchAllReduces(events, works) as watch:
            if step == DELAYED_STEP and rank == world_size - 1:
                watch.delay_next = DELAY_S
            loss = F.cross_entropy(wrapped(X_local), y_local)
            loss.backward()
            events.append(("returned", time.perf_counter()))
            wrapped.finish_gradient_sync()
            events.append(("synced", time.perf_counter(), sum(not w.is_completed() for w in works)))
        for work in works:
            work.wait()  # a rank that forgot to wait must not leave one in flight into torch's DDP
        optimizer.step()
        optimizer.zero_grad()
        per_step.append(list(events))
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
    return dict(after_construction=after_construction, steps=per_step, weights=weights,
                names=names, torch_ddp=_torch_ddp(rank, world_size, hidden_layers, steps))


def _torch_ddp(rank: int, world_size: int, hidden_layers: int, steps: int) -> list:
    model = nn.parallel.DistributedDataParallel(TiedNet(seed=rank, hidden_layers=hidden_layers))
    return train_on_shards(model, torch.optim.SGD(model.parameters(), lr=LR), batches(steps), rank,
                           world_size, lambda: parameters_to_vector(model.module.parameters()).detach().clone())


def train_on_shards(model, optimizer, global_batches, rank: int, world_size: int, snapshot) -> list:
    """One step per global batch, on this rank's shard of it; [snapshot() after each step]."""
    after = []
    for X, y in global_batches:
        X_local, y_local = shard(X, y, rank, world_size)
        optimizer.zero_grad()
        F.cross_entropy(model(X_local), y_local).backward()
        optimizer.step()
        after.append(snapshot())
    return after


def close(a, b) -> bool:
    """Weights equal up to float32 summation order across ranks."""
    return torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def parameter_sizes(hidden_layers: int = 3) -> list:
    """[(name, numel)] of TiedNet's trainable parameters, in registration order."""
    return [(name, p.numel()) for name, p in trainable(TiedNet(hidden_layers=hidden_layers))]
