"""Lesson 13's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.data import DataLoader, DistributedSampler

from course_lib.checks import lesson13
from course_lib.topics import debugging
from course_lib.training.data import make_dataset

from . import answer, hanging_wrong_answer, wrong_answer


def end_of_epoch_with_all_gather_and_an_object(epoch_loss, lr):
    losses = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(losses, torch.tensor([epoch_loss], dtype=torch.float64))
    shared = [lr]
    dist.broadcast_object_list(shared, src=0)  # rank 0's float, pickled
    return torch.cat(losses).mean(), shared[0]  # a 0-d tensor and a float


def end_of_epoch_in_one_all_reduce(epoch_loss, lr):
    # Rank 0 adds its lr, the others add 0: the sum is rank 0's lr
    values = torch.tensor([epoch_loss / dist.get_world_size(),
                           lr if dist.get_rank() == 0 else 0.0], dtype=torch.float64)
    dist.all_reduce(values)
    return [np.float64(values[0]), values[1].item()]  # a list


def load_data_with_a_broadcast_as_barrier(folder):
    path = Path(folder) / "data.pt"
    if dist.get_rank() == 0 and not path.exists():
        X, y = make_dataset(n_samples=256).tensors
        torch.save((X, y), str(path))
    dist.broadcast(torch.zeros(1), src=0)  # no rank passes it before rank 0 reaches it
    return list(torch.load(str(path)))


def load_data_written_atomically(folder):
    path = os.path.join(folder, "data.pt")
    if dist.get_rank() == 0 and not os.path.isfile(path):
        partial = path + ".partial"
        torch.save(make_dataset(n_samples=256).tensors, partial)
        os.replace(partial, path)
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    X, y = torch.load(path)
    return X, y


def load_data_renamed_whole_while_the_others_poll(folder):
    # no barrier: rank 0 writes elsewhere and renames, so the name appears only on a whole file
    path = os.path.join(folder, "data.pt")
    if dist.get_rank() == 0 and not os.path.exists(path):
        with tempfile.NamedTemporaryFile(dir=folder, delete=False) as partial:
            torch.save(make_dataset(n_samples=256).tensors, partial)
        os.replace(partial.name, path)
    while not os.path.exists(path):
        time.sleep(0.01)
    return torch.load(path)


def step_and_loss_with_all_gather(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    optimizer.step()
    every = [torch.zeros(()) for _ in range(dist.get_world_size())]
    dist.all_gather(every, loss.detach())
    return torch.stack(every).mean()  # a 0-d tensor


def step_and_loss_weighted_by_samples(model, optimizer, X, y):
    optimizer.zero_grad()
    output = model(X)
    F.cross_entropy(output, y).backward()
    optimizer.step()
    totals = torch.tensor([F.cross_entropy(output.detach(), y, reduction="sum").item(), len(y)],
                          dtype=torch.float64)
    dist.all_reduce(totals)  # the summed loss and the number of samples of the global batch
    return float(totals[0] / totals[1])


def hand_ddp_dividing_before_each_all_reduce(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    for param in model.parameters():
        param.grad /= dist.get_world_size()
        dist.all_reduce(param.grad)
    optimizer.step()
    return loss.item()


def hand_ddp_with_a_scaled_loss(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    (loss / dist.get_world_size()).backward()  # each rank's share of the mean: the sum is the mean
    grads = [param.grad for param in model.parameters()]
    flat = parameters_to_vector(grads)
    dist.all_reduce(flat)
    vector_to_parameters(flat, grads)  # into the same gradient tensors
    optimizer.step()
    return loss


def add_noise_from_a_spawn_key(X, step, seed=0):
    sequence = np.random.SeedSequence(seed, spawn_key=(step, int(os.environ["RANK"])))
    generator = np.random.Generator(np.random.PCG64(sequence))
    return X + torch.from_numpy(generator.normal(0.0, 0.1, size=tuple(X.shape))).to(X.dtype)


def add_noise_from_python_random_seeded_by_text(X, step, seed=0):
    import random

    generator = random.Random(f"{seed}/{step}/{dist.get_rank()}")  # text: all of it seeds (sha512)
    return X + 0.1 * torch.tensor([generator.gauss(0.0, 1.0) for _ in range(X.numel())],
                                  dtype=X.dtype).view(X.shape)


def loader_with_three_workers_and_more_prefetch(dataset):
    sampler = DistributedSampler(dataset, num_replicas=int(os.environ["WORLD_SIZE"]),
                                 rank=int(os.environ["RANK"]), shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=3, prefetch_factor=4)


class ThreadedBatches:
    """Each batch's 16 reads at once, in threads (a read sleeps, so the GIL is free): no workers."""

    def __init__(self, dataset):
        self.dataset, self.sampler = dataset, DistributedSampler(dataset, shuffle=True, seed=0)
        self.pool = ThreadPoolExecutor(16)

    def __iter__(self):
        indices = list(self.sampler)
        for start in range(0, len(indices), 16):
            samples = list(self.pool.map(self.dataset.__getitem__, indices[start:start + 16]))
            yield torch.stack([X for X, _ in samples]), torch.stack([y for _, y in samples])


