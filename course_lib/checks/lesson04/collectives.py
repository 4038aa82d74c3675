"""Lesson 04, exercises 1 and 2: DDP's two collectives, the broadcast of the parameters at
construction and the all-reduce of the gradients at every step, each run on gloo ranks.

- broadcast the parameters: run on 3 ranks (2 would let a copy to rank 1 only pass) that each start
  from another model with BatchNorm buffers (running statistics that differ per rank) and a frozen
  parameter; afterwards every rank's parameters and buffers equal rank 0's initial ones, rank 0
  keeps its own, and the model's parameters are the same objects as before (an optimizer built on
  them still works). Any way of copying from rank 0 (broadcast, broadcast_object_list,
  load_state_dict, ...).
- DDP by hand: on 3 ranks (2 would let a hard-coded 2 pass), the weights after each of 4 steps
  equal torch's DDP's and one process's on the global batch, on every rank: the gradients
  averaged over the ranks, whatever collective does it; each rank returns its own shard's loss.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from ..engine import expect, grader
from ..engine.boundary import grading_seed
from ..engine.oracle import close, large_batch_sgd
from ..engine.ranks import run_on_ranks
from ..engine.replicas import gradient_scale
from ...training.data import make_dataset
from ...training.models import make_model, make_model_with_batchnorm

LAUNCH_TIMEOUT_S = 90
BROADCAST_WORLD_SIZE = 3     # 2 would let rank 0 send to rank 1 only
BROADCAST_SEED = 100         # rank r builds its model with seed BROADCAST_SEED + r
BY_HAND_WORLD_SIZE = 3
BY_HAND_DATA_SEED = 1        # the global batches' seed in a notebook (grading_seed shifts it)
STEPS, GLOBAL_BATCH_SIZE, LR = 4, 24, 0.5  # 8 samples per rank per step
SAME_COLLECTIVES = ("every rank must call the same collectives, in the same order, with tensors "
                    "of the same shape")


def _run_on_ranks(fn, *args, nprocs: int, what: str):
    """fn(*args) on `nprocs` quiet gloo ranks; a crash, a hang or a stub is explained."""
    return run_on_ranks(fn, *args, nprocs=nprocs, what=what, timeout=LAUNCH_TIMEOUT_S,
                        hang_hint=SAME_COLLECTIVES, crash_hint=_crash_hint)


def _crash_hint(cause) -> str:
    if any(word in cause.summary for word in ("gloo", "Connection", "NCCL")):
        return SAME_COLLECTIVES  # a peer left: the ranks did not call the same collectives
    return "the error is raised in your function: fix it, run its cell again, then the check"


# -- exercise 1: the broadcast at construction ---------------------------------------------------

def broadcast_test_model(rank: int, seed: int = BROADCAST_SEED):
    """Rank `rank`'s model before the broadcast: its own weights (seed + rank), BatchNorm running
    statistics of its own (as if it had trained rank + 1 steps on data of its own), the first bias
    frozen. The grader's `seed` is grading_seed(BROADCAST_SEED): BROADCAST_SEED in a notebook."""
    model = make_model_with_batchnorm(seed=seed + rank)
    model[0].bias.requires_grad_(False)
    norm = model[1]
    with torch.no_grad():
        norm.running_mean.copy_(torch.linspace(-1, 1, len(norm.running_mean)) + rank)
        norm.running_var.fill_(1.0 + rank)
        norm.num_batches_tracked.fill_(rank + 1)
    return model


def _state(model) -> dict:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def _broadcast_on_rank(broadcast_parameters, seed):
    """The model's state after the learner's broadcast, and the ids of its parameter objects
    before and after it (the grader compares them; `before` keeps the old ones alive)."""
    model = broadcast_test_model(dist.get_rank(), seed)
    before = list(model.parameters())
    broadcast_parameters(model)
    return _state(model), [id(p) for p in before], [id(p) for p in model.parameters()]


@grader("broadcast the parameters")
def check_broadcast_parameters(broadcast_parameters):
    what = f"broadcast_parameters(model) on {BROADCAST_WORLD_SIZE} ranks"  # no input to draw
    seed = grading_seed(BROADCAST_SEED)
    results = _run_on_ranks(_broadcast_on_rank, broadcast_parameters, seed,
                            nprocs=BROADCAST_WORLD_SIZE, what=what)
    initial = [_state(broadcast_test_model(rank, seed)) for rank in range(BROADCAST_WORLD_SIZE)]
    buffers = {name for name, _ in broadcast_test_model(0).named_buffers()}
    frozen = {name for name, p in broadcast_test_model(0).named_parameters() if not p.requires_grad}
    for rank, (state, ids_before, ids_after) in enumerate(results):
        same_objects = ids_before == ids_after
        differ = [name for name, tensor in initial[0].items() if not torch.equal(state[name], tensor)]
        if differ:
            own = [name for name in differ if torch.equal(state[name], initial[rank][name])]
            agree = all(torch.equal(result[0][name], results[1][0][name])
                        for result in results[1:] for name in differ)
            if rank == 0:
                hint = (f"rank 0's own {', '.join(differ)} changed: rank 0 is the source, its "
                        "values must stay as they were")
            elif own and set(own) <= buffers:
                hint = (f"rank {rank}'s buffers {', '.join(own)} still hold its own values: DDP "
                        "makes every rank's buffers (BatchNorm's running statistics) rank 0's too")
            elif own and set(own) <= frozen:
                hint = (f"rank {rank}'s frozen {', '.join(own)} still holds its own values: DDP "
                        "makes every parameter rank 0's, trainable or not")
            elif own:
                verb = "holds" if len(own) == 1 else "hold"
                hint = f"rank {rank}'s {', '.join(own)} still {verb} its own values, not rank 0's"
            elif agree:
                hint = ("the ranks agree with each other, but not on rank 0's values: they must "
                        "become rank 0's, not a mix of every rank's")
            else:
                hint = f"rank {rank}'s {', '.join(differ)} hold neither its own values nor rank 0's"
            expect(False, f"rank {rank}'s model after {what}",
                   "rank 0's initial parameters and buffers", f"{len(differ)} of "
                   f"{len(initial[0])} tensors differ ({', '.join(differ)[:80]})", hint)
        expect(same_objects, f"rank {rank}'s parameters after {what}",
               "the model's own parameter objects, holding rank 0's values",
               "new parameter objects", "an optimizer built on the model before the broadcast "
               "holds the old parameters and would update those: change the values of the "
               "parameters the model has")


