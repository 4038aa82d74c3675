"""Lesson 13 graders: find the bug. Each runs the fixed function on 2 gloo ranks and judges what
it does, never how it is written.

- the end of an epoch: on every rank, end_of_epoch returns the mean of the ranks' epoch losses and
  rank 0's learning rate, two epochs in a row.
- the cached data: load_data returns the dataset on every rank, only rank 0 writes the file, and
  only when it is missing; no rank reads it before it is complete (rank 0's disk is slow), whether
  rank 1 starts at once or late, on the first run and on the next.
- the logged loss: step_and_loss trains like one process on the global batch (three DDP steps),
  and returns that batch's loss on every rank.
- data parallel by hand: hand_ddp_step's weights after each of four steps are one process's on
  the global batch, on every rank.
- noise of its own: add_noise returns X plus noise of std NOISE_STD, the same for the same
  (seed, step) on a rank, and different for every other (rank, step) and for another seed; X is
  left as it was.
- a loader that keeps up: make_loader's batches are the broken loader's (same samples, same
  order), the dataset is untouched, and a step with it takes at most MAX_TIME_RATIO of a step with
  the broken loader, both measured in turns in the same run (the best of MEASUREMENTS of each).
- DDP without the search: wrap_for_ddp's model trains like one process on the global batch (six
  steps), and its last steps issue no more collectives than plain DDP's.
"""
import math
import os
import pickle
import tempfile
import time
import warnings
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector
from torch.utils.data import DataLoader, DistributedSampler

from . import expect, grader, hanging_wrong_answer, wrong_answer
from .oracle import close, large_batch_sgd
from ..runtime.launcher.launch import DistributedRunError, launch
from ..topics import debugging
from ..topics.debugging import NOISE_STD
from ..topics.input_pipeline import device_step, measure_data_wait, shutdown_workers
from ..topics.traffic import count_traffic
from ..training.data import make_dataset
from ..training.models import make_model

WORLD_SIZE = 2
LAUNCH_TIMEOUT_S = 20  # a right answer takes a second or two; past this, it hangs
SAME_COLLECTIVES = ("every rank must call the same collectives, in the same order, with the same "
                    "shapes: read the diagnosis")


def _launch(fn, *args, what: str, hint: str = SAME_COLLECTIVES):
    """Every rank's result of fn(*args) on WORLD_SIZE quiet gloo ranks; a stub, a crash or a hang
    becomes the learner's message, with the launcher's diagnosis of where the ranks parted."""
    import torch._dynamo  # noqa: F401  DDP imports it on first use: once here, not in every rank

    try:
        with warnings.catch_warnings():  # e.g. "2 ranks on 1 CPU core": not in the check cell
            warnings.simplefilter("ignore")
            return launch(fn, *args, nprocs=WORLD_SIZE, backend="gloo", timeout=LAUNCH_TIMEOUT_S,
                          output="none")
    except DistributedRunError as error:
        cause = error.root_cause
        if cause.summary.startswith("NotImplementedError"):
            raise NotImplementedError(cause.summary.partition(": ")[2]) from None
        if error.timed_out:
            got = f"the ranks hung for {LAUNCH_TIMEOUT_S} s"
        else:
            got = cause.headline()[:300]
        if error.diagnosis:
            got += f"; diagnosis: {error.diagnosis.splitlines()[0]}"
        expect(False, what, "every rank to finish", got, hint)


def _numbers(values) -> list:
    """A returned tuple of numbers (or 0-d tensors) as floats; None where it is not one."""
    try:
        return [float(value) for value in values]
    except (TypeError, ValueError, RuntimeError):
        return None


# -- exercise 1: the end of an epoch ------------------------------------------------------------

EPOCH_LOSSES = [[1.5, 2.5], [0.75, 1.25]]   # [epoch][rank]
LEARNING_RATES = [[0.1, 0.3], [0.05, 0.3]]  # rank 0 decides; rank 1 passes a stale value