def wrap_with_static_graph(model):
    return DDP(model, static_graph=True)


def wrap_with_bucket_views(model):
    return DDP(model, find_unused_parameters=False, gradient_as_bucket_view=True, bucket_cap_mb=1)


ALTERNATIVES = {
    lesson13.check_end_of_epoch: [
        answer("all_gather and broadcast_object_list", end_of_epoch_with_all_gather_and_an_object),
        answer("one all_reduce of both, a list", end_of_epoch_in_one_all_reduce),
    ],
    lesson13.check_load_data: [
        answer("pathlib, a broadcast as the barrier", load_data_with_a_broadcast_as_barrier),
        answer("written atomically, monitored_barrier", load_data_written_atomically),
        answer("renamed whole, the others poll for the name",
               load_data_renamed_whole_while_the_others_poll),
    ],
    lesson13.check_step_and_loss: [
        answer("all_gather of the losses, a 0-d tensor", step_and_loss_with_all_gather),
        answer("summed losses over all samples", step_and_loss_weighted_by_samples),
    ],
    lesson13.check_hand_ddp_step: [
        answer("divides each gradient, then all_reduce", hand_ddp_dividing_before_each_all_reduce),
        answer("a scaled loss, parameters_to_vector", hand_ddp_with_a_scaled_loss),
    ],
    lesson13.check_add_noise: [
        answer("numpy's SeedSequence with a spawn key", add_noise_from_a_spawn_key),
        answer("Python's random seeded by text", add_noise_from_python_random_seeded_by_text),
    ],
    lesson13.check_make_loader: [
        answer("3 workers, a sampler told its rank, prefetch 4",
               loader_with_three_workers_and_more_prefetch),
        answer("no workers: threads read each batch", ThreadedBatches),
    ],
    lesson13.check_wrap_for_ddp: [
        answer("static_graph=True", wrap_with_static_graph),
        answer("find_unused_parameters=False, bucket views", wrap_with_bucket_views),
    ],
}


# Wrong answers: plausible wrong fixes of the broken runs, one mistake each. Some fix the symptom
# and hide the cause (a MIN that makes the ranks' learning rates agree, a poll for a file that is
# still being written); some fix one part and break another.

# -- exercise 1: the end of an epoch ------------------------------------------------------------


def sums_the_learning_rate(epoch_loss, lr):
    values = torch.tensor([epoch_loss, lr])
    dist.all_reduce(values)
    return values[0].item() / dist.get_world_size(), values[1].item()


def keeps_its_own_learning_rate(epoch_loss, lr):
    total = torch.tensor([epoch_loss])
    dist.all_reduce(total)
    return total.item() / dist.get_world_size(), lr


def _reduced_learning_rate(epoch_loss, lr, op):
    total, shared_lr = torch.tensor([epoch_loss]), torch.tensor([lr])
    dist.all_reduce(total)
    dist.all_reduce(shared_lr, op=op)  # the ranks agree, on a value rank 0 may not hold
    return total.item() / dist.get_world_size(), shared_lr.item()


