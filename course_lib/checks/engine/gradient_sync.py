"""Running a learner's DDP class on ranks and watching how it syncs the gradients (lesson 15).

Each rank builds TiedNet with its own seed (so the broadcast at construction matters), wraps it in
the learner's class, trains a few steps on its shard of each global batch, and returns its weights
and, per step, what it saw, in order: each gradient becoming ready (the grader's own
post-accumulate-grad hook, registered before the learner's, so it runs first), each all-reduce
the rank started (seen below the Python API, where every torch.distributed call ends in a c10d
operator, as lesson 03's count_traffic counts), and backward() returning, with how many of them
were still in flight then. Nothing is called after backward(): as with torch's DDP, the learner's
class waits inside it (its finish_gradient_sync, queued with the autograd engine's queue_callback
by the lesson's given queue_finish, runs once backward's graph is done, before backward returns).
The same rank then trains torch's own DDP on the same shards, for comparison.

On the last rank, one step's first all-reduce starts DELAY_S late: on every other rank that
all-reduce cannot finish before then, which shows whether a rank goes on computing while it is in
flight (overlap) and whether it waits for it before the optimizer step.

An all-reduce counts as done once its Future is: that is what a learner's wait sees, whether it
waits on the Work (work.wait()) or on its Future (fut.wait(), torch.futures.wait_all). gloo marks
the Work completed only after it has completed the Future (ProcessGroupGloo.cpp, finishWorkGloo:
returnFutureWithOutput, then finish()), so is_completed() can still say False after fut.wait().
At the end of each step the rank also counts what is left of the previous step's all-reduces:
a class that keeps its handles after waiting for them holds every step's, for the whole run.
"""
import gc
import time
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector
from torch.utils._python_dispatch import TorchDispatchMode

from .call_watch import calls_of

VOCAB, WIDTH = 12, 16
STEPS, GLOBAL_BATCH_SIZE, LR = 3, 12, 0.2   # 12 samples split evenly over 2 or 3 ranks
DATA_SEED = 15  # the batches' seed; a grader passes boundary.grading_seed(DATA_SEED)
DELAYED_STEP, DELAY_S = 1, 0.4


class TiedNet(nn.Module):
    """The traps in one small model: a tied embedding, a frozen layer and a buffer.

    head.weight IS embed.weight (one Parameter, registered by two modules); `frozen` does not
    require grad; `scale` is a buffer (not a parameter) that the forward uses. `used_order`: the
    order the forward runs the hidden layers in (as registered by default); another order makes
    their gradients ready in an order that is not the reverse of registration.
    """

    def __init__(self, seed: int = 0, hidden_layers: int = 3, used_order=None):
        super().__init__()
        self.used_order = list(range(hidden_layers) if used_order is None else used_order)
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
        for index in self.used_order:
            x = torch.tanh(self.hidden[index](x))
        return self.head(torch.tanh(self.frozen(x)) * self.scale)


def trainable(model) -> list:
    """[(name, parameter)] that need a gradient, each tensor once, in registration order."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad]


def batches(steps: int = STEPS, seed: int = DATA_SEED):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (GLOBAL_BATCH_SIZE, 4), generator=generator),
             torch.randint(0, VOCAB, (GLOBAL_BATCH_SIZE,), generator=generator))
            for _ in range(steps)]


def shard(X, y, rank: int, world_size: int):
    return X[rank::world_size], y[rank::world_size]


def state_vector(model) -> torch.Tensor:
    """Every parameter (frozen too) and buffer, flattened: what the broadcast must make equal."""
    return torch.cat([t.detach().flatten() for t in [*model.parameters(), *model.buffers()]]).clone()


def one_process(steps: int = STEPS, hidden_layers: int = 3, optimizer=None,
                data_seed: int = DATA_SEED, used_order=None) -> list:
    """The oracle: TiedNet(seed=0) trained on each whole global batch (batches(steps, data_seed)),
    with SGD(lr=LR) or `optimizer(parameters)`; the weights after each step."""
    model = TiedNet(seed=0, hidden_layers=hidden_layers, used_order=used_order)
    optimizer = (optimizer or (lambda parameters: torch.optim.SGD(parameters, lr=LR)))(model.parameters())
    weights = []
    for X, y in batches(steps, data_seed):
        optimizer.zero_grad()
        F.cross_entropy(model(X), y).backward()
        optimizer.step()
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
    return weights


class WatchAllReduces(TorchDispatchMode):
    """Notes each all-reduce this rank starts (its element count) in `events` and its Work in
    `works` (and, when given, a list of weak references to the tensors it sends in `tensors`);
    can delay one."""

    def __init__(self, events: list, works: list, tensors: list = None):
        super().__init__()
        self.events, self.works, self.delay_next = events, works, 0.0
        self.tensors = [] if tensors is None else tensors

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.name() not in ("c10d::allreduce_", "c10d::allreduce_coalesced_"):
            return func(*args, **(kwargs or {}))
        if self.delay_next:
            time.sleep(self.delay_next)
            self.delay_next = 0.0
        numel = sum(t.numel() for t in args[0])
        self.events.append(("allreduce", numel, time.perf_counter()))
        out = func(*args, **(kwargs or {}))
        # the same Python object the learner's dist.all_reduce returns (pybind finds it registered)
        self.works.append(dist.distributed_c10d.Work.unbox(out[-1]))
        self.tensors.append([weakref.ref(t) for t in args[0]])
        return out


def in_flight(works) -> int:
    """How many of `works` are still running, as a learner's wait sees it: their Future not done."""
    return sum(not work.get_future().done() for work in works)