def _epoch_ends_on_rank(end_of_epoch):
    rank = dist.get_rank()
    return [_numbers(end_of_epoch(EPOCH_LOSSES[epoch][rank], LEARNING_RATES[epoch][rank]) or ())
            for epoch in range(len(EPOCH_LOSSES))]


@grader("the end of an epoch")
def check_end_of_epoch(end_of_epoch):
    results = _launch(_epoch_ends_on_rank, end_of_epoch, what="end_of_epoch on 2 ranks, 2 epochs")
    for epoch, (losses, rates) in enumerate(zip(EPOCH_LOSSES, LEARNING_RATES)):
        mean, lr = sum(losses) / WORLD_SIZE, rates[0]
        for rank, per_epoch in enumerate(results):
            got = per_epoch[epoch]
            where = f"what end_of_epoch returns on rank {rank} in epoch {epoch}"
            expect(got is not None and len(got) == 2, where,
                   "(mean loss, learning rate): two numbers", repr(got),
                   "return the pair, as the broken version does")
            if abs(got[0] - mean) > 1e-6:
                hint = ("that is the sum: divide it by the world size"
                        if abs(got[0] - sum(losses)) < 1e-6 else
                        "add up the losses of all ranks (all_reduce), then divide by the world "
                        "size")
                expect(False, where + ", its mean loss", f"{mean:g}", f"{got[0]:g}", hint)
            if abs(got[1] - lr) > 1e-6:
                hint = ("rank 0's learning rate must reach every rank: broadcast it from rank 0 "
                        "(all_reduce adds the ranks' values)" if abs(got[1] - sum(rates)) < 1e-6
                        else "every rank must take rank 0's learning rate: "
                             "dist.broadcast(..., src=0)")
                expect(False, where + ", its learning rate", f"rank 0's, {lr:g}", f"{got[1]:g}",
                       hint)


def _sums_the_learning_rate(epoch_loss, lr):
    values = torch.tensor([epoch_loss, lr])
    dist.all_reduce(values)
    return values[0].item() / dist.get_world_size(), values[1].item()


def _keeps_its_own_learning_rate(epoch_loss, lr):
    total = torch.tensor([epoch_loss])
    dist.all_reduce(total)
    return total.item() / dist.get_world_size(), lr


def _returns_the_sum(epoch_loss, lr):
    total, shared_lr = torch.tensor([epoch_loss]), torch.tensor([lr])
    dist.all_reduce(total)
    dist.broadcast(shared_lr, src=0)
    return total.item(), shared_lr.item()


def _broadcasts_the_loss_too(epoch_loss, lr):
    values = torch.tensor([epoch_loss, lr])
    dist.broadcast(values, src=0)
    return values[0].item(), values[1].item()


# -- exercise 2: the cached data ----------------------------------------------------------------

SLOW_DISK_S = 0.5   # rank 0's torch.save waits this long before writing, as on a busy file system
LATE_START_S = 1.0  # in one run rank 1 calls load_data this late: after rank 0's file is complete


class _ReadTooEarly(Exception):
    pass


def _load_on_rank(load_data, folder, late_rank):
    rank, real_save, real_load, saves = dist.get_rank(), torch.save, torch.load, []

    def slow_save(obj, f, *args, **kwargs):
        saves.append(rank)
        if rank == 0:
            time.sleep(SLOW_DISK_S)
        return real_save(obj, f, *args, **kwargs)

    def checked_load(f, *args, **kwargs):
        try:
            return real_load(f, *args, **kwargs)
        except (FileNotFoundError, EOFError, RuntimeError, pickle.UnpicklingError) as error:
            said = f"{type(error).__name__}: {error}".replace(folder, "FOLDER")
            raise _ReadTooEarly(said) from None

    if rank == late_rank:
        time.sleep(LATE_START_S)
    with mock.patch.object(torch, "save", slow_save), \
            mock.patch.object(torch, "load", checked_load):
        try:
            data = load_data(folder)
        except _ReadTooEarly as error:
            return len(saves), f"could not read the file: {str(error)[:160]}"
    expected = make_dataset(n_samples=debugging.DATA_SAMPLES).tensors
    same = (isinstance(data, (tuple, list)) and len(data) == len(expected)
            and all(torch.is_tensor(got) and torch.equal(got, want)
                    for got, want in zip(data, expected)))
    return len(saves), "the dataset" if same else f"something else: {type(data).__name__}"


