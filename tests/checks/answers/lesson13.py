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
from course_lib.training.data import make_dataset


from . import answer, wrong_answer  # noqa: F401


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
