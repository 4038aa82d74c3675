"""Lesson 08 graders: the pitfalls clinic's fixes, each launched on 2 ranks with a short timeout.

- a collective on every rank: log_mean_loss returns the mean over all ranks on every rank, and
  only rank 0 prints it (the printed number is that mean; stdout or stderr, as print allows).
- the unused branch: three DDP steps with wrap_model train like one process on the global batch.
- a new order every epoch: each epoch, the ranks together see every index once, in a new order.
- rank 0 saves, everyone waits: only rank 0 calls torch.save, and every rank can load the file
  as soon as save_checkpoint returns.

A grader fails on the broken snippet (a hang, a crash, or a silently wrong result) and on the
half-fixes in WRONG_ANSWERS; the reference fixes are in course_lib.topics.pitfalls.
"""
import contextlib
import io
import os
import re
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from . import expect, expect_close, expect_equal, grader, wrong_answer
from ..topics import pitfalls
from ..training.data import make_dataset
from ..runtime.shared.env import device_for_rank
from ..runtime.launcher.launch import DistributedRunError, launch
from ..training.models import make_model_with_unused_branch

LAUNCH_TIMEOUT_S = 20   # a correct answer takes well under a second; past this, it hangs
WORLD_SIZE = 2
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _launch(fn, what: str, hint: str):
    """Every rank's result of `fn`; a stub, a crash or a hang becomes the learner's message."""
    import torch._dynamo  # noqa: F401  DDP imports it on first use; here once, not in every rank

    try:
        return launch(fn, nprocs=WORLD_SIZE, timeout=LAUNCH_TIMEOUT_S, output="none")
    except DistributedRunError as error:
        if "NotImplementedError" in str(error):
            raise NotImplementedError(what) from None
        got = pitfalls.diagnosis(error, max_lines=2)
        expect(False, what, "every rank to finish", got[:600], hint)


# -- exercise 1: a collective on every rank -----------------------------------------------------

def _mean_loss_on_rank(log_mean_loss):
    rank = dist.get_rank()
    loss = torch.tensor(float(rank + 1), device=device_for_rank())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        mean = log_mean_loss(loss)
    return float(mean), printed.getvalue()


def _numbers_in(text: str) -> list:
    return [float(number) for number in NUMBER.findall(text)]


@grader("a collective on every rank")
def check_log_mean_loss(log_mean_loss):
    results = _launch(lambda: _mean_loss_on_rank(log_mean_loss), "log_mean_loss on 2 ranks",
                      "every rank must call dist.all_reduce; only the print is rank 0's")
    expected = sum(range(1, WORLD_SIZE + 1)) / WORLD_SIZE
    expect_close([mean for mean, _ in results], [expected] * WORLD_SIZE,
                 "the mean loss each rank returns (rank r's loss is r + 1)",
                 hint="divide the all-reduced sum by the world size on every rank, not only on rank 0")
    expect(results[0][1].strip() != "", "rank 0's output", "one line with the mean loss",
           "nothing", "rank 0 still prints the mean")
    expect(any(abs(number - expected) < 1e-3 for number in _numbers_in(results[0][1])),
           "the number rank 0 prints", f"the mean over the ranks, {expected}",
           repr(results[0][1].strip()[:80]),
           "print the all-reduced mean, not rank 0's own loss nor the sum")
    expect_equal(results[1][1], "", "rank 1's output",
                 hint="print only where dist.get_rank() == 0")


def _sums_and_prints_everywhere(loss):
    dist.all_reduce(loss)
    print(f"mean loss {loss.item() / dist.get_world_size():.4f}")
    return loss


def _divides_on_rank0_only(loss):
    dist.all_reduce(loss)
    if dist.get_rank() == 0:
        loss = loss / dist.get_world_size()
        print(f"mean loss {loss.item():.4f}")
    return loss


def _reduces_to_rank0(loss):
    dist.reduce(loss, dst=0)
    loss = loss / dist.get_world_size()
    if dist.get_rank() == 0:
        print(f"mean loss {loss.item():.4f}")
    return loss