def takes_the_smallest_learning_rate(epoch_loss, lr):
    return _reduced_learning_rate(epoch_loss, lr, dist.ReduceOp.MIN)


def takes_the_largest_learning_rate(epoch_loss, lr):
    return _reduced_learning_rate(epoch_loss, lr, dist.ReduceOp.MAX)


def returns_the_sum(epoch_loss, lr):
    total, shared_lr = torch.tensor([epoch_loss]), torch.tensor([lr])
    dist.all_reduce(total)
    dist.broadcast(shared_lr, src=0)
    return total.item(), shared_lr.item()


def divides_the_sum_by_two(epoch_loss, lr):
    """Right on the broken run's 2 ranks: the sum divided by 2, not by the world size."""
    total, shared_lr = torch.tensor([epoch_loss]), torch.tensor([lr])
    dist.all_reduce(total)
    dist.broadcast(shared_lr, src=0)
    return total.item() / 2, shared_lr.item()


def broadcasts_the_loss_too(epoch_loss, lr):
    values = torch.tensor([epoch_loss, lr])
    dist.broadcast(values, src=0)
    return values[0].item(), values[1].item()


# -- exercise 2: the cached data ----------------------------------------------------------------

def _build(path):
    torch.save(make_dataset(n_samples=256).tensors, path)


def no_barrier(folder):
    path = os.path.join(folder, "data.pt")
    if dist.get_rank() == 0 and not os.path.exists(path):
        _build(path)
    return torch.load(path)


def every_rank_writes(folder):
    path = os.path.join(folder, "data.pt")
    if not os.path.exists(path):
        _build(path)
    dist.barrier()
    return torch.load(path)


def each_rank_looks_for_the_file(folder):
    path = os.path.join(folder, "data.pt")
    if not os.path.exists(path):  # a rank that looks after rank 0 wrote it skips the barrier
        if dist.get_rank() == 0:
            _build(path)
        dist.barrier()
    return torch.load(path)


def barrier_before_saving(folder):
    path = os.path.join(folder, "data.pt")
    dist.barrier()
    if dist.get_rank() == 0 and not os.path.exists(path):
        _build(path)
    return torch.load(path)


def polls_for_the_file(folder):
    path = os.path.join(folder, "data.pt")
    if dist.get_rank() == 0:
        if not os.path.exists(path):
            _build(path)
    else:
        while not os.path.exists(path):  # there as soon as rank 0 opens it: not yet complete
            time.sleep(0.01)
    return torch.load(path)


def polls_then_waits_a_moment(folder):
    path = os.path.join(folder, "data.pt")
    if dist.get_rank() == 0:
        if not os.path.exists(path):
            _build(path)
    else:
        while not os.path.exists(path):
            time.sleep(0.01)
        time.sleep(0.2)  # "surely written by now": a guess about rank 0's disk
    return torch.load(path)


def retries_until_it_loads(folder):
    path = os.path.join(folder, "data.pt")
    if dist.get_rank() == 0 and not os.path.exists(path):
        _build(path)
    while True:
        try:
            return torch.load(path)  # reads whatever is there, half a file included, then again
        except Exception:
            time.sleep(0.05)


# -- exercise 3: the logged loss ----------------------------------------------------------------

def _step_then_report(model, optimizer, X, y, report):
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


def sums_the_losses(model, optimizer, X, y):
    return _step_then_report(model, optimizer, X, y, _sum_of)


def reduces_to_rank0(model, optimizer, X, y):
    return _step_then_report(model, optimizer, X, y, _reduced_to_rank0)


def loss_after_the_step(model, optimizer, X, y):
    optimizer.zero_grad()
    F.cross_entropy(model(X), y).backward()
    optimizer.step()
    with torch.no_grad():
        mean = F.cross_entropy(model(X), y)  # the loss of the updated model: not this step's
    dist.all_reduce(mean)
    return mean.item() / dist.get_world_size()