# -- exercise 2: DDP by hand ---------------------------------------------------------------------

def _batches(seed=BY_HAND_DATA_SEED):
    """STEPS global batches of the course data, as (X, y) pairs; the grader's `seed` is
    grading_seed(BY_HAND_DATA_SEED), the same in a notebook."""
    X, y = make_dataset(STEPS * GLOBAL_BATCH_SIZE, seed=seed).tensors
    return list(zip(X.split(GLOBAL_BATCH_SIZE), y.split(GLOBAL_BATCH_SIZE)))


def _by_hand_on_rank(train_step_by_hand, seed):
    """Train with the learner's step and, side by side on the same shards, with torch's DDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = make_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    ddp_model = DDP(make_model(seed=0))
    ddp_optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LR)
    losses, weights, ddp_weights = [], [], []
    for X, y in _batches(seed):
        X_local, y_local = X[rank::world_size], y[rank::world_size]  # as DistributedSampler deals
        loss = train_step_by_hand(model, optimizer, X_local, y_local)
        try:
            losses.append(float(loss))
        except (TypeError, ValueError, RuntimeError):
            losses.append(None)  # the grader says what to return
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
        ddp_optimizer.zero_grad()
        F.cross_entropy(ddp_model(X_local), y_local).backward()
        ddp_optimizer.step()
        ddp_weights.append(parameters_to_vector(ddp_model.parameters()).detach().clone())
    return losses, weights, ddp_weights


@grader("DDP by hand")
def check_train_step_by_hand(train_step_by_hand):
    what = f"train_step_by_hand on {BY_HAND_WORLD_SIZE} ranks"
    # first, so that the ranks fork with torch.optim's imports done (seconds each otherwise)
    seed = grading_seed(BY_HAND_DATA_SEED)
    single_losses, single_weights = large_batch_sgd(_batches(seed), LR)
    # torch's DDP ran beside the learner's step on the same shards: its weights come back raw
    # and are compared here, as the learner's are
    results = _run_on_ranks(_by_hand_on_rank, train_step_by_hand, seed, nprocs=BY_HAND_WORLD_SIZE,
                            what=what)
    for step in range(STEPS):
        before, after = single_weights[step], single_weights[step + 1]
        for rank, (_, weights, ddp_weights) in enumerate(results):
            expect(close(ddp_weights[step], after), f"torch's DDP on rank {rank} at step {step}",
                   "the single-process weights", "other weights",
                   "this machine's DDP disagrees with one process; please report it")
            got = weights[step]
            if close(got, after):
                continue
            others = [r for r in range(len(results)) if not close(results[r][1][step], got)]
            scale = gradient_scale(got - before, after - before)
            if others:
                hint = (f"rank {rank}'s weights after step {step} differ from rank {others[0]}'s: "
                        "each rank stepped with its own gradient, not the same average")
            elif scale is not None and abs(scale) < 1e-6:
                hint = f"the weights did not change at step {step}"
            elif scale is not None:
                hint = (f"every rank's update at step {step} is {scale:.3g} times DDP's: the "
                        f"gradient DDP steps with is the mean of the {len(results)} ranks' "
                        "gradients")
            else:
                hint = (f"the ranks agree, but their update at step {step} points elsewhere than "
                        "DDP's: it is not the mean of the ranks' gradients")
            expect(False, f"rank {rank}'s weights after step {step}",
                   "the weights of torch's DDP (and of one process on the whole batch)",
                   f"weights off by up to {(got - after).abs().max().item():.2e}", hint)
        returned = [losses[step] for losses, _, _ in results]
        expect(None not in returned, f"what train_step_by_hand returns at step {step}",
               "this rank's loss, a number", "something that is not a number (e.g. None)",
               "the step returns this rank's loss as a number")
        mean_loss = sum(returned) / len(returned)
        expect(abs(mean_loss - single_losses[step]) <= 1e-4 * abs(single_losses[step]) + 1e-6,
               f"the ranks' mean loss at step {step}", f"{single_losses[step]:.6f}",
               f"{mean_loss:.6f}", "each rank returns the loss of its own shard, before the step")