def _prints_its_own_loss(loss):
    mean = loss.clone()
    dist.all_reduce(mean)
    mean /= dist.get_world_size()
    if dist.get_rank() == 0:
        print(f"mean loss {loss.item():.4f}")  # rank 0's own loss, not the mean
    return mean


def _prints_the_sum(loss):
    total = loss.clone()
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        print(f"mean loss {total.item():.4f}")
    return total / dist.get_world_size()


# -- exercise 2: the model with an unused branch ------------------------------------------------

STEPS, BATCH_PER_RANK, LR = 3, 8, 0.1


def _batches(rank: int):
    X, y = make_dataset(n_samples=STEPS * BATCH_PER_RANK * WORLD_SIZE, seed=1).tensors
    X, y = X.view(STEPS, WORLD_SIZE, BATCH_PER_RANK, -1), y.view(STEPS, WORLD_SIZE, BATCH_PER_RANK)
    return [(X[step, rank], y[step, rank]) for step in range(STEPS)]


def _train_on_rank(wrap_model):
    rank, device = dist.get_rank(), device_for_rank()
    model = make_model_with_unused_branch(seed=0).to(device)
    wrapped = wrap_model(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=LR)
    for X, y in _batches(rank):
        optimizer.zero_grad()
        F.cross_entropy(wrapped(X.to(device)), y.to(device)).backward()
        optimizer.step()
    return {name: tensor.cpu() for name, tensor in model.body.state_dict().items()}


def _reference_body():
    """One process on the whole global batch: what averaged gradients must give."""
    model = make_model_with_unused_branch(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    per_rank = [_batches(rank) for rank in range(WORLD_SIZE)]
    for step in range(STEPS):
        X = torch.cat([per_rank[rank][step][0] for rank in range(WORLD_SIZE)])
        y = torch.cat([per_rank[rank][step][1] for rank in range(WORLD_SIZE)])
        optimizer.zero_grad()
        F.cross_entropy(model(X), y).backward()
        optimizer.step()
    return model.body.state_dict()


@grader("the unused branch")
def check_wrap_model(wrap_model):
    results = _launch(lambda: _train_on_rank(wrap_model), "3 DDP steps with wrap_model",
                      "DDP must be told about parameters the loss never reaches")
    reference = _reference_body()
    for rank, body in enumerate(results):
        for name, tensor in reference.items():
            expect_close(body[name], tensor, f"rank {rank}'s body.{name} after 3 steps",
                         hint="the ranks must average gradients: wrap the model in DDP "
                              "(with find_unused_parameters=True or static_graph=True)",
                         rtol=1e-4, atol=1e-6)


def _no_ddp(model):
    return model


def _deletes_after_wrapping(model):
    wrapped = DDP(model)
    del model.unused_head  # too late: DDP already expects a gradient for it
    return wrapped


# -- exercise 3: set_epoch ----------------------------------------------------------------------

N_INDICES, EPOCHS = 20, 3


@grader("a new order every epoch")
def check_indices_per_epoch(indices_per_epoch):
    dataset = TensorDataset(torch.arange(N_INDICES))
    results = _launch(lambda: indices_per_epoch(dataset, epochs=EPOCHS, batch_size=4),
                      "indices_per_epoch on 2 ranks", "give each rank a DistributedSampler")
    every_index = list(range(N_INDICES))
    for epoch in range(EPOCHS):
        seen = [per_rank[epoch] for per_rank in results]
        expect_equal(sorted(seen[0] + seen[1]), every_index,
                     f"the indices ranks 0 and 1 see together in epoch {epoch}",
                     hint="each sample once per epoch, on one rank: a DistributedSampler shards")
    orders = [tuple(results[0][epoch]) for epoch in range(EPOCHS)]
    expect(len(set(orders)) == EPOCHS, "rank 0's order in each epoch",
           f"{EPOCHS} different orders", f"{len(set(orders))} different: {orders[0][:6]}...",
           "call sampler.set_epoch(epoch) at the start of each epoch, before iterating")


def _sets_epoch_after_the_epoch(dataset, epochs=3, batch_size=4):
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    seen = []
    for epoch in range(epochs):
        seen.append([i for (batch,) in loader for i in batch.tolist()])
        sampler.set_epoch(epoch)
    return seen


def _shuffles_without_sharding(dataset, epochs=3, batch_size=4):
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
    return [[i for (batch,) in loader for i in batch.tolist()] for _ in range(epochs)]


# -- exercise 4: rank 0 saves, everyone waits ---------------------------------------------------

SLOW_DISK_S = 1.0  # rank 0's save takes this long, as on a busy shared file system


def _save_then_load_on_rank(save_checkpoint, path):
    rank, real_save, calls = dist.get_rank(), torch.save, []

    def slow_save(obj, f, *args, **kwargs):
        calls.append(rank)
        if rank == 0:
            time.sleep(SLOW_DISK_S)
        return real_save(obj, f, *args, **kwargs)

    torch.save = slow_save  # this rank's process only; it ends with the run
    model = make_model_with_unused_branch(seed=0).to(device_for_rank())
    save_checkpoint(model, path)
    try:
        state = torch.load(path, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - what the learner needs to hear
        return len(calls), f"{type(error).__name__}: {str(error).replace(path, 'model.pt')}"
    same = isinstance(state, dict) and all(
        torch.equal(state.get(name, torch.empty(0)).cpu(), tensor.cpu())
        for name, tensor in model.state_dict().items())
    return len(calls), "loaded" if same else "loaded something other than model.state_dict()"


@grader("rank 0 saves, everyone waits")
def check_save_checkpoint(save_checkpoint):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "model.pt")
        results = _launch(lambda: _save_then_load_on_rank(save_checkpoint, path),
                          "save_checkpoint on 2 ranks",
                          "a barrier only works when every rank reaches it")
    expect_equal([saves for saves, _ in results], [1, 0], "torch.save calls on ranks 0 and 1",
                 hint="save only where dist.get_rank() == 0")
    expect_equal([loaded for _, loaded in results], ["loaded"] * WORLD_SIZE,
                 "loading the checkpoint on each rank right after save_checkpoint returns",
                 hint="after rank 0's torch.save, every rank must wait at dist.barrier()")


def _saves_without_barrier(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)


def _barrier_before_saving(model, path):
    dist.barrier()
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)


