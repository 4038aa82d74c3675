"""Lesson 04, exercise 3: the indices DistributedSampler deals this rank.

- indices for a rank: run inside ranks, on 2, 3 and 4 of them, indices_for_rank(n_samples, epoch,
  seed, drop_last) equals list(DistributedSampler(range(n_samples), shuffle=True, seed=seed,
  drop_last=drop_last)) after set_epoch(epoch) on the calling rank (its rank and world size from
  the process group), compared with torch's sampler itself: several epochs, sizes that divide and
  sizes that do not, padding longer than the dataset (1 sample on 4 ranks), and drop_last (even
  with fewer samples than ranks). A list, a tensor or any sequence of whole numbers, computed by
  the learner: indices a DistributedSampler deals are refused (the exercise says so).
"""
import torch

from ..engine import expect, expect_equal, grader
from ..engine.boundary import grading_seed
from ..engine.call_watch import calls_of
from ..engine.ranks import run_on_ranks

LAUNCH_TIMEOUT_S = 90
# world_size: [(n_samples, epoch, seed, drop_last)]: the easy cases first, then the edges
SAMPLER_CASES = {
    2: [(8, 0, 0, False), (8, 1, 0, False), (9, 2, 0, False), (9, 3, 0, True)],
    3: [(12, 5, 42, False), (13, 0, 3, False), (2, 1, 5, False), (13, 1, 3, True)],
    4: [(10, 2, 7, False), (10, 0, 1, False), (1, 0, 0, False), (6, 1, 9, True),
        (3, 4, 2, True)],
}


def sampler_indices(n_samples, world_size, rank, epoch, seed, drop_last=False):
    """torch's own answer: DistributedSampler's indices for `rank` in `epoch`."""
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n_samples), num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def _indices_on_rank(indices_for_rank, cases):
    """Inside a rank: the learner's indices for every case, as lists of ints (or what came back),
    and whether a DistributedSampler dealt them (the exercise computes them without one)."""
    from torch.utils.data import DistributedSampler

    results = []
    with calls_of(DistributedSampler.__iter__) as called:
        for n_samples, epoch, seed, drop_last in cases:
            got = indices_for_rank(n_samples, epoch, seed=seed, drop_last=drop_last)
            try:
                results.append([int(index) for index in got])
            except (TypeError, ValueError):
                results.append(repr(got)[:120])
    return {"indices": results, "sampler_used": bool(called)}


def grading_cases() -> dict:
    """SAMPLER_CASES with each seed drawn at grading time: grading_seed(seed), itself in a
    notebook. The sizes, epochs and worlds are the edges the cases test: they stay."""
    return {world_size: [(n_samples, epoch, grading_seed(seed), drop_last)
                         for n_samples, epoch, seed, drop_last in cases]
            for world_size, cases in SAMPLER_CASES.items()}


@grader("indices for a rank")
def check_indices_for_rank(indices_for_rank):
    for world_size, cases in grading_cases().items():
        per_rank = run_on_ranks(
            _indices_on_rank, indices_for_rank, cases, nprocs=world_size,
            what=f"indices_for_rank on {world_size} ranks", timeout=LAUNCH_TIMEOUT_S,
            hang_hint="the sampler needs no communication: a collective in your function waits "
                      "for ranks that never call it")
        expect(not any(results["sampler_used"] for results in per_rank),
               f"indices_for_rank on {world_size} ranks",
               "indices your function computes", "indices a DistributedSampler dealt",
               "the exercise is to compute them without the sampler: seed a generator with seed "
               "+ epoch, draw the permutation, pad or cut it, deal every world_size-th index")
        per_rank = [results["indices"] for results in per_rank]
        for index, (n_samples, epoch, seed, drop_last) in enumerate(cases):
            for rank, results in enumerate(per_rank):
                got = results[index]
                call = (f"indices_for_rank(n_samples={n_samples}, epoch={epoch}, seed={seed}, "
                        f"drop_last={drop_last}) on rank {rank} of {world_size}")
                expect(isinstance(got, list), call, "a list of ints", str(got),
                       "return the dataset indices, a list of whole numbers")
                expected = sampler_indices(n_samples, world_size, rank, epoch, seed, drop_last)
                expect_equal(got, expected, call, _sampler_hint(
                    got, expected, n_samples, world_size, rank, epoch, seed, drop_last))


def _sampler_hint(got, expected, n_samples, world_size, rank, epoch, seed, drop_last) -> str:
    """Which mistake gives `got`: the hint names the rank, the epoch or the count it is about."""
    if len(got) != len(expected):
        padding = len(expected) * world_size - n_samples
        why = (f"drop_last leaves {len(expected) * world_size} of the {n_samples} samples, "
               f"{len(expected)} per rank" if drop_last else
               f"the padding here ({padding} indices) is longer than the dataset itself "
               f"({n_samples})" if padding > n_samples else
               f"{n_samples} samples padded to {len(expected) * world_size}, {len(expected)} "
               "per rank" if padding else f"{n_samples} samples, {len(expected)} per rank")
        return f"rank {rank} of {world_size} got {len(got)} indices, the sampler {len(expected)}: {why}"
    same_case = (n_samples, world_size)
    if epoch != 0 and got == sampler_indices(*same_case, rank, 0, seed, drop_last):
        return f"at epoch {epoch} these are epoch 0's indices: the order must change every epoch"
    if got == contiguous_blocks(*same_case, rank, epoch, seed, drop_last):
        return (f"that is block {rank} of {len(got)} consecutive indices of the "
                "permutation; the sampler deals it like cards, one index to each rank in turn")
    for other_rank in range(world_size):
        if other_rank != rank and got == sampler_indices(*same_case, other_rank, epoch, seed,
                                                         drop_last):
            return f"those are rank {other_rank}'s indices, not rank {rank}'s"
    if sorted(got) == sorted(expected):
        return f"rank {rank} has the right indices in another order than the sampler's"
    return (f"rank {rank}'s {len(got)} indices differ from the sampler's: every rank must draw "
            f"the same permutation for epoch {epoch} (seed {seed}), without talking to the others")


# The sampler's recipe in parts, for the hints (and for the tests' wrong answers).

def epoch_permutation(n_samples, epoch, seed):
    """The permutation every rank draws in `epoch`, as DistributedSampler(shuffle=True) does."""
    return torch.randperm(n_samples, generator=torch.Generator().manual_seed(seed + epoch)).tolist()


def _padded(indices, total):
    """`indices` repeated from its start until it is `total` long (or cut to `total`)."""
    return (indices * (-(-total // max(len(indices), 1))))[:total]


def indices_per_rank(n_samples, world_size, drop_last):
    """How many indices the sampler deals each rank: the tail dropped, or padded."""
    return n_samples // world_size if drop_last else -(-n_samples // world_size)


def contiguous_blocks(n_samples, world_size, rank, epoch, seed=0, drop_last=False):
    """The usual mistake: rank `rank` gets the permutation's block `rank`, not every
    world_size-th index."""
    per_rank = indices_per_rank(n_samples, world_size, drop_last)
    indices = _padded(epoch_permutation(n_samples, epoch, seed), per_rank * world_size)
    return indices[rank * per_rank:(rank + 1) * per_rank]