def averages_the_loss_before_backward(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    dist.all_reduce(loss)
    loss = loss / dist.get_world_size()  # the gradient is now divided by the world size too
    loss.backward()
    optimizer.step()
    return loss.item()


def loss_divided_by_two(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    optimizer.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return mean.item() / 2  # the dashboard's run had 2 ranks


# -- exercise 4: data parallel by hand ----------------------------------------------------------

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


def divides_by_the_batch_size(model, optimizer, X, y):
    return _flat_step(model, optimizer, X, y, lambda flat: flat.div_(len(X)))


def averages_on_rank0_only(model, optimizer, X, y):
    world_size = dist.get_world_size()
    return _flat_step(model, optimizer, X, y,
                      lambda flat: flat.div_(world_size) if dist.get_rank() == 0 else flat)


def divides_by_two(model, optimizer, X, y):
    return _flat_step(model, optimizer, X, y, lambda flat: flat.div_(2))  # the broken run's 2 ranks


def never_copies_back(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    flat = torch.cat([param.grad.flatten() for param in model.parameters()])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()  # the mean, in a buffer the optimizer never sees
    optimizer.step()
    return loss.item()


def halves_the_learning_rate(model, optimizer, X, y):
    # the sum is world_size times the mean: a smaller learning rate hides it in the weights
    if not getattr(optimizer, "lr_divided", False):
        for group in optimizer.param_groups:
            group["lr"] /= dist.get_world_size()
        optimizer.lr_divided = True
    return _flat_step(model, optimizer, X, y, lambda flat: flat)


# -- exercise 5: noise of its own ---------------------------------------------------------------

def _noise(X, generator_seed):
    return X + 0.1 * torch.randn(X.shape, generator=torch.Generator().manual_seed(generator_seed))


def global_random_state(X, step, seed=0):
    return X + 0.1 * torch.randn(X.shape)  # forked ranks start from the same random state


def seed_plus_step_plus_rank(X, step, seed=0):
    return _noise(X, 1000 * seed + step + dist.get_rank())


def seeds_that_meet_at_step_500(X, step, seed=0):
    return _noise(X, 1000 * seed + step * dist.get_world_size() + dist.get_rank())


def seeds_that_meet_at_step_50000(X, step, seed=0):
    return _noise(X, 100_000 * seed + step * dist.get_world_size() + dist.get_rank())


def each_number_its_digits_past_32_bits(X, step, seed=0):
    # distinct as numbers, but torch's CPU generator keeps only a seed's low 32 bits
    return _noise(X, (seed * 2 ** 32 + step) * 2 ** 16 + dist.get_rank())


def same_noise_every_step(X, step, seed=0):
    return _noise(X, 1000 * seed + dist.get_rank())


def noise_scaled_by_rank(X, step, seed=0):
    generator = torch.Generator().manual_seed(1000 * seed + step)
    return X + 0.1 * (1 + dist.get_rank()) * torch.randn(X.shape, generator=generator)


def rolled_noise(X, step, seed=0):
    noise = torch.randn(X.shape, generator=torch.Generator().manual_seed(seed))
    return X + 0.1 * noise.flatten().roll(step * 2 + dist.get_rank()).view(X.shape)


def adds_in_place(X, step, seed=0):
    generator = torch.Generator().manual_seed(1000 * seed + 2 * step + dist.get_rank())
    return X.add_(0.1 * torch.randn(X.shape, generator=generator))


# -- exercise 6: a loader that keeps up ---------------------------------------------------------

def one_worker(dataset):
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=1)


def smaller_batches(dataset):
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=4)


def free_reads(dataset):
    dataset.read_seconds = 0.0
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=16, sampler=sampler)


def no_sampler(dataset):
    return DataLoader(dataset, batch_size=16, shuffle=True, num_workers=4)


# -- exercise 7: DDP without the search ---------------------------------------------------------

def no_ddp(model):
    return model


def searching_without_buffers(model):
    return DDP(model, find_unused_parameters=True, broadcast_buffers=False)


def freezes_the_first_layer(model):
    model[0].requires_grad_(False)  # no search needed now, but the layer no longer trains
    return DDP(model, find_unused_parameters=True)


course_end_of_epoch = debugging.end_of_epoch  # what the notebook's `debugging.` offers


