"""How each rank gets its share of the data: a DistributedSampler per rank, resumable mid-epoch.

Single and DP use the same sampler with one shard, so every strategy sees the same sample order.
"""
from itertools import islice

import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler


class ResumableSampler(Sampler):
    """A DistributedSampler that can skip the first samples of one epoch (when resuming inside it)."""

    def __init__(self, dataset, num_shards: int, rank: int, shuffle: bool, seed: int, drop_last: bool):
        self.shard = DistributedSampler(dataset, num_replicas=num_shards, rank=rank,
                                        shuffle=shuffle, seed=seed, drop_last=drop_last)
        self.skip = 0

    def set_epoch(self, epoch: int, skip: int = 0) -> None:
        # The shuffle is seeded by (seed, epoch): every rank draws the same permutation, then its shard.
        self.shard.set_epoch(epoch)
        self.skip = skip

    def __iter__(self):
        return islice(iter(self.shard), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.shard) - self.skip, 0)


def make_loader(dataset, config, num_shards: int, rank: int, loader_batch_size: int) -> DataLoader:
    """The DataLoader for one rank.

    The course's seeding rule, as the Trainer applies it: the model is built first (DDP then
    broadcasts rank 0's weights); the sampler shuffles with its own (seed, epoch), so every rank
    draws the same permutation and takes its own shard; everything else random differs per rank.
    Here that is the loader's generator, seeded seed + rank: each `iter(loader)` draws the workers'
    base seed from it (worker k seeds torch and random with base + k, numpy with a value derived
    from (base, k)), so no two ranks' workers share a seed, and iterating never touches the global
    RNG (exact resume).
    """
    too_little = num_shards * loader_batch_size
    if len(dataset) < too_little:
        raise ValueError(
            f"the dataset has {len(dataset)} samples, fewer than one batch for every rank "
            f"({num_shards} x {loader_batch_size} = {too_little}); use more data, a smaller "
            f"batch_size, or fewer ranks")
    sampler = ResumableSampler(dataset, num_shards, rank, config.shuffle, config.seed, config.drop_last)
    workers = {}
    if config.num_workers > 0:
        workers = {"persistent_workers": config.persistent_workers,
                   "prefetch_factor": config.prefetch_factor}
    return DataLoader(
        dataset, batch_size=loader_batch_size, sampler=sampler, drop_last=config.drop_last,
        num_workers=config.num_workers, pin_memory=config.pin_memory,
        generator=torch.Generator().manual_seed(config.seed + rank), **workers)
