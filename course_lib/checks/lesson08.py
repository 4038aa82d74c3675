"""Lesson 08 graders: the pitfalls clinic's four DIAGNOSE exercises, each fix run on 2 gloo ranks.

- the log line: log_mean_loss returns the mean over all ranks on every rank, and rank 0 alone
  prints it (the printed number is that mean; stdout or stderr, as print allows).
- the second step: three DDP steps of wrap_model's model train like one process, on both ranks.
- every epoch the same: each epoch, the ranks together see every index once; the order changes
  from epoch to epoch, and so does each rank's share (one permutation of the whole dataset).
- the checkpoint the others read: only rank 0 calls torch.save, on a slow shared disk (the file
  exists, torn, while rank 0 writes; an older checkpoint is there before); every rank loads the
  new weights as soon as save_checkpoint returns, and returns when rank 0's save ended, not a
  fixed time later: twice, with disks of two speeds.

Each grader fails the broken snippet (a hang, a crash, a wrong result), fixes of the symptom and
the half-fixes in WRONG_ANSWERS; the reference fixes are in course_lib.topics.pitfalls."""
import contextlib
import io
import os
import re
import tempfile
import time
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .engine import expect, expect_close, grader, wrong_answer
from .engine.ranks import run_on_ranks
from ..topics import pitfalls
from ..training.data import make_dataset
from ..runtime.shared.env import device_for_rank
from ..training.models import make_model_with_unused_branch

LAUNCH_TIMEOUT_S = 20   # a correct answer takes well under a second; past this, it hangs
WORLD_SIZE = 2
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
READ_THE_RUN = "read the broken run's diagnosis again: where did each rank wait, or fail?"


def _run(fn, what: str, hang_hint: str = READ_THE_RUN):
    """Every rank's result of fn(); a stub, a crash or a hang becomes the learner's verdict."""
    import torch._dynamo  # noqa: F401  DDP imports it on first use; here once, not in every rank

    return run_on_ranks(fn, nprocs=WORLD_SIZE, what=what, hang_hint=hang_hint,
                        timeout=LAUNCH_TIMEOUT_S)


# -- exercise 1: the log line -------------------------------------------------------------------

def _mean_loss_on_rank(log_mean_loss):
    rank = dist.get_rank()
    loss = torch.tensor(float(rank + 1), device=device_for_rank())
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        mean = log_mean_loss(loss)
    dist.barrier()  # the step goes on after logging, as in the broken run
    return float(mean), printed.getvalue()


def _numbers_in(text: str) -> list:
    return [float(number) for number in NUMBER.findall(text)]


@grader("the log line")
def check_log_mean_loss(log_mean_loss):
    results = _run(lambda: _mean_loss_on_rank(log_mean_loss), "log_mean_loss, then a barrier, "
                   "on 2 ranks")
    losses = [float(rank + 1) for rank in range(WORLD_SIZE)]
    expected = sum(losses) / WORLD_SIZE
    for rank, (mean, _) in enumerate(results):
        if abs(mean - expected) > 1e-5:
            said = {sum(losses): "the sum over the ranks", losses[rank]: f"rank {rank}'s own loss"}
            which = next((name for value, name in said.items() if abs(mean - value) < 1e-5), None)
            expect(False, f"what log_mean_loss returns on rank {rank} (rank r's loss is r + 1)",
                   f"the mean over the ranks, {expected:g}", f"{mean:g}",
                   f"that is {which}: every rank goes on training with the mean" if which else
                   "every rank must return the mean of all ranks' losses")
    printed = results[0][1].strip()
    expect(printed != "", "rank 0's output", "one line with the mean loss", "nothing",
           "the log line is rank 0's: it must still appear")
    if not any(abs(number - expected) < 1e-3 for number in _numbers_in(printed)):
        said = {sum(losses): "the sum over the ranks", losses[0]: "rank 0's own loss"}
        which = next((name for value, name in said.items()
                      if any(abs(number - value) < 1e-3 for number in _numbers_in(printed))), None)
        expect(False, "the number rank 0 prints", f"the mean over the ranks, {expected:g}",
               repr(printed[:80]), f"rank 0 printed {which}" if which else
               "rank 0's line must hold the mean over the ranks")
    expect(results[1][1] == "", "rank 1's output", "nothing", repr(results[1][1][:80]),
           "rank 1 printed a line too: with N ranks the log holds N copies of every step")


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


def _drops_the_collective(loss):
    if dist.get_rank() == 0:  # no hang any more, and no mean either
        print(f"mean loss {loss.item():.4f}")
    return loss


