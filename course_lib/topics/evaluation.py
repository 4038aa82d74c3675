"""Distributed evaluation: what each rank of a DistributedSampler sees, and the one-process metric
every distributed evaluation must reproduce.

DistributedSampler gives every rank ceil(N / W) indices: when W does not divide N it repeats the
first indices of the (shuffled or not) order to fill the last ranks' shares, or, with
drop_last=True, drops the tail (torch/utils/data/distributed.py, __init__ and __iter__). A metric
averaged over what the ranks saw then counts some samples twice, or misses some.
"""
import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from ..training.data import make_dataset
from ..training.models import make_model


def make_eval_task(n_samples: int, seed: int = 0):
    """(model, dataset): the course's model (weights from `seed`, in eval mode) and `n_samples`
    of the course's data (from seed + 1), a TensorDataset of (features, label)."""
    model = make_model(seed=seed).eval()
    return model, make_dataset(n_samples=n_samples, seed=seed + 1)


@torch.no_grad()
def sample_metrics(model, dataset, indices=None):
    """(losses, correct): each sample's cross-entropy and whether its prediction is right, in
    float64, for `indices` (every sample when None), in that order, repeats included."""
    X, y = dataset.tensors
    if indices is not None:
        index = torch.as_tensor(list(indices), dtype=torch.long)
        X, y = X[index], y[index]
    logits = model(X).double()
    return F.cross_entropy(logits, y, reduction="none"), (logits.argmax(dim=1) == y).double()


def exact_metrics(model, dataset) -> tuple:
    """(mean loss, accuracy) over every sample once: what one process reports."""
    losses, correct = sample_metrics(model, dataset)
    return losses.mean().item(), correct.mean().item()


def sampler_shares(n_samples: int, world_size: int, drop_last: bool = False,
                   shuffle: bool = False, seed: int = 0) -> list:
    """[the indices DistributedSampler deals rank r] for every rank, without a process group."""
    return [list(DistributedSampler(range(n_samples), num_replicas=world_size, rank=rank,
                                    shuffle=shuffle, seed=seed, drop_last=drop_last))
            for rank in range(world_size)]
