"""The end of an epoch as the grader feeds it to a learner's end_of_epoch: each rank's epoch loss
and learning rate for two epochs, and what the function returned on each rank.

In a notebook the inputs are EPOCH_LOSSES and LEARNING_RATES; in class grading they are drawn
from the grading seed (boundary.grading_seed) with the same traps: the ranks' losses differ, and
rank 0's rate is the largest in the first epoch (rank 1 knows none) and the smallest in the
second (rank 1's is stale), so a rule that makes the ranks agree on another value is seen.
"""
import random

import torch.distributed as dist

from ..engine.boundary import grading_seed
from .shard_training import WORLD_SIZE, numbers

EPOCH_LOSSES = [[1.5, 2.5], [0.75, 1.25]]  # [epoch][rank]
LEARNING_RATES = [[0.1, 0.0], [0.05, 0.3]]  # rank 0 decides; rank 1 knows none, then a stale one
EPOCH_SEED = 13


def epoch_inputs() -> tuple:
    """(epoch losses, learning rates), each [epoch][rank], for this grading."""
    seed = grading_seed(EPOCH_SEED)
    if seed == EPOCH_SEED:
        return EPOCH_LOSSES, LEARNING_RATES
    draw = random.Random(seed)
    losses = []
    while len(losses) < len(EPOCH_LOSSES):
        pair = [round(draw.uniform(0.2, 3.0), 3) for _ in range(WORLD_SIZE)]
        if abs(pair[0] - pair[1]) > 0.05:  # a rank's own loss is not the mean
            losses.append(pair)
    stale = round(draw.uniform(0.01, 0.2), 3)
    rates = [[round(draw.uniform(0.05, 0.5), 3), 0.0],
             [stale, round(stale * draw.uniform(2.0, 6.0), 3)]]
    return losses, rates


def epoch_ends_on_rank(end_of_epoch, losses: list, rates: list) -> list:
    """In a rank: what end_of_epoch returned in each epoch, as numbers (None: not two numbers)."""
    rank = dist.get_rank()
    return [numbers(end_of_epoch(losses[epoch][rank], rates[epoch][rank]) or ())
            for epoch in range(len(losses))]


def learning_rate_hint(got: float, rates: list) -> str:
    if abs(got - sum(rates)) < 1e-6:
        return "that is every rank's rate added up: rank 1's value counts, and it must not"
    if abs(got - min(rates)) < 1e-6 or abs(got - max(rates)) < 1e-6:
        return ("the ranks agree, but on rank 1's value: a rule that makes them agree hides that "
                "rank 1's rate is wrong; rank 0 runs the schedule, so its value is the one")
    if abs(got - rates[1]) < 1e-6:
        return "rank 1 kept its own (stale) value: rank 0's has to reach it"
    return "rank 0 runs the schedule: its value, unchanged, on every rank"
