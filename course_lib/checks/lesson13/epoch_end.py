"""The end of an epoch as the grader feeds it to a learner's end_of_epoch: each rank's epoch loss
and learning rate for two epochs, what the function returned on each rank, and the verdict on it
(judge_epoch_end); on 2 ranks, then on 3 (a mean written as "/ 2" shows there).

In a notebook the inputs are EPOCH_LOSSES and LEARNING_RATES (WIDER_LOSSES and WIDER_RATES on 3
ranks); in class grading they are drawn from the grading seed (boundary.grading_seed) with the
same traps: the ranks' losses differ, and rank 0's rate is the largest in the first epoch (the
others know none) and the smallest in the second (theirs are stale), so a rule that makes the
ranks agree on another value is seen.
"""
import random

import torch.distributed as dist

from ..engine import expect
from ..engine.boundary import grading_seed
from .shard_training import WORLD_SIZE, numbers

EPOCH_LOSSES = [[1.5, 2.5], [0.75, 1.25]]  # [epoch][rank]
LEARNING_RATES = [[0.1, 0.0], [0.05, 0.3]]  # rank 0 decides; rank 1 knows none, then a stale one
WIDER_WORLD = 3
WIDER_LOSSES = [[1.5, 2.5, 0.25], [0.75, 1.25, 2.75]]
WIDER_RATES = [[0.1, 0.0, 0.0], [0.05, 0.3, 0.2]]
EPOCH_SEED = 13


def epoch_inputs(world_size: int = WORLD_SIZE) -> tuple:
    """(epoch losses, learning rates), each [epoch][rank], for this grading on `world_size` ranks."""
    seed = grading_seed(EPOCH_SEED)
    if seed == EPOCH_SEED:
        return (EPOCH_LOSSES, LEARNING_RATES) if world_size == WORLD_SIZE else (WIDER_LOSSES, WIDER_RATES)
    draw = random.Random(seed + 1000 * (world_size - WORLD_SIZE))
    losses = []
    while len(losses) < len(EPOCH_LOSSES):
        drawn = [round(draw.uniform(0.2, 3.0), 3) for _ in range(world_size)]
        if all(abs(loss - sum(drawn) / world_size) > 0.05 for loss in drawn):  # no rank's own is the mean
            losses.append(drawn)
    stale = round(draw.uniform(0.01, 0.2), 3)
    rates = [[round(draw.uniform(0.05, 0.5), 3)] + [0.0] * (world_size - 1),
             [stale] + [round(stale * draw.uniform(2.0, 6.0), 3) for _ in range(world_size - 1)]]
    return losses, rates


def epoch_ends_on_rank(end_of_epoch, losses: list, rates: list) -> list:
    """In a rank: what end_of_epoch returned in each epoch, as numbers (None: not two numbers)."""
    rank = dist.get_rank()
    return [numbers(end_of_epoch(losses[epoch][rank], rates[epoch][rank]) or ())
            for epoch in range(len(losses))]


def learning_rate_hint(got: float, rates: list, rank: int = 1) -> str:
    if abs(got - sum(rates)) < 1e-6:
        return "that is every rank's rate added up: the other ranks' values count, and they must not"
    if abs(got - min(rates)) < 1e-6 or abs(got - max(rates)) < 1e-6:
        return ("the ranks agree, but on another rank's value: a rule that makes them agree hides "
                "that the other ranks' rates are wrong; rank 0 runs the schedule, so its value is the one")
    if rank and abs(got - rates[rank]) < 1e-6:
        return f"rank {rank} kept its own (stale) value: rank 0's has to reach it"
    return "rank 0 runs the schedule: its value, unchanged, on every rank"


def judge_epoch_end(got, losses, rates, rank, epoch):
    """What one rank returned in one epoch (numbers, or None), against the mean and rank 0's rate."""
    world_size, mean, lr = len(losses), sum(losses) / len(losses), rates[0]
    where = (f"what end_of_epoch returns on rank {rank} in epoch {epoch} (epoch losses {losses}, "
             f"learning rates {rates} on ranks {', '.join(map(str, range(world_size)))})")
    expect(got is not None and len(got) == 2, where, "(mean loss, learning rate): two numbers",
           repr(got), "return the pair, as the broken version does")
    if abs(got[0] - mean) > 1e-6:
        hint = ("that is the ranks' losses added up, not their mean" if abs(got[0] - sum(losses)) < 1e-6
                else f"that is the ranks' losses added up and divided by 2, not by the {world_size} "
                "ranks: divide by dist.get_world_size()" if abs(got[0] - sum(losses) / 2) < 1e-6
                else f"rank {rank} returned its own loss" if abs(got[0] - losses[rank]) < 1e-6
                else "the mean of every rank's epoch loss, on every rank")
        expect(False, where + ", its mean loss", f"{mean:g}", f"{got[0]:g}", hint)
    expect(abs(got[1] - lr) <= 1e-6, where + ", its learning rate", f"rank 0's, {lr:g}",
           f"{got[1]:g}", learning_rate_hint(got[1], rates, rank))