def _barrier_on_rank0_only(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
        dist.barrier()


WRONG_ANSWERS = {
    check_log_mean_loss: [
        wrong_answer("the broken snippet: all_reduce on rank 0 only", pitfalls.log_mean_loss_broken),
        wrong_answer("all_reduce everywhere, but every rank prints", _sums_and_prints_everywhere),
        wrong_answer("divides by world_size on rank 0 only", _divides_on_rank0_only),
        wrong_answer("dist.reduce to rank 0: other ranks get no mean", _reduces_to_rank0),
        wrong_answer("returns the mean, but rank 0 prints its own loss", _prints_its_own_loss),
        wrong_answer("returns the mean, but rank 0 prints the sum", _prints_the_sum),
    ],
    check_wrap_model: [
        wrong_answer("the broken snippet: plain DDP", pitfalls.wrap_model_broken),
        wrong_answer("no DDP at all: each rank trains alone", _no_ddp),
        wrong_answer("deletes the branch after wrapping", _deletes_after_wrapping),
    ],
    check_indices_per_epoch: [
        wrong_answer("the broken snippet: no set_epoch", pitfalls.indices_per_epoch_broken),
        wrong_answer("set_epoch after the epoch's loop", _sets_epoch_after_the_epoch),
        wrong_answer("DataLoader(shuffle=True) without a DistributedSampler",
                     _shuffles_without_sharding),
    ],
    check_save_checkpoint: [
        wrong_answer("the broken snippet: every rank saves", pitfalls.save_checkpoint_broken),
        wrong_answer("rank 0 saves, no barrier", _saves_without_barrier),
        wrong_answer("barrier before saving", _barrier_before_saving),
        wrong_answer("barrier inside `if rank == 0`", _barrier_on_rank0_only),
    ],
}