@grader("the cached data")
def check_load_data(load_data):
    runs = [("the first run (no file yet)", True, None),
            ("the next run (the file is there)", False, None),
            ("a first run where rank 1 starts 1 s late", True, 1)]
    with tempfile.TemporaryDirectory() as first, tempfile.TemporaryDirectory() as late:
        for name, fresh, late_rank in runs:
            folder = late if late_rank is not None else first
            results = _launch(_load_on_rank, load_data, folder, late_rank,
                              what=f"load_data in {name}",
                              hint="a barrier only works when every rank reaches it, in every run: "
                                   "decide who waits without asking the file system on each rank")
            expect([saves for saves, _ in results] == [1 if fresh else 0, 0],
                   f"torch.save calls on ranks 0 and 1 in {name}",
                   "[1, 0]: rank 0 writes the missing file" if fresh
                   else "[0, 0]: the file is there",
                   str([saves for saves, _ in results]),
                   "only rank 0 writes, and only when the file is missing")
            for rank, (_, loaded) in enumerate(results):
                expect(loaded == "the dataset", f"what load_data returns on rank {rank} in {name}",
                       "the dataset, read from the complete file", loaded,
                       "no rank may read the file before rank 0 has written it: every rank "
                       "waits at dist.barrier() after rank 0's save, and before torch.load")


def _no_barrier(folder):
    path = os.path.join(folder, "data.pt")
    if dist.get_rank() == 0 and not os.path.exists(path):
        torch.save(make_dataset(n_samples=256).tensors, path)
    return torch.load(path)


def _every_rank_writes(folder):
    path = os.path.join(folder, "data.pt")
    if not os.path.exists(path):
        torch.save(make_dataset(n_samples=256).tensors, path)
    dist.barrier()
    return torch.load(path)


def _each_rank_looks_for_the_file(folder):
    path = os.path.join(folder, "data.pt")
    if not os.path.exists(path):  # a rank that looks after rank 0 wrote it skips the barrier
        if dist.get_rank() == 0:
            torch.save(make_dataset(n_samples=256).tensors, path)
        dist.barrier()
    return torch.load(path)


def _barrier_before_saving(folder):
    path = os.path.join(folder, "data.pt")
    dist.barrier()
    if dist.get_rank() == 0 and not os.path.exists(path):
        torch.save(make_dataset(n_samples=256).tensors, path)
    return torch.load(path)


# -- exercise 3 and 4: a training step, against one process on the global batch ------------------

STEPS, GLOBAL_BATCH_SIZE, LR = 4, 32, 0.5


def _batches(steps=STEPS):
    X, y = make_dataset(steps * GLOBAL_BATCH_SIZE, seed=1).tensors
    return list(zip(X.split(GLOBAL_BATCH_SIZE), y.split(GLOBAL_BATCH_SIZE)))


def _train_on_rank(step_fn, wrap):
    """Four steps of step_fn on this rank's shard of each global batch: what it returned, the
    weights after each step, and the loss of this rank's shard before each step."""
    rank = dist.get_rank()
    model = make_model(seed=0)
    trained = DDP(model) if wrap else model
    optimizer = torch.optim.SGD(trained.parameters(), lr=LR)
    returned, weights, own = [], [], []
    for X, y in _batches():
        X_local, y_local = X[rank::WORLD_SIZE], y[rank::WORLD_SIZE]  # as DistributedSampler deals
        with torch.no_grad():
            own.append(F.cross_entropy(model(X_local), y_local).item())
        value = step_fn(trained, optimizer, X_local, y_local)
        returned.append((_numbers([value]) or [None])[0])
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
    return returned, weights, own


