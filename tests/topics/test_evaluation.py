"""Distributed evaluation's helpers: DistributedSampler's shares as the lesson shows them, the
one-process metric the grader compares with, and the grader's dataset sizes, never divisible."""
import pytest
import torch
import torch.nn.functional as F

from course_lib.checks.engine import boundary
from course_lib.checks.lesson10.evaluation import dataset_sizes
from course_lib.topics.evaluation import exact_metrics, make_eval_task, sample_metrics, sampler_shares


def test_sampler_shares_repeat_the_first_indices_or_drop_the_tail():
    assert sampler_shares(10, 3) == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert sampler_shares(10, 3, drop_last=True) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    every = sum(sampler_shares(10, 3, shuffle=True, seed=1), [])
    assert len(every) == 12 and set(every) == set(range(10)) and len(set(every)) == 10


def test_exact_metrics_count_each_sample_once_and_sample_metrics_keep_repeats():
    model, dataset = make_eval_task(23, seed=4)
    X, y = dataset.tensors
    with torch.no_grad():
        logits = model(X).double()
    loss, accuracy = exact_metrics(model, dataset)
    assert loss == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-12)
    assert accuracy == pytest.approx((logits.argmax(1) == y).double().mean().item(), abs=1e-12)
    losses, correct = sample_metrics(model, dataset, [0, 0, 5])
    assert losses[0] == losses[1] and len(correct) == 3


@pytest.mark.parametrize("offset", [0, 1, 6, 48, 1000])
def test_the_graders_dataset_sizes_never_divide_by_the_world_size(offset):
    token = boundary._seed_offset.set(offset)
    try:
        sizes = dataset_sizes()
    finally:
        boundary._seed_offset.reset(token)
    assert sizes[2] % 2 and sizes[3] % 3 and all(30 < n < 100 for n in sizes.values())