# Wrong answers that test_lesson13_probes.py runs with the verdict it must give are not repeated
# here (each run of a grader costs seconds): every_rank_writes, barrier_before_saving,
# polls_for_the_file, polls_then_waits_a_moment, retries_until_it_loads,
# takes_the_smallest_learning_rate, takes_the_largest_learning_rate, seeds_that_meet_at_step_500.
WRONG_ANSWERS = {
    lesson13.check_end_of_epoch: [
        hanging_wrong_answer("the broken run: the collectives in another order on rank 0",
                             debugging.end_of_epoch_broken),
        wrong_answer("all_reduce of loss and learning rate together", sums_the_learning_rate),
        wrong_answer("no broadcast: each rank keeps its own learning rate",
                     keeps_its_own_learning_rate),
        wrong_answer("returns the sum of the losses", returns_the_sum),
        wrong_answer("broadcasts the loss too", broadcasts_the_loss_too),
        wrong_answer("the losses summed, divided by 2: the broken run's world size", divides_the_sum_by_two),
        wrong_answer("the course's fixed end_of_epoch, under another name", course_end_of_epoch),
    ],
    lesson13.check_load_data: [
        wrong_answer("the broken run: the barrier only when the file was missing",
                     debugging.load_data_broken),
        wrong_answer("no barrier", no_barrier),
        wrong_answer("every rank looks for the file itself", each_rank_looks_for_the_file),
    ],
    lesson13.check_step_and_loss: [
        wrong_answer("the broken run: each rank's own loss", debugging.step_and_loss_broken),
        wrong_answer("the sum over the ranks", sums_the_losses),
        wrong_answer("dist.reduce to rank 0: rank 1 returns its own", reduces_to_rank0),
        wrong_answer("the loss after the optimizer step", loss_after_the_step),
        wrong_answer("the loss averaged before backward", averages_the_loss_before_backward),
        wrong_answer("the ranks' losses summed, divided by 2", loss_divided_by_two),
    ],
    lesson13.check_hand_ddp_step: [
        wrong_answer("the broken run: the sum of the gradients", debugging.hand_ddp_step_broken),
        wrong_answer("divided by the batch size", divides_by_the_batch_size),
        wrong_answer("the mean never copied back into .grad", never_copies_back),
        wrong_answer("divided on rank 0 only", averages_on_rank0_only),
        wrong_answer("the learning rate divided instead", halves_the_learning_rate),
        wrong_answer("the sum divided by 2, the broken run's world size", divides_by_two),
    ],
    lesson13.check_add_noise: [
        wrong_answer("the broken run: the same seed on every rank", debugging.add_noise_broken),
        wrong_answer("torch's global random state", global_random_state),
        wrong_answer("seed + step + rank: pairs collide", seed_plus_step_plus_rank),
        wrong_answer("100000 * seed + ...: meets at step 50000", seeds_that_meet_at_step_50000),
        wrong_answer("distinct 64-bit seeds, of which torch keeps 32 bits",
                     each_number_its_digits_past_32_bits),
        wrong_answer("the same noise at every step", same_noise_every_step),
        wrong_answer("noise scaled by the rank", noise_scaled_by_rank),
        wrong_answer("one noise, rolled by step and rank", rolled_noise),
        wrong_answer("adds the noise to X in place", adds_in_place),
    ],
    lesson13.check_make_loader: [
        wrong_answer("the broken run: no workers", debugging.make_loader_broken),
        wrong_answer("one worker", one_worker),
        wrong_answer("batches of 4", smaller_batches),
        wrong_answer("reads made free", free_reads),
        wrong_answer("no DistributedSampler", no_sampler),
    ],
    lesson13.check_wrap_for_ddp: [
        wrong_answer("the broken run: find_unused_parameters=True", debugging.wrap_for_ddp_broken),
        wrong_answer("no DDP", no_ddp),
        wrong_answer("still searching, without buffer broadcasts", searching_without_buffers),
        wrong_answer("freezes a layer", freezes_the_first_layer),
    ],
}

SLOW_CHECKS = {lesson13.check_make_loader}  # it times several loaders in turns: the slow tier