def _expect_trained_like_one_process(results, single_weights, what, hint_of):
    for step in range(STEPS):
        before, after = single_weights[step], single_weights[step + 1]
        for rank, (_, weights, _) in enumerate(results):
            got = weights[step]
            if not close(got, after):
                ranks_differ = not close(results[0][1][step], results[1][1][step])
                update, expected_update = got - before, after - before
                expect(False, f"rank {rank}'s weights after step {step} of {what}",
                       "one process's on the whole global batch",
                       f"weights off by up to {(got - after).abs().max().item():.2e}",
                       hint_of(ranks_differ, update, expected_update))


@grader("the logged loss")
def check_step_and_loss(step_and_loss):
    single_losses, single_weights = large_batch_sgd(_batches(), LR)
    results = _launch(_train_on_rank, step_and_loss, True,
                      what="step_and_loss, 4 DDP steps on 2 ranks")
    _expect_trained_like_one_process(
        results, single_weights, "step_and_loss",
        lambda *_: "keep the training step as it was (zero_grad, forward, backward, step): fix "
                   "only the number it returns")
    for step in range(STEPS):
        for rank, (returned, _, own) in enumerate(results):
            got, expected = returned[step], single_losses[step]
            expect(got is not None, f"what step_and_loss returns on rank {rank} at step {step}",
                   "the loss, a number", "something that is not a number", "return a float")
            if abs(got - expected) > 1e-5 * abs(expected) + 1e-6:
                if abs(got - WORLD_SIZE * expected) < 1e-4:
                    hint = "that is the sum over the ranks: divide it by the world size"
                elif abs(got - own[step]) < 1e-5:
                    hint = ("that is the loss of this rank's shard only: the global batch's loss "
                            "is the mean of every rank's loss (all_reduce a copy on every rank, "
                            "then divide)")
                else:
                    hint = ("return the mean over the ranks of the loss each one computed in this "
                            "step's forward, before the optimizer changed the weights")
                expect(False, f"the loss step_and_loss returns on rank {rank} at step {step}",
                       f"the global batch's loss, {expected:.6f} (one process on all 32 samples)",
                       f"{got:.6f}", hint)


def _step_then_report(model, optimizer, X, y, report):
    """The training step, then `report(a copy of this rank's loss)` as the number to log."""
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    optimizer.step()
    return report(loss.detach().clone())


def _sum_of(loss):
    dist.all_reduce(loss)
    return loss.item()


def _reduced_to_rank0(loss):
    dist.reduce(loss, dst=0)  # only rank 0 receives the sum
    return loss.item() / dist.get_world_size()


def _sums_the_losses(model, optimizer, X, y):
    return _step_then_report(model, optimizer, X, y, _sum_of)


def _reduces_to_rank0(model, optimizer, X, y):
    return _step_then_report(model, optimizer, X, y, _reduced_to_rank0)


def _loss_after_the_step(model, optimizer, X, y):
    optimizer.zero_grad()
    F.cross_entropy(model(X), y).backward()
    optimizer.step()
    with torch.no_grad():
        mean = F.cross_entropy(model(X), y)  # the loss of the updated model: not this step's
    dist.all_reduce(mean)
    return mean.item() / dist.get_world_size()


