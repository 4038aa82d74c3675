"""Lesson 04's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import itertools
import math
import os
import statistics

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.data import DistributedSampler

from course_lib.checks import lesson04
from course_lib.checks.lesson04.buckets import BUCKET_WORLD_SIZE
from course_lib.checks.lesson04.overlap import seconds_within
from course_lib.checks.lesson04.sampler import (contiguous_blocks, epoch_permutation,
                                              indices_per_rank)
from course_lib.topics.scaling import StepTiming
from course_lib.topics.timeline import merge_intervals

from . import answer, wrong_answer


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


def indices_by_position(n_samples, epoch, seed=0, drop_last=False):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    order = torch.randperm(n_samples, generator=torch.Generator().manual_seed(seed + epoch))
    total = (n_samples // world_size if drop_last else -(-n_samples // world_size)) * world_size
    return [int(order[position % n_samples]) for position in range(rank, total, world_size)]


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


# Exercise 5's sweep, for its alternatives, its wrong answers and test_bucket_measure.py.
# A sweep recorded on 2 gloo ranks of a busy 2-core machine with the exercise's BUCKET_STEPS (ms
# per step; 3 rounds, the caps taking turns): (bucket_cap_mb, buckets per step, 8 timed steps)
RECORDED_BUCKET_ROUNDS = [
    (0.01, 48, (72.8, 58.2, 59.0, 87.6, 62.5, 52.9, 74.8, 47.5)),
    (0.05, 12, (26.8, 30.5, 33.4, 41.0, 36.9, 26.1, 25.3, 26.5)),
    (0.1, 7, (12.3, 8.1, 6.5, 6.6, 6.5, 19.3, 8.8, 6.7)),
    (0.25, 3, (13.0, 11.5, 13.2, 11.5, 11.3, 14.1, 8.0, 7.7)),
    (25, 1, (8.8, 11.2, 7.0, 11.1, 10.7, 10.2, 10.6, 12.2)),
    (0.01, 48, (81.7, 96.2, 93.5, 95.1, 29.9, 37.5, 31.7, 57.7)),
    (0.05, 12, (17.8, 12.9, 30.6, 22.5, 15.1, 17.5, 38.8, 38.1)),
    (0.1, 7, (10.9, 16.4, 25.8, 13.5, 31.6, 21.3, 13.1, 8.7)),
    (0.25, 3, (11.5, 18.8, 11.5, 16.0, 9.6, 11.7, 14.9, 11.0)),
    (25, 1, (10.7, 7.7, 5.3, 6.6, 6.2, 6.4, 8.8, 9.3)),
    (0.01, 48, (96.7, 24.8, 30.8, 28.2, 45.8, 72.0, 48.6, 23.4)),
    (0.05, 12, (27.7, 19.4, 13.0, 12.7, 23.9, 19.5, 22.9, 22.9)),
    (0.1, 7, (12.6, 30.3, 13.7, 19.9, 19.4, 26.6, 12.7, 20.3)),
    (0.25, 3, (7.2, 14.6, 12.0, 8.7, 11.4, 13.7, 11.1, 6.2)),
    (25, 1, (11.4, 23.6, 28.5, 12.5, 6.3, 15.1, 15.3, 12.1)),
]


def recorded_bucket_sweep(world_size=BUCKET_WORLD_SIZE, rounds=3, steps=8, caps=None,
                          buckets_scale=1, unit=1.0, buckets_at_every_cap=None) -> list:
    """RECORDED_BUCKET_ROUNDS as time_ddp_steps's StepTimings (seconds), optionally cut down, in
    another `unit` (1e3: milliseconds), or with typed-in bucket counts."""
    return [StepTiming(seconds=[ms / 1e3 * unit for ms in times[:steps]], world_size=world_size,
                       bucket_cap_mb=cap, buckets=buckets_at_every_cap or max(
                           1, buckets // buckets_scale) if world_size > 1 else None)
            for index, (cap, buckets, times) in enumerate(RECORDED_BUCKET_ROUNDS)
            if index // 5 < rounds and (caps is None or cap in caps)]


def made_up_bucket_sweep() -> list:
    """The recorded sweep's shape (caps, rounds, buckets) with typed-in times: 1 ms a step."""
    return [StepTiming(seconds=[1e-3] * len(timing.seconds), world_size=timing.world_size,
                       bucket_cap_mb=timing.bucket_cap_mb, buckets=timing.buckets)
            for timing in recorded_bucket_sweep()]