SETTLE_S = 0.2  # gloo's worker thread lets go of a finished Work a moment after completing it


def left_behind(previous: list, sent_now: list) -> int:
    """How many of the previous step's all-reduces something still holds now: their Work, or a
    tensor they sent that this step did not send again (a bucket's buffer, reused, is no leak).
    `previous`: per all-reduce, (a weak reference to its Work, to each tensor it sent);
    `sent_now`: per all-reduce of this step, weak references to its tensors. Waits up to SETTLE_S."""
    deadline = time.perf_counter() + SETTLE_S
    while True:
        gc.collect()
        again = {id(t) for refs in sent_now for t in (ref() for ref in refs) if t is not None}
        held = sum(work() is not None or any(ref() is not None and id(ref()) not in again
                                             for ref in tensors)
                   for work, tensors in previous)
        if not held or time.perf_counter() > deadline:
            return held
        time.sleep(0.01)


def train_on_rank(ddp_class, ddp_kwargs: dict, hidden_layers: int = 3, steps: int = STEPS,
                  written_by_you=(), data_seed: int = DATA_SEED, used_order=None) -> dict:
    """Inside a rank: the learner's class on TiedNet(seed=rank), then torch's DDP on the same shards
    (batches(steps, data_seed)). A call of any of `written_by_you` (the course's own answers) while
    the class is built comes back as {"library_calls": [their names]}, and nothing is trained.
    What it returns is what the rank saw (plain data, boundary.py); the grader compares it."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = TiedNet(seed=rank, hidden_layers=hidden_layers, used_order=used_order)
    events, works = [], []
    names = [name for name, _ in trainable(model)]
    for index, (_, param) in enumerate(trainable(model)):
        def ready(param, index=index):  # runs before the learner's hook on the same tensor
            events.append(("ready", index, time.perf_counter(), in_flight(works)))
        param.register_post_accumulate_grad_hook(ready)
    with calls_of(*written_by_you) as library_calls:
        wrapped = ddp_class(model, **ddp_kwargs)
    if library_calls:
        return {"library_calls": library_calls}
    after_construction = state_vector(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    per_step, weights, left, previous = [], [], [], None
    for step, (X, y) in enumerate(batches(steps, data_seed)):
        events.clear()
        works.clear()
        sent = []
        X_local, y_local = shard(X, y, rank, world_size)
        with WatchAllReduces(events, works, sent) as watch:
            if step == DELAYED_STEP and rank == world_size - 1:
                watch.delay_next = DELAY_S
            loss = F.cross_entropy(wrapped(X_local), y_local)
            loss.backward()  # the learner's finish_gradient_sync runs at its end (queue_finish)
            events.append(("returned", time.perf_counter(), in_flight(works)))
        for work in works:
            work.wait()  # a rank that forgot to wait must not leave one in flight into torch's DDP
        optimizer.step()
        optimizer.zero_grad()
        del loss
        if previous is not None:
            left.append(left_behind(previous, sent))
        previous = [(weakref.ref(work), tensors) for work, tensors in zip(works, sent)]
        works.clear()  # from here on only the learner's class can keep them alive
        per_step.append(list(events))
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
    return dict(after_construction=after_construction, steps=per_step, weights=weights,
                names=names, left_behind=left,
                torch_ddp=_torch_ddp(rank, world_size, hidden_layers, steps, data_seed, used_order))


def _torch_ddp(rank: int, world_size: int, hidden_layers: int, steps: int, data_seed: int,
               used_order=None) -> list:
    model = nn.parallel.DistributedDataParallel(TiedNet(seed=rank, hidden_layers=hidden_layers,
                                                        used_order=used_order))
    return train_on_shards(model, torch.optim.SGD(model.parameters(), lr=LR),
                           batches(steps, data_seed), rank, world_size,
                           lambda: parameters_to_vector(model.module.parameters()).detach().clone())


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