def _averages_the_loss_before_backward(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    dist.all_reduce(loss)
    loss = loss / dist.get_world_size()  # the gradient is now divided by the world size too
    loss.backward()
    optimizer.step()
    return loss.item()


def _hand_ddp_hint(ranks_differ, update, expected_update):
    if ranks_differ:
        return ("the ranks' models drifted apart: every rank must end with the same gradients, "
                "copied back into each parameter's .grad before optimizer.step()")
    if close(update, WORLD_SIZE * expected_update):
        return ("each update is world_size times too large: all_reduce adds the ranks' gradients; "
                "the gradient of the global batch's loss is their mean")
    if close(update, torch.zeros_like(update)):
        return "the weights did not change: call optimizer.step() after averaging"
    return ("after all_reduce, every parameter's .grad must hold the mean of the ranks' gradients "
            "(one process on the whole global batch gets exactly that)")


@grader("data parallel by hand")
def check_hand_ddp_step(hand_ddp_step):
    _, single_weights = large_batch_sgd(_batches(), LR)
    results = _launch(_train_on_rank, hand_ddp_step, False,
                      what="hand_ddp_step, 4 steps on 2 ranks")
    _expect_trained_like_one_process(results, single_weights, "hand_ddp_step", _hand_ddp_hint)


def _flat_step(model, optimizer, X, y, average):
    """The broken run's step, with `average(flat)` done to the all-reduced gradients."""
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    grads = [param.grad for param in model.parameters()]
    flat = torch.cat([grad.flatten() for grad in grads])
    dist.all_reduce(flat)
    average(flat)
    for grad, reduced in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(reduced.view_as(grad))
    optimizer.step()
    return loss.item()


def _divides_by_the_batch_size(model, optimizer, X, y):
    return _flat_step(model, optimizer, X, y, lambda flat: flat.div_(len(X)))


def _averages_on_rank0_only(model, optimizer, X, y):
    world_size = dist.get_world_size()
    return _flat_step(model, optimizer, X, y,
                      lambda flat: flat.div_(world_size) if dist.get_rank() == 0 else flat)


def _never_copies_back(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    flat = torch.cat([param.grad.flatten() for param in model.parameters()])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()  # the mean, in a buffer the optimizer never sees
    optimizer.step()
    return loss.item()


# -- exercise 5: noise of its own ---------------------------------------------------------------

NOISE_STEPS, SEEDS = 4, (0, 1)


def _noise_on_rank(add_noise):
    X = make_dataset(n_samples=64, seed=2).tensors[0]
    original = X.clone()
    noise = {(seed, step): (add_noise(X, step, seed=seed) - X).detach().clone()
             for seed in SEEDS for step in range(NOISE_STEPS)}
    again = (add_noise(X, 2, seed=0) - X).detach().clone()
    return noise, again, torch.equal(X, original)


@grader("noise of its own")
def check_add_noise(add_noise):
    results = _launch(_noise_on_rank, add_noise, what="add_noise on 2 ranks",
                      hint="add_noise should only draw numbers: it needs no collective")
    names = {}
    for rank, (noise, again, untouched) in enumerate(results):
        expect(untouched, f"X after add_noise on rank {rank}", "unchanged", "changed in place",
               "return X + noise, a new tensor: X is the caller's batch")
        for (seed, step), drawn in noise.items():
            std, mean = drawn.std().item(), drawn.mean().item()
            expect(0.85 * NOISE_STD < std < 1.15 * NOISE_STD and abs(mean) < 0.02,
                   f"the noise on rank {rank} (seed {seed}, step {step})",
                   f"mean 0, standard deviation {NOISE_STD}",
                   f"mean {mean:.3f}, standard deviation {std:.3f}",
                   "keep the augmentation as it was: 0.1 * standard normal noise")
        expect(torch.equal(again, noise[(0, 2)]),
               f"the noise on rank {rank}, drawn twice for seed 0, step 2",
               "the same both times: a run can be repeated", "different",
               "draw from a generator seeded from the seed, the step and the rank, not from "
               "torch's global random state")
        for key, drawn in noise.items():
            for other in names.get(drawn.sum().item(), []):
                same = f"rank {other[0]} at seed {other[1][0]}, step {other[1][1]}"
                if other[0] != rank and other[1] == key:
                    hint = ("every rank draws the same numbers: give each rank a seed of its own "
                            "(the rank in the generator's seed)")
                elif other[1][0] != key[0]:
                    hint = ("a different seed must give different noise: keep the seed in the "
                            "generator's seed")
                else:
                    hint = ("two (rank, step) pairs share a seed, e.g. seed + step + rank: combine "
                            "them so that no two pairs meet, e.g. step * world_size + rank")
                expect(False, f"the noise on rank {rank} at seed {key[0]}, step {key[1]}",
                       "noise no other rank or step draws", f"the same as {same}", hint)
            names.setdefault(drawn.sum().item(), []).append((rank, key))


def _global_random_state(X, step, seed=0):
    return X + 0.1 * torch.randn(X.shape)  # forked ranks start from the same random state


def _seed_plus_step_plus_rank(X, step, seed=0):
    generator = torch.Generator().manual_seed(1000 * seed + step + dist.get_rank())
    return X + 0.1 * torch.randn(X.shape, generator=generator)


def _same_noise_every_step(X, step, seed=0):
    generator = torch.Generator().manual_seed(1000 * seed + dist.get_rank())
    return X + 0.1 * torch.randn(X.shape, generator=generator)


def _noise_scaled_by_rank(X, step, seed=0):
    generator = torch.Generator().manual_seed(1000 * seed + step)
    return X + 0.1 * (1 + dist.get_rank()) * torch.randn(X.shape, generator=generator)


def _adds_in_place(X, step, seed=0):
    generator = torch.Generator().manual_seed(1000 * seed + 2 * step + dist.get_rank())
    return X.add_(0.1 * torch.randn(X.shape, generator=generator))


# -- exercise 6: a loader that keeps up ---------------------------------------------------------

MAX_TIME_RATIO = 0.6   # a fixed step over a broken one: about 0.38 with 2 workers, 0.76 with 1
MEASUREMENTS = 3       # each loader's best of this many, in turns: a busy machine only adds time
WARMUP, MEASURED = 4, 16  # the 20 batches of one epoch on each rank


def _loader_on_rank(make_loader):
    """Inside a rank: this rank's batches from both loaders, and the seconds a step takes with
    each, measured in turns (a busy machine only ever adds time: the best of each is compared)."""
    dataset = debugging.SamplesOnDisk()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "more workers than cores"
        loader = make_loader(dataset)
        facts = {"read_seconds": dataset.read_seconds, "broken": [], "fixed": [],
                 "own_read_seconds": getattr(getattr(loader, "dataset", None), "read_seconds",
                                             debugging.READ_SECONDS)}
        try:
            for _ in range(MEASUREMENTS):
                broken_loader = debugging.make_loader_broken(dataset)
                broken, facts["broken_batches"] = _seconds_per_step(broken_loader)
                fixed, facts["batches"] = _seconds_per_step(loader)
                facts["broken"].append(broken)
                facts["fixed"].append(fixed)
                if facts["batches"] != facts["broken_batches"]:
                    break
        finally:
            if isinstance(loader, DataLoader):
                shutdown_workers(loader)
    return facts


def _seconds_per_step(loader):
    seen = []
    step = device_step(debugging.STEP_SECONDS)

    def record_then_step(batch):
        X, y = batch
        seen.append((round(float(X.sum()), 4), tuple(y.tolist())))
        step(batch)

    try:
        times = measure_data_wait(loader, record_then_step, steps=MEASURED, warmup=WARMUP)
    except (StopIteration, TypeError, ValueError) as error:
        return math.inf, f"{type(error).__name__}: {error}"[:120]
    return (times["data"] + times["compute"]) / MEASURED, seen


@grader("a loader that keeps up")
def check_make_loader(make_loader):
    results = _launch(_loader_on_rank, make_loader, what="make_loader on 2 ranks",
                      hint="make_loader should only build a loader; the check iterates it")
    for rank, facts in enumerate(results):
        for key in ("read_seconds", "own_read_seconds"):
            expect(facts[key] == debugging.READ_SECONDS,
                   f"the dataset's read_seconds on rank {rank}",
                   f"{debugging.READ_SECONDS} (storage is as slow as it is)", str(facts[key]),
                   "leave the dataset alone: hide its reads behind the steps instead")
        expect(isinstance(facts["batches"], list) and facts["batches"] == facts["broken_batches"],
               f"the batches rank {rank}'s loader gives in one epoch",
               "the broken loader's: the same samples, in batches of 16, in the same order",
               "other batches" if isinstance(facts["batches"], list) else str(facts["batches"]),
               "keep the sampler and the batch size: the fix is how the batches are read, not "
               "which")
        ratio = min(facts["fixed"]) / min(facts["broken"])
        fixed_ms, broken_ms = min(facts["fixed"]) * 1000, min(facts["broken"]) * 1000
        expect(ratio <= MAX_TIME_RATIO,
               f"a step's time on rank {rank}, over a step's with the broken loader",
               f"at most {MAX_TIME_RATIO:.2f}", f"{ratio:.2f} ({fixed_ms:.0f} ms against "
               f"{broken_ms:.0f} ms, the best of {len(facts['fixed'])} each)",
               "each batch takes 16 x 2 ms of reads and the step 10 ms: read the next batches "
               "while the step runs, in worker processes, enough of them; if the machine is very "
               "busy, run the check again")


def _one_worker(dataset):
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=1)


def _smaller_batches(dataset):
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=4)