def pooled_medians(sweep) -> dict:
    """{cap: the median of all its timed steps, every round together}, as the grader pools them."""
    steps = {}
    for timing in sweep:
        steps.setdefault(float(timing.bucket_cap_mb), []).extend(timing.seconds)
    return {cap: statistics.median(seconds) for cap, seconds in steps.items()}


def median_of_round_medians(sweep):
    """{cap: [its rounds' StepTimings]}, and the cap whose rounds' medians have the least median."""
    rounds = {}
    for timing in sweep:
        rounds.setdefault(timing.bucket_cap_mb, []).append(timing)
    medians = {cap: np.median([np.median(timing.seconds) for timing in timings])
               for cap, timings in rounds.items()}
    return rounds, np.float64(min(medians, key=medians.get))


def fewest_buckets_within_five_percent(sweep):
    """A tuple of the timings, and the largest cap (fewest buckets) within 5% of the fastest."""
    caps = sorted({timing.bucket_cap_mb for timing in sweep})
    medians = [np.median(np.concatenate([timing.seconds for timing in sweep
                                         if timing.bucket_cap_mb == cap])) for cap in caps]
    best = max(cap for cap, median in zip(caps, medians) if median <= 1.05 * min(medians))
    return tuple(sweep), torch.tensor(float(best))  # a 0-dim tensor


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
        answer("a comprehension over positions modulo n_samples", indices_by_position),
        answer("itertools.cycle padding, a tensor, rank from the environment",
               indices_with_a_cycle),
    ],
    lesson04.check_hidden_share: [
        answer("sampling a million instants, a numpy float", hidden_share_by_sampling_time),
        answer("a sweep over the span boundaries, a tensor", hidden_share_by_a_sweep),
    ],
    lesson04.check_best_bucket_cap: [
        answer("a dict of each cap's rounds, the median of the rounds' medians, a numpy float",
               *median_of_round_medians(recorded_bucket_sweep())),
        answer("a tuple, the fewest buckets within 5% of the fastest, a 0-dim tensor",
               *fewest_buckets_within_five_percent(recorded_bucket_sweep())),
    ],
}


# Wrong answers

# exercise 1: the broadcast at construction

def broadcast_nothing(model):
    pass


def average_parameters(model):
    with torch.no_grad():
        for param in model.parameters():
            dist.all_reduce(param)
            param /= dist.get_world_size()


def broadcast_first_parameter_only(model):
    with torch.no_grad():
        dist.broadcast(next(model.parameters()), src=0)


def broadcast_a_copy(model):
    # broadcasting into a copy leaves the model's own tensors as they were
    for param in model.parameters():
        dist.broadcast(param.detach().clone(), src=0)


def broadcast_parameters_only(model):
    # right for the parameters, but BatchNorm's running statistics stay each rank's own
    with torch.no_grad():
        for param in model.parameters():
            dist.broadcast(param, src=0)


def broadcast_trainable_only(model):
    # skips the frozen bias, which DDP broadcasts too
    with torch.no_grad():
        for tensor in [p for p in model.parameters() if p.requires_grad] + list(model.buffers()):
            dist.broadcast(tensor, src=0)


def send_to_rank_1(model):
    """Point-to-point from lesson 03: rank 0 sends to rank 1, right on 2 ranks only."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            if dist.get_rank() == 0:
                dist.send(tensor, dst=1)
            elif dist.get_rank() == 1:
                dist.recv(tensor, src=0)


def replace_the_parameters(model):
    # new Parameter objects with rank 0's values: an optimizer made before keeps the old ones
    for module in model.modules():
        for name, param in list(module.named_parameters(recurse=False)):
            received = param.detach().clone()
            dist.broadcast(received, src=0)
            setattr(module, name, torch.nn.Parameter(received, param.requires_grad))
    with torch.no_grad():
        for buffer in model.buffers():
            dist.broadcast(buffer, src=0)


# exercise 2: DDP by hand

def step_sums_gradients(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    for param in model.parameters():
        dist.all_reduce(param.grad)
    optimizer.step()
    return loss.item()


def step_averages_the_loss(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    dist.all_reduce(loss)  # the value is averaged, but autograd passes the local gradient through
    loss = loss / dist.get_world_size()
    loss.backward()
    optimizer.step()
    return loss.item()


def step_forgets_all_reduce(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    for param in model.parameters():
        param.grad /= dist.get_world_size()
    optimizer.step()
    return loss.item()


def step_stub(model, optimizer, X, y):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


def step_divides_by_two(model, optimizer, X, y):
    """Right on 2 ranks only: the world size written as a number."""
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= 2
    optimizer.step()
    return loss.item()


def step_broadcasts_rank_0s_gradients(model, optimizer, X, y):
    """The ranks agree, but every rank steps with rank 0's gradient, not the mean."""
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    for param in model.parameters():
        dist.broadcast(param.grad, src=0)
    optimizer.step()
    return loss.item()


