"""A learner's training step on each rank's shard of the global batches, recorded step by step
for graders to hold against one process on the whole global batches (engine/oracle.py).

Each rank trains make_model(seed=0) with plain SGD on every world_size-th sample of each global
batch (PER_RANK samples a rank), as DistributedSampler deals them, on TRAINED_WORLD ranks; the
rank-side functions return what the grader compares, as plain data (engine/boundary.py), and the
comparisons are made in the grader's process. The
global batches come from make_dataset(seed=data_seed): the grader passes grading_seed(DATA_SEED)
to the ranks and to the oracle alike.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector

from ..engine import expect
from ..engine.oracle import close
from ...topics.traffic import count_traffic
from ...training.data import make_dataset
from ...training.models import make_model

WORLD_SIZE = 2
TRAINED_WORLD = 3  # exercises 3 and 4 train on 3 ranks: a mean written as "/ 2" shows
STEPS, PER_RANK, LR = 4, 16, 0.5
DATA_SEED = 1


def batches(steps=STEPS, seed=DATA_SEED, world_size=WORLD_SIZE):
    size = PER_RANK * world_size  # the global batch
    X, y = make_dataset(steps * size, seed=seed).tensors
    return list(zip(X.split(size), y.split(size)))


def train_on_rank(step_fn, wrap, data_seed=DATA_SEED):
    """Four steps of step_fn on this rank's shard of each global batch: what it returned, the
    weights after each step, the loss of this rank's shard before each step, and the optimizer's
    learning rates at the end (numbers, or their text when they are none)."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = make_model(seed=0)
    trained = DDP(model) if wrap else model
    optimizer = torch.optim.SGD(trained.parameters(), lr=LR)
    returned, weights, own = [], [], []
    for X, y in batches(seed=data_seed, world_size=world_size):
        X_local, y_local = X[rank::world_size], y[rank::world_size]  # as DistributedSampler deals
        with torch.no_grad():
            own.append(F.cross_entropy(model(X_local), y_local).item())
        value = step_fn(trained, optimizer, X_local, y_local)
        returned.append((numbers([value]) or [None])[0])
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
    rates = [group["lr"] for group in optimizer.param_groups]
    return returned, weights, own, numbers(rates) or repr(rates)


def expect_trained_like_one_process(results, single_weights, what, hint_of):
    for rank, (*_, rates) in enumerate(results):
        expect(rates == [LR], f"the optimizer's learning rate on rank {rank} after {what}",
               f"{LR}, as the caller set it", str(rates),
               "the step the caller configured stays as it is: what differs from one process is "
               "the gradients, not the learning rate")
    for step in range(STEPS):
        before, after = single_weights[step], single_weights[step + 1]
        for rank, (_, weights, _, _) in enumerate(results):
            got = weights[step]
            if not close(got, after):
                ranks_differ = not close(results[0][1][step], results[1][1][step])
                expect(False, f"rank {rank}'s weights after step {step} of {what}",
                       "one process's on the whole global batch",
                       f"weights off by up to {(got - after).abs().max().item():.2e}",
                       hint_of(ranks_differ, got - before, after - before))


def wrapped_on_rank(wrap_for_ddp, steps: int, counted_steps: int, data_seed=DATA_SEED):
    """The weights after `steps` steps of the model wrap_for_ddp returns, the collectives of the
    last `counted_steps` steps (of it, and of plain DDP's), and its find_unused_parameters and
    static_graph settings (the grader decides whether it searches for unused parameters)."""
    rank = dist.get_rank()
    counts = {}
    for name, wrap in (("yours", wrap_for_ddp), ("plain", DDP)):
        model = make_model(seed=0)
        trained = wrap(model)
        optimizer = torch.optim.SGD(trained.parameters(), lr=LR)
        for number, (X, y) in enumerate(batches(steps, data_seed)):
            with count_traffic() as traffic:
                optimizer.zero_grad()
                F.cross_entropy(trained(X[rank::WORLD_SIZE]), y[rank::WORLD_SIZE]).backward()
                optimizer.step()
            if number >= steps - counted_steps:
                counts[name] = counts.get(name, 0) + len(traffic.collectives)
        if name == "yours":
            weights = parameters_to_vector(model.parameters()).detach().clone()
            settings = {name: bool(getattr(trained, name, False))
                        for name in ("find_unused_parameters", "static_graph")}
    return weights, counts, settings


def numbers(values) -> list:
    """A returned tuple of numbers (or 0-d tensors) as floats; None where it is not one."""
    try:
        return [float(value) for value in values]
    except (TypeError, ValueError, RuntimeError):
        return None