def _free_reads(dataset):
    dataset.read_seconds = 0.0
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=16, sampler=sampler)


def _no_sampler(dataset):
    return DataLoader(dataset, batch_size=16, shuffle=True, num_workers=4)


# -- exercise 7: DDP without the search ---------------------------------------------------------

WRAPPED_STEPS, COUNTED_STEPS = 6, 2  # count the last 2: DDP rebuilds its buckets in step 2 (3 with
                                     # static_graph), then each step is like the next


def _wrapped_on_rank(wrap_for_ddp):
    rank = dist.get_rank()
    counts = {}
    for name, wrap in (("yours", wrap_for_ddp), ("plain", DDP)):
        model = make_model(seed=0)
        trained = wrap(model)
        optimizer = torch.optim.SGD(trained.parameters(), lr=LR)
        for number, (X, y) in enumerate(_batches(WRAPPED_STEPS)):
            with count_traffic() as traffic:
                optimizer.zero_grad()
                F.cross_entropy(trained(X[rank::WORLD_SIZE]), y[rank::WORLD_SIZE]).backward()
                optimizer.step()
            if number >= WRAPPED_STEPS - COUNTED_STEPS:
                counts[name] = counts.get(name, 0) + len(traffic.collectives)
        if name == "yours":
            weights = parameters_to_vector(model.parameters()).detach().clone()
            searches = bool(getattr(trained, "find_unused_parameters", False)
                            and not getattr(trained, "static_graph", False))
    return weights, counts, searches


