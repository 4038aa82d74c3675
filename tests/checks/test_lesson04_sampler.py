"""Lesson 04's exercise 3 against torch's DistributedSampler itself, on the edges its old recipe
missed (padding longer than the dataset, drop_last), without starting ranks."""
import pytest

from answers.lesson04 import pads_once
from course_lib.checks.lesson04 import sampler


def every_case():
    return [(n, world_size, rank, epoch, seed, drop_last)
            for world_size, cases in sampler.SAMPLER_CASES.items()
            for n, epoch, seed, drop_last in cases for rank in range(world_size)]


def test_the_cases_hold_the_edges():
    cases = {(n, world_size, drop_last) for n, world_size, _, _, _, drop_last in every_case()}
    assert (1, 4, False) in cases                      # padding (3) longer than the dataset (1)
    assert any(drop_last and n < ws for n, ws, drop_last in cases)   # drop_last, no sample left
    assert any(drop_last and n % ws for n, ws, drop_last in cases)   # drop_last drops a tail
    assert {epoch for *_, epoch, _, _ in every_case()} >= {0, 1, 2, 3}


@pytest.mark.parametrize("n, world_size, rank, epoch, seed, drop_last", every_case())
def test_the_lessons_recipe_is_distributed_samplers(n, world_size, rank, epoch, seed, drop_last):
    # the solution's recipe, as the notebook writes it, with rank and world size as arguments
    import torch

    indices = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    if drop_last:
        indices = indices[:n // world_size * world_size]
    else:
        total = -(-n // world_size) * world_size
        while len(indices) < total:
            indices += indices[:total - len(indices)]
    assert indices[rank::world_size] == sampler.sampler_indices(n, world_size, rank, epoch, seed,
                                                                drop_last)


def test_padding_once_differs_from_the_sampler_only_where_the_padding_exceeds_the_dataset():
    differ = {(n, world_size) for n, world_size, rank, epoch, seed, drop_last in every_case()
              if pads_once(n, world_size, rank, epoch, seed, drop_last)
              != sampler.sampler_indices(n, world_size, rank, epoch, seed, drop_last)}
    assert differ == {(1, 4)}
