"""Lesson 04's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import itertools
import math
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.data import DistributedSampler

from course_lib.checks import lesson04
from test_bucket_measure import BUCKET_ALTERNATIVES  # lesson 04's bucket sweep, answered 2 ways


from . import answer, wrong_answer  # noqa: F401


def broadcast_one_flat_vector(model):
    vector = parameters_to_vector(model.parameters()).detach()
    dist.broadcast(vector, src=0)
    with torch.no_grad():
        vector_to_parameters(vector, model.parameters())
    handles = [dist.broadcast(buffer, src=0, async_op=True) for buffer in model.buffers()]
    for handle in handles:
        handle.wait()


def broadcast_the_state_dict_as_objects(model):
    state = [model.state_dict() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(state, src=0)
    model.load_state_dict(state[0])


def train_step_with_one_flat_all_reduce(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    grads = [parameter.grad for parameter in model.parameters()]
    flat = torch.cat([grad.flatten() for grad in grads]) / dist.get_world_size()
    dist.all_reduce(flat)
    start = 0
    for grad in grads:
        grad.copy_(flat[start:start + grad.numel()].view_as(grad))
        start += grad.numel()
    optimizer.step()
    return loss.item()


def train_step_with_all_gather(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    for parameter in model.parameters():
        everyone = [torch.empty_like(parameter.grad) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, parameter.grad)
        parameter.grad = torch.stack(everyone).mean(dim=0)
    optimizer.step()
    return float(loss)


def indices_from_distributed_sampler(n_samples, epoch, seed=0, drop_last=False):
    sampler = DistributedSampler(range(n_samples), shuffle=True, seed=seed,  # the group's rank
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def indices_with_a_cycle(n_samples, epoch, seed=0, drop_last=False):
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])  # torchrun's
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.randperm(n_samples, generator=generator)
    rows = n_samples // world_size if drop_last else math.ceil(n_samples / world_size)
    total = rows * world_size
    if total == 0:
        return torch.empty(0, dtype=torch.long)
    padded = torch.tensor(list(itertools.islice(itertools.cycle(order.tolist()), total)))
    return padded.view(-1, world_size)[:, rank]  # a tensor, not a list


def hidden_share_by_sampling_time(timeline, rank, step):
    """A million instants across the all-reduces: which are all-reducing, and which of those
    backward was still computing. Approximate (the grader allows 0.01); a numpy float."""
    allreduces = timeline.select(rank, step, "allreduce")
    if len(allreduces) == 0:
        return None
    backward = timeline.select(rank, step, "backward")[0]
    wait = timeline.select(rank, step, "wait")[0]
    first, last = min(s.start for s in allreduces), max(s.end for s in allreduces)
    instants = np.linspace(first, last, 1_000_001)
    busy = np.zeros(instants.shape, dtype=bool)
    for span in allreduces:
        busy |= (instants >= span.start) & (instants < span.end)
    computing = (instants >= backward.start) & (instants < wait.start)
    return np.mean(busy & computing) / np.mean(busy)  # a numpy float


def hidden_share_by_a_sweep(timeline, rank, step):
    """Walk the span boundaries in time order, counting the buckets in flight; a 0-dim tensor."""
    spans = [span for span in timeline.spans if span.rank == rank and span.step == step]
    edges = sorted([(s.start, +1) for s in spans if s.lane == "comm"]
                   + [(s.end, -1) for s in spans if s.lane == "comm"])
    if not edges:
        return None
    computing_until = next(s.start for s in spans if s.phase == "wait")
    in_flight, previous, hidden, total = 0, None, 0.0, 0.0
    for time, change in edges:
        if in_flight > 0:
            total += time - previous
            hidden += max(0.0, min(time, computing_until) - previous)
        in_flight, previous = in_flight + change, time
    return torch.tensor(hidden / total)


ALTERNATIVES = {
    lesson04.check_broadcast_parameters: [
        answer("one flat vector", broadcast_one_flat_vector),
        answer("broadcast_object_list of the state_dict", broadcast_the_state_dict_as_objects),
    ],
    lesson04.check_train_step_by_hand: [
        answer("one flat all-reduce, divided first", train_step_with_one_flat_all_reduce),
        answer("all_gather and mean", train_step_with_all_gather),
    ],
    lesson04.check_indices_for_rank: [
        answer("DistributedSampler itself, rank from the group", indices_from_distributed_sampler),
        answer("itertools.cycle padding, a tensor, rank from the environment",
               indices_with_a_cycle),
    ],
    lesson04.check_hidden_share: [
        answer("sampling a million instants, a numpy float", hidden_share_by_sampling_time),
        answer("a sweep over the span boundaries, a tensor", hidden_share_by_a_sweep),
    ],
    lesson04.check_best_bucket_cap: BUCKET_ALTERNATIVES,
}