@grader("DDP without the search")
def check_wrap_for_ddp(wrap_for_ddp):
    _, single_weights = large_batch_sgd(_batches(WRAPPED_STEPS), LR)
    results = _launch(_wrapped_on_rank, wrap_for_ddp,
                      what=f"{WRAPPED_STEPS} training steps with wrap_for_ddp on 2 ranks")
    ranks_agree = close(results[0][0], results[1][0])
    for rank, (weights, counts, searches) in enumerate(results):
        expect(close(weights, single_weights[-1]),
               f"rank {rank}'s weights after {WRAPPED_STEPS} steps",
               "one process's on the whole global batch",
               f"weights off by up to {(weights - single_weights[-1]).abs().max().item():.2e}",
               "every parameter must still train, averaged over the ranks: wrap the whole model in "
               "DDP and change nothing else" if ranks_agree else
               "the ranks trained apart: return the model wrapped in DDP, which averages the "
               "gradients")
        yours, plain = counts["yours"] / COUNTED_STEPS, counts["plain"] / COUNTED_STEPS
        expect(yours <= plain and not searches, f"collectives per step on rank {rank}",
               f"{plain:g}, as DDP(model) issues", f"{yours:g}",
               "the extra all_reduce says which parameters got a gradient: DDP runs it, and walks "
               "the autograd graph after every forward, because it was told to look for unused "
               "parameters; this model has none")