def _prints_the_sum(loss):
    total = loss.clone()
    dist.all_reduce(total)
    if dist.get_rank() == 0:
        print(f"mean loss {total.item():.4f}")
    return total / dist.get_world_size()


# -- exercise 2: the second step ----------------------------------------------------------------

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


@grader("the second step")
def check_wrap_model(wrap_model):
    results = _run(lambda: _train_on_rank(wrap_model), "3 DDP steps with wrap_model on 2 ranks")
    reference = _reference_body()
    apart = any(not torch.allclose(results[0][name], results[1][name], rtol=1e-4, atol=1e-6)
                for name in reference)
    hint = ("the two ranks ended with different weights: their gradients were never averaged"
            if apart else "the ranks agree, but not with one process on the global batch: each "
            "step must use the mean of the ranks' gradients")
    for rank, body in enumerate(results):
        for name, tensor in reference.items():
            expect_close(body[name], tensor, f"rank {rank}'s body.{name} after 3 steps",
                         hint=hint, rtol=1e-4, atol=1e-6)


def _no_ddp(model):
    return model


def _deletes_after_wrapping(model):
    wrapped = DDP(model)
    del model.unused_head  # too late: DDP already expects a gradient for it
    return wrapped


def _freezes_after_wrapping(model):
    wrapped = DDP(model)
    model.unused_head.requires_grad_(False)  # too late: DDP already expects a gradient for it
    return wrapped


# -- exercise 3: every epoch the same -----------------------------------------------------------

N_INDICES, EPOCHS = 20, 3


@grader("every epoch the same")
def check_indices_per_epoch(indices_per_epoch):
    dataset = TensorDataset(torch.arange(N_INDICES))
    results = _run(lambda: indices_per_epoch(dataset, epochs=EPOCHS, batch_size=4),
                   "indices_per_epoch on 2 ranks")
    every_index = list(range(N_INDICES))
    for epoch in range(EPOCHS):
        seen = [list(per_rank[epoch]) for per_rank in results]
        together = sorted(seen[0] + seen[1])
        expect(together == every_index, f"the indices ranks 0 and 1 see together in epoch {epoch}",
               f"each of the {N_INDICES} once", f"{len(together)} indices, "
               f"{len(together) - len(set(together))} of them on both ranks",
               "each sample once per epoch, on one rank: the ranks' shares must not overlap")
    orders = [tuple(results[0][epoch]) for epoch in range(EPOCHS)]
    repeated = next(((a, b) for a in range(EPOCHS) for b in range(a + 1, EPOCHS)
                     if orders[a] == orders[b]), None)
    expect(repeated is None, "rank 0's order in each epoch", f"{EPOCHS} different orders",
           f"epochs {repeated} in the same order: {orders[0][:6]}..." if repeated else "",
           "the run's symptom: every epoch is the first one again")
    shares = [frozenset(order) for order in orders]
    expect(len(set(shares)) == EPOCHS, "the samples rank 0 gets in each epoch",
           "a new share every epoch, drawn from the whole dataset",
           f"the same {len(shares[0])} samples every epoch, reordered",
           "each rank reshuffles only its own half: rank 0 never meets rank 1's samples")


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


def _reshuffles_its_own_share(dataset, epochs=3, batch_size=4):
    share = list(DistributedSampler(dataset, shuffle=True, seed=0))  # the same share every epoch
    generator = torch.Generator().manual_seed(dist.get_rank())
    return [[share[i] for i in torch.randperm(len(share), generator=generator).tolist()]
            for _ in range(epochs)]


# -- exercise 4: the checkpoint the others read --------------------------------------------------

DISK_SECONDS = (0.4, 1.2)  # rank 0's save takes this long, as on a busy shared file system
WAKE_BAND_S = 0.75  # a rank told that the save ended returns within ms; a fixed wait does not
RANK0_LATE_S = 0.3  # rank 0 reaches save_checkpoint this much after the others


def _save_then_load_on_rank(save_checkpoint, path, seconds):
    rank, calls = dist.get_rank(), []
    model = make_model_with_unused_branch(seed=0).to(device_for_rank())
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
        loaded = f"{type(error).__name__}: {str(error).replace(path, 'model.pt')[:120]}"
    else:
        new = all(torch.equal(state.get(name, torch.empty(0)).cpu(), tensor.cpu())
                  for name, tensor in model.state_dict().items()) if isinstance(state, dict) \
            else False
        loaded = "the new weights" if new else "an older checkpoint (or other weights)"
    dist.barrier()  # nobody leaves (and the folder stays) until every rank has loaded
    return len(calls), loaded, returned, saves_ended[-1] if saves_ended else None