# exercise 3: indices for a rank, each mistake written with rank and world_size as arguments

def own_indices(n_samples, world_size, rank, epoch, seed=0, drop_last=False):
    """The sampler's recipe computed without DistributedSampler, which the exercise forbids."""
    indices = epoch_permutation(n_samples, epoch, seed)
    total = indices_per_rank(n_samples, world_size, drop_last) * world_size
    return (indices * (total // max(n_samples, 1) + 1))[:total][rank::world_size]


def ignores_epoch(n_samples, world_size, rank, epoch, seed=0, drop_last=False):
    return own_indices(n_samples, world_size, rank, 0, seed, drop_last)  # no set_epoch


def seeds_each_rank(n_samples, world_size, rank, epoch, seed=0, drop_last=False):
    indices = epoch_permutation(n_samples, epoch, seed + rank)
    return indices[:indices_per_rank(n_samples, world_size, drop_last)]


def no_padding(n_samples, world_size, rank, epoch, seed=0, drop_last=False):
    return epoch_permutation(n_samples, epoch, seed)[rank::world_size]


def pads_once(n_samples, world_size, rank, epoch, seed=0, drop_last=False):
    """Pads with the permutation's first indices once: too short when the padding is longer than
    the dataset (1 sample on 4 ranks)."""
    indices = epoch_permutation(n_samples, epoch, seed)
    total = indices_per_rank(n_samples, world_size, drop_last) * world_size
    indices = indices[:total] if drop_last else indices + indices[:total - n_samples]
    return indices[rank::world_size]


def ignores_drop_last(n_samples, world_size, rank, epoch, seed=0, drop_last=False):
    return own_indices(n_samples, world_size, rank, epoch, seed)


def assumes_two_ranks(n_samples, world_size, rank, epoch, seed=0, drop_last=False):
    return own_indices(n_samples, 2, rank % 2, epoch, seed, drop_last)


def on_this_rank(mistake):
    """A mistake written with rank and world_size as arguments, as the exercise's function: it
    reads them from the process group."""
    def indices_for_rank(n_samples, epoch, seed=0, drop_last=False):
        return mistake(n_samples, dist.get_world_size(), dist.get_rank(), epoch, seed, drop_last)
    return indices_for_rank


# exercise 4: the hidden share of the all-reduce

def wrong_share(mistake):
    """A hidden_share that makes one mistake."""

    def hidden_share(timeline, rank, step):
        if mistake == "rank 0":
            rank = 0
        allreduces = [(s.start, s.end) for s in timeline.select(rank, step, "allreduce")]
        if not allreduces:
            return 0.0 if mistake == "zero without all-reduce" else None
        [backward] = timeline.select(rank, step, "backward")
        [wait] = timeline.select(rank, step, "wait")
        merged = merge_intervals(allreduces)
        total = sum(end - start for start, end in merged)
        if mistake == "whole backward":
            return seconds_within(merged, backward.start, backward.end) / total
        if mistake == "sums buckets":
            return (sum(seconds_within([span], backward.start, wait.start) for span in allreduces)
                    / sum(end - start for start, end in allreduces))
        hidden = seconds_within(merged, backward.start, wait.start)
        return {"seconds": hidden, "exposed": 1 - hidden / total}.get(mistake, hidden / total)

    return hidden_share


def share_stub(timeline, rank, step):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


# exercise 5: the fastest bucket size, from the recorded sweep

def fastest_cap(sweep=None):
    medians = pooled_medians(sweep or recorded_bucket_sweep())
    return min(medians, key=medians.get)


def fastest_in_the_first_round():
    return fastest_cap(recorded_bucket_sweep(rounds=1))


def fastest_step_seconds():
    return min(pooled_medians(recorded_bucket_sweep()).values())


WRONG_ANSWERS = {
    lesson04.check_broadcast_parameters: [
        wrong_answer("does nothing", broadcast_nothing),
        wrong_answer("averages the parameters with all_reduce", average_parameters),
        wrong_answer("broadcasts only the first parameter", broadcast_first_parameter_only),
        wrong_answer("broadcasts into copies of the parameters", broadcast_a_copy),
        wrong_answer("broadcasts the parameters, not the buffers", broadcast_parameters_only),
        wrong_answer("skips the frozen parameter", broadcast_trainable_only),
        wrong_answer("replaces the parameters with new objects", replace_the_parameters),
        wrong_answer("rank 0 sends to rank 1: right on 2 ranks only", send_to_rank_1),
    ],
    lesson04.check_train_step_by_hand: [
        wrong_answer("sums the gradients without dividing by world_size", step_sums_gradients),
        wrong_answer("averages the loss instead of the gradients", step_averages_the_loss),
        wrong_answer("divides the gradients but never all-reduces them", step_forgets_all_reduce),
        wrong_answer("divides by 2 whatever the world size", step_divides_by_two),
        wrong_answer("broadcasts rank 0's gradients", step_broadcasts_rank_0s_gradients),
        wrong_answer("the lesson's stub", step_stub),
    ],
    lesson04.check_indices_for_rank: [
        wrong_answer("gives each rank a contiguous block", on_this_rank(contiguous_blocks)),
        wrong_answer("ignores the epoch (no set_epoch)", on_this_rank(ignores_epoch)),
        wrong_answer("shuffles with a different seed on each rank", on_this_rank(seeds_each_rank)),
        wrong_answer("does not pad to a multiple of world_size", on_this_rank(no_padding)),
        wrong_answer("pads once, too short when the padding exceeds the dataset",
                     on_this_rank(pads_once)),
        wrong_answer("ignores drop_last", on_this_rank(ignores_drop_last)),
        wrong_answer("assumes 2 ranks", on_this_rank(assumes_two_ranks)),
        wrong_answer("returns DistributedSampler's indices, which the exercise computes",
                     indices_from_distributed_sampler),
    ],
    lesson04.check_hidden_share: [
        wrong_answer("counts the wait at the end of backward as hidden",
                     wrong_share("whole backward")),
        wrong_answer("adds up overlapping buckets twice", wrong_share("sums buckets")),
        wrong_answer("returns the hidden seconds", wrong_share("seconds")),
        wrong_answer("returns the exposed share", wrong_share("exposed")),
        wrong_answer("returns 0.0 for a step without all-reduce",
                     wrong_share("zero without all-reduce")),
        wrong_answer("reads rank 0's spans for every rank", wrong_share("rank 0")),
        wrong_answer("the lesson's stub", share_stub),
    ],
    lesson04.check_best_bucket_cap: [
        wrong_answer("picks the smallest cap, for the earliest first bucket",
                     recorded_bucket_sweep(), 0.01),
        wrong_answer("chooses by the first round only, which one burst of load decides",
                     recorded_bucket_sweep(), fastest_in_the_first_round()),
        wrong_answer("reports the fastest median step's seconds, not its cap",
                     recorded_bucket_sweep(), fastest_step_seconds()),
        wrong_answer("records the sweep in the notebook's process, not on 2 ranks",
                     recorded_bucket_sweep(world_size=1), fastest_cap()),
        wrong_answer("a sweep of 3 caps", recorded_bucket_sweep(caps=(0.01, 0.1, 25)), 25),
        wrong_answer("a sweep that stops at 0.25 MiB, below DDP's default",
                     recorded_bucket_sweep(caps=(0.01, 0.05, 0.1, 0.25)), 0.25),
        wrong_answer("one round of 5 steps per cap", recorded_bucket_sweep(rounds=1, steps=5),
                     fastest_cap(recorded_bucket_sweep(rounds=1, steps=5))),
        wrong_answer("the course's 2-layer MLP: too few gradient tensors to bucket",
                     recorded_bucket_sweep(buckets_scale=12), fastest_cap()),
        wrong_answer("a made-up sweep: 1 ms per step at every cap", made_up_bucket_sweep(), 25),
        wrong_answer("step times in milliseconds", recorded_bucket_sweep(unit=1e3), fastest_cap()),
        wrong_answer("step times in microseconds", recorded_bucket_sweep(unit=1e6), fastest_cap()),
        wrong_answer("bucket counts typed in, not recorded (48 at every cap)",
                     recorded_bucket_sweep(buckets_at_every_cap=48), fastest_cap()),
    ],
}