def _no_ddp(model):
    return model


def _searching_without_buffers(model):
    return DDP(model, find_unused_parameters=True, broadcast_buffers=False)


def _freezes_the_first_layer(model):
    model[0].requires_grad_(False)  # no search needed now, but the layer no longer trains
    return DDP(model, find_unused_parameters=True)


SLOW_CHECKS = {check_make_loader}  # it times several loaders in turns: its tests run in the slow tier

WRONG_ANSWERS = {
    check_end_of_epoch: [
        hanging_wrong_answer("the broken run: the collectives in another order on rank 0",
                             debugging.end_of_epoch_broken),
        wrong_answer("all_reduce of loss and learning rate together", _sums_the_learning_rate),
        wrong_answer("no broadcast: each rank keeps its own learning rate",
                     _keeps_its_own_learning_rate),
        wrong_answer("returns the sum of the losses", _returns_the_sum),
        wrong_answer("broadcasts the loss too", _broadcasts_the_loss_too),
    ],
    check_load_data: [
        wrong_answer("the broken run: the barrier only when the file was missing",
                     debugging.load_data_broken),
        wrong_answer("no barrier", _no_barrier),
        wrong_answer("every rank writes the file", _every_rank_writes),
        wrong_answer("every rank looks for the file itself", _each_rank_looks_for_the_file),
        wrong_answer("the barrier before the save", _barrier_before_saving),
    ],
    check_step_and_loss: [
        wrong_answer("the broken run: each rank's own loss", debugging.step_and_loss_broken),
        wrong_answer("the sum over the ranks", _sums_the_losses),
        wrong_answer("dist.reduce to rank 0: rank 1 returns its own", _reduces_to_rank0),
        wrong_answer("the loss after the optimizer step", _loss_after_the_step),
        wrong_answer("the loss averaged before backward", _averages_the_loss_before_backward),
    ],
    check_hand_ddp_step: [
        wrong_answer("the broken run: the sum of the gradients", debugging.hand_ddp_step_broken),
        wrong_answer("divided by the batch size", _divides_by_the_batch_size),
        wrong_answer("the mean never copied back into .grad", _never_copies_back),
        wrong_answer("divided on rank 0 only", _averages_on_rank0_only),
    ],
    check_add_noise: [
        wrong_answer("the broken run: the same seed on every rank", debugging.add_noise_broken),
        wrong_answer("torch's global random state", _global_random_state),
        wrong_answer("seed + step + rank: pairs collide", _seed_plus_step_plus_rank),
        wrong_answer("the same noise at every step", _same_noise_every_step),
        wrong_answer("noise scaled by the rank", _noise_scaled_by_rank),
        wrong_answer("adds the noise to X in place", _adds_in_place),
    ],
    check_make_loader: [
        wrong_answer("the broken run: no workers", debugging.make_loader_broken),
        wrong_answer("one worker", _one_worker),
        wrong_answer("batches of 4", _smaller_batches),
        wrong_answer("reads made free", _free_reads),
        wrong_answer("no DistributedSampler", _no_sampler),
    ],
    check_wrap_for_ddp: [
        wrong_answer("the broken run: find_unused_parameters=True", debugging.wrap_for_ddp_broken),
        wrong_answer("no DDP", _no_ddp),
        wrong_answer("still searching, without buffer broadcasts", _searching_without_buffers),
        wrong_answer("freezes a layer", _freezes_the_first_layer),
    ],
}
