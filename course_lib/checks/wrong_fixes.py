"""Plausible wrong fixes of lesson 13's broken runs, one mistake each: lesson13.WRONG_ANSWERS
holds them, and tests/checks/test_checks.py makes sure each is rejected.

Some fix the symptom and hide the cause (a MIN that makes the ranks' learning rates agree, a poll
for a file that is still being written); some fix one part and break another.
"""
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ..training.data import make_dataset

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
