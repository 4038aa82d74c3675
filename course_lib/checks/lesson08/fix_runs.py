"""Lesson 08's fixes run on 2 gloo ranks (3 for the log line and the sampler): each function here runs inside a rank with the learner's
fix and sends back plain values for the graders (a mean and what was printed, trained weights, a
save's count, timing and what was loaded); a stub, a crash or a hang becomes a verdict."""
import contextlib
import io
import time
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..engine import expect
from ..engine.call_watch import calls_of
from ..engine.learner_call import library_call_hint
from ..engine.observations import as_plain
from ..engine.ranks import run_on_ranks
from ...runtime.shared.env import device_for_rank
from ...topics import pitfalls
from ...training.data import make_dataset
from ...training.models import make_model_with_unused_branch

LAUNCH_TIMEOUT_S = 20   # a correct answer takes well under a second; past this, it hangs
WORLD_SIZE = 2
WIDER_WORLD = 3  # the log line and the sampler run here: a 2 written into the fix shows
READ_THE_RUN = "read the broken run's diagnosis again: where did each rank wait, or fail?"


def run_fix(fn, what: str, hang_hint: str = READ_THE_RUN, nprocs: int = WORLD_SIZE):
    """Every rank's result of fn(); a stub, a crash or a hang becomes the learner's verdict, and
    so does a call of the course's own fix (pitfalls.py's, which the notebook runs after each
    exercise): the exercise is to write the fix."""
    import torch._dynamo  # noqa: F401  DDP imports it on first use; here once, not in every rank

    results = run_on_ranks(_watched, fn, nprocs=nprocs, what=what, hang_hint=hang_hint,
                           timeout=LAUNCH_TIMEOUT_S)
    called = [name for result in results for name in result["course_fixes"]]
    name = f"course_lib.topics.pitfalls.{called[0]}" if called else ""
    expect(not called, what, "your own fix", f"a call of {name}",
           library_call_hint(name, "the exercise"))
    return [result["result"] for result in results]


def _watched(fn):
    """Inside a rank: fn()'s result and the names of the course's fixes it called."""
    fixes = (pitfalls.log_mean_loss, pitfalls.wrap_model, pitfalls.indices_per_epoch,
             pitfalls.save_checkpoint)
    with calls_of(*fixes) as called:
        result = fn()
    return {"result": result, "course_fixes": sorted(set(called))}


# -- exercise 1: the log line -------------------------------------------------------------------

def loss_of_rank(rank: int, shift: int) -> float:
    """Rank r's loss in the log line's run: r + 1, shifted by the grading seed's `shift`."""
    return float(rank + 1 + shift)


def mean_loss_on_rank(log_mean_loss, shift):
    rank = dist.get_rank()
    loss = torch.tensor(loss_of_rank(rank, shift), device=device_for_rank())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        mean = log_mean_loss(loss)
    dist.barrier()  # the step goes on after logging, as in the broken run
    return float(mean), printed.getvalue()


# -- exercise 2: the second step ----------------------------------------------------------------

STEPS, BATCH_PER_RANK, LR = 3, 8, 0.1


def batches(rank: int, seed: int):
    X, y = make_dataset(n_samples=STEPS * BATCH_PER_RANK * WORLD_SIZE, seed=seed).tensors
    X, y = X.view(STEPS, WORLD_SIZE, BATCH_PER_RANK, -1), y.view(STEPS, WORLD_SIZE, BATCH_PER_RANK)
    return [(X[step, rank], y[step, rank]) for step in range(STEPS)]


def train_on_rank(wrap_model, seed):
    rank, device = dist.get_rank(), device_for_rank()
    model = make_model_with_unused_branch(seed=0).to(device)
    wrapped = wrap_model(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=LR)
    for X, y in batches(rank, seed):
        optimizer.zero_grad()
        F.cross_entropy(wrapped(X.to(device)), y.to(device)).backward()
        optimizer.step()
    return {name: tensor.cpu() for name, tensor in model.body.state_dict().items()}


def reference_body(seed):
    """One process on the whole global batch: what averaged gradients must give."""
    model = make_model_with_unused_branch(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    per_rank = [batches(rank, seed) for rank in range(WORLD_SIZE)]
    for step in range(STEPS):
        X = torch.cat([per_rank[rank][step][0] for rank in range(WORLD_SIZE)])
        y = torch.cat([per_rank[rank][step][1] for rank in range(WORLD_SIZE)])
        optimizer.zero_grad()
        F.cross_entropy(model(X), y).backward()
        optimizer.step()
    return model.body.state_dict()


# -- exercise 3: every epoch the same -----------------------------------------------------------

def indices_on_rank(indices_per_epoch, dataset, epochs, batch_size):
    """The indices of each epoch on this rank, as plain data."""
    return as_plain(indices_per_epoch(dataset, epochs=epochs, batch_size=batch_size))


# -- exercise 4: the checkpoint the others read --------------------------------------------------

RANK0_LATE_S = 0.3  # rank 0 reaches save_checkpoint this much after the others


def save_then_load_on_rank(save_checkpoint, path, seconds, model_seed):
    """(torch.save calls, what this rank loads right after save_checkpoint returns: {"state": the
    state dict} or {"error": what the load raised}, when it returned, when rank 0's save ended);
    the grader compares the state with the model's."""
    rank, calls = dist.get_rank(), []
    model = make_model_with_unused_branch(seed=model_seed).to(device_for_rank())
    dist.barrier()  # the ranks start together, and rank 0 a little later: the others find last
    if rank == 0:   # epoch's file first, as on a cluster where rank 0 also logs before it saves
        time.sleep(RANK0_LATE_S)
    with pitfalls.slow_disk(seconds) as saves_ended:
        slow_save = torch.save

        def counted_save(obj, f, *args, **kwargs):
            calls.append(rank)
            return slow_save(obj, f, *args, **kwargs)

        with mock.patch.object(torch, "save", counted_save):
            save_checkpoint(model, path)
    returned = time.perf_counter()
    try:
        state = torch.load(path, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - what the learner needs to hear
        loaded = {"error": f"{type(error).__name__}: {str(error).replace(path, 'model.pt')[:120]}"}
    else:
        loaded = {"state": as_plain(dict(state)) if isinstance(state, dict) else repr(state)[:120]}
    dist.barrier()  # nobody leaves (and the folder stays) until every rank has loaded
    return len(calls), loaded, returned, saves_ended[-1] if saves_ended else None
