"""The capstone's oracle: train.py's training as one process on the whole global batch, the order
DistributedSampler deals each epoch, and what a rank that logs only its own share would print.

Its numbers are train.py's own: tests/checks/test_capstone.py runs train.py and compares.
"""
import re

SAMPLES, GLOBAL_BATCH_SIZE, MICRO_BATCH_SIZE = 256, 32, 8  # train.py's constants
LR, MOMENTUM, SEED = 0.2, 0.9, 0
WORLD_SIZE, EPOCHS = 2, 3
STEPS_PER_EPOCH = SAMPLES // GLOBAL_BATCH_SIZE
LOSS_LINE = re.compile(r"\bepoch (\d+) step (\d+) loss (\S+)")  # what train.py prints each step


def epoch_order(epoch: int) -> list:
    """The order DistributedSampler(seed=SEED) deals after set_epoch(epoch), before sharding; with
    world_size 1 it is also the order of train.py's RandomSampler seeded with SEED + epoch."""
    import torch

    return torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()


def rank_share(epoch: int, rank: int, world_size: int) -> list:
    return epoch_order(epoch)[rank::world_size]


def oracle(world_size: int = WORLD_SIZE, epochs: int = EPOCHS):
    """One process, one optimizer step per global batch of GLOBAL_BATCH_SIZE samples.

    Returns {epoch: [loss of each step]} and {epoch: [[rank r's loss on its share of each step's
    batch] for each rank]}, the latter being what a rank that skips the all-reduce would print.
    """
    import torch
    import torch.nn.functional as F

    from ...training.data import make_dataset
    from ...training.models import make_model

    X, y = make_dataset(SAMPLES).tensors
    model = make_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses, shares = {}, {}
    for epoch in range(epochs):
        order = torch.tensor(epoch_order(epoch))
        losses[epoch], shares[epoch] = [], [[] for _ in range(world_size)]
        for batch in order.split(GLOBAL_BATCH_SIZE):
            with torch.no_grad():  # rank r's share of a step: every world_size-th sample from r
                for rank in range(world_size):
                    part = batch[rank::world_size]
                    shares[epoch][rank].append(F.cross_entropy(model(X[part]), y[part]).item())
            optimizer.zero_grad()
            loss = F.cross_entropy(model(X[batch]), y[batch])
            loss.backward()
            optimizer.step()
            losses[epoch].append(loss.item())
    return losses, shares


def loss_lines(process) -> list:
    """(epoch, step, loss) for each `epoch E step S loss L` line a process printed."""
    matches = [LOSS_LINE.search(line) for line in process.stdout.splitlines()]
    return [(int(match[1]), int(match[2]), _float(match[3])) for match in matches if match]


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")