@grader("the checkpoint the others read")
def check_save_checkpoint(save_checkpoint):
    for seconds in DISK_SECONDS:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.pt")
            torch.save(make_model_with_unused_branch(seed=1).state_dict(), path)  # last epoch's
            results = _run(lambda: _save_then_load_on_rank(save_checkpoint, path, seconds),
                           f"save_checkpoint on 2 ranks, rank 0's disk taking {seconds:g} s")
        where = f"with rank 0's disk taking {seconds:g} s"
        expect([saves for saves, *_ in results] == [1, 0], f"torch.save calls on ranks 0 and 1 "
               f"{where}", "[1, 0]", str([saves for saves, *_ in results]),
               "the ranks hold the same weights: one writer is enough, and two writers of one "
               "file tear it")
        save_ended = results[0][3]
        for rank, (_, loaded, returned, _) in enumerate(results):
            expect(loaded == "the new weights", f"what rank {rank} loads right after "
                   f"save_checkpoint returns, {where}", "the new weights", loaded,
                   "when save_checkpoint returns on this rank, rank 0 has not finished writing")
            late = returned - save_ended
            expect(-0.01 <= late <= WAKE_BAND_S, f"when save_checkpoint returns on rank {rank}, "
                   f"{where}", f"when rank 0's save ends (within {WAKE_BAND_S} s after it)",
                   f"{late:+.2f} s from it", "a rank must not return before the file is "
                   "complete, and no later than it must: a fixed wait is right for one disk "
                   "only" if late > 0 else "this rank returned while rank 0 was still writing")


def _barrier_before_saving(model, path):
    dist.barrier()
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)


def _barrier_on_rank0_only(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
        dist.barrier()


def _waits_for_the_file(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
    else:
        while not os.path.exists(path):  # the file (an old one, a torn one) may be there already
            time.sleep(0.01)


def _sleeps_then_returns(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
    else:
        time.sleep(1.0)  # "long enough" for one disk


def _retries_loading(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
        return
    while True:
        try:
            torch.load(path, map_location="cpu")  # loads whatever complete file is there
            return
        except Exception:  # noqa: BLE001
            time.sleep(0.01)


WRONG_ANSWERS = {
    check_log_mean_loss: [
        wrong_answer("the broken snippet: all_reduce on rank 0 only",
                     pitfalls.log_mean_loss_broken),
        wrong_answer("the symptom fixed: no collective, rank 0 logs its own loss",
                     _drops_the_collective),
        wrong_answer("all_reduce everywhere, but every rank prints", _sums_and_prints_everywhere),
        wrong_answer("divides by world_size on rank 0 only", _divides_on_rank0_only),
        wrong_answer("dist.reduce to rank 0: other ranks get no mean", _reduces_to_rank0),
        wrong_answer("returns the mean, but rank 0 prints its own loss", _prints_its_own_loss),
        wrong_answer("returns the mean, but rank 0 prints the sum", _prints_the_sum),
    ],
    check_wrap_model: [
        wrong_answer("the broken snippet: plain DDP", pitfalls.wrap_model_broken),
        wrong_answer("the symptom fixed: no DDP at all, each rank trains alone", _no_ddp),
        wrong_answer("deletes the branch after wrapping", _deletes_after_wrapping),
        wrong_answer("freezes the branch after wrapping", _freezes_after_wrapping),
    ],
    check_indices_per_epoch: [
        wrong_answer("the broken snippet: no set_epoch", pitfalls.indices_per_epoch_broken),
        wrong_answer("set_epoch after the epoch's loop", _sets_epoch_after_the_epoch),
        wrong_answer("the symptom fixed: DataLoader(shuffle=True) without sharding",
                     _shuffles_without_sharding),
        wrong_answer("the symptom fixed: each rank reshuffles its own fixed share",
                     _reshuffles_its_own_share),
    ],
    check_save_checkpoint: [
        wrong_answer("the broken snippet: rank 0 saves, nobody waits",
                     pitfalls.save_checkpoint_broken),
        wrong_answer("every rank saves", pitfalls.save_checkpoint_everywhere),
        wrong_answer("barrier before saving", _barrier_before_saving),
        wrong_answer("barrier inside `if rank == 0`", _barrier_on_rank0_only),
        wrong_answer("the symptom fixed: the others wait until the file exists",
                     _waits_for_the_file),
        wrong_answer("the symptom fixed: the others sleep a second", _sleeps_then_returns),
        wrong_answer("the symptom fixed: the others retry loading until it loads",
                     _retries_loading),
    ],
}
