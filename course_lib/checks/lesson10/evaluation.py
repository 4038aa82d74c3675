"""Lesson 10's third grader: evaluate(model, dataset), run inside each rank, reports the whole
dataset's mean loss and accuracy, each sample counted once, the same on every rank.

It runs on 2 ranks, then on 3, each on a dataset whose size the world size does not divide (so a
DistributedSampler pads, and drop_last would drop), sizes and model drawn from grading_seed. Each
rank returns the two numbers and the input rows its model was called on (evaluation_probe.py);
here, in the grader's process: every sample reached a model on some rank, no rank evaluated more
than its share (ceil(N / W) rows), the ranks agree, and the numbers equal one process's metric
over the whole dataset (loss within 1e-5 relative, accuracy within 1e-6). An answer that misses
names the mistake its numbers match: per-rank means averaged, the padding counted, samples dropped,
one rank's share only.
"""
import math

import torch

from ..engine import GradingError, expect, grader
from ..engine.boundary import grading_seed
from ..engine.ranks import run_on_ranks
from ...topics.evaluation import exact_metrics, make_eval_task, sample_metrics, sampler_shares
from .evaluation_probe import evaluation_on_rank

EXERCISE = "evaluate on every rank"
WORLD_SIZES = (2, 3)
SIZE_SEED, MODEL_SEED = 10, 100
LOSS_RTOL, ACCURACY_ATOL = 1e-5, 1e-6
LAUNCH_TIMEOUT_S = 90
SAME_COLLECTIVES = ("every rank must call the same collectives, in the same order, with tensors of "
                    "the same size: a rank with fewer samples must still join every collective")


def dataset_sizes() -> dict:
    """{world size: N}: 6k + 5 samples on 2 ranks, 6k + 1 on 3, so neither divides (k drawn)."""
    base = grading_seed(SIZE_SEED)
    return {2: 6 * (6 + base % 7) + 5, 3: 6 * (6 + (base // 7) % 7) + 1}


@grader(EXERCISE)
def check_distributed_evaluation(evaluate):
    seed = grading_seed(MODEL_SEED)
    for world_size, n_samples in dataset_sizes().items():
        what = f"evaluate(model, dataset) on {world_size} ranks, {n_samples} samples"
        per_rank = run_on_ranks(evaluation_on_rank, evaluate, n_samples, seed, nprocs=world_size,
                                what=what, timeout=LAUNCH_TIMEOUT_S, hang_hint=SAME_COLLECTIVES,
                                crash_hint=_crash_hint)
        model, dataset = make_eval_task(n_samples, seed)
        _expect_two_numbers(per_rank, what)
        _expect_shares(per_rank, dataset, what)
        _expect_the_metric(per_rank, model, dataset, what)


def _crash_hint(cause) -> str:
    if "invalid tensor size" in cause.summary or "SIGABRT" in cause.summary:  # gloo's two ways
        return ("the ranks' tensors in a collective differ in size: gloo's all_gather needs every "
                "rank's tensor to have the same size, so gather the sizes first, pad to the "
                "largest, gather, then cut each rank's padding off")
    return "the error is raised in your function: fix it, run its cell again, then the check"


def _expect_two_numbers(per_rank, what):
    for rank, facts in enumerate(per_rank):
        expect(isinstance(facts["result"], list), f"{what}: what rank {rank} returned",
               "(mean loss, accuracy): two numbers", str(facts["result"]),
               "return a tuple of two floats (`.item()` turns a one-element tensor into one)")


def _expect_shares(per_rank, dataset, what):
    X = dataset.tensors[0]
    index_of = {tuple(row.tolist()): index for index, row in enumerate(X)}
    world_size, n_samples = len(per_rank), len(X)
    share = math.ceil(n_samples / world_size)
    covered = set()
    for rank, facts in enumerate(per_rank):
        rows = facts["inputs"]
        count = 0 if rows is None else len(rows)
        expect(count <= share, f"{what}: the samples rank {rank} passed through the model",
               f"at most {share}, its share (ceil({n_samples} / {world_size}))", str(count),
               "each rank evaluates its own share of the data, not the whole dataset: "
               "that is what makes evaluation on N ranks N times faster")
        if rows is not None:
            covered.update(index_of.get(tuple(row.tolist()), -1) for row in rows)
    missing = n_samples - len(covered & set(range(n_samples)))
    expect(missing == 0, f"{what}: the samples that reached a model on some rank",
           f"all {n_samples}", f"{n_samples - missing} ({missing} never evaluated)",
           "every sample must be evaluated on some rank: drop_last, or a share cut too short, "
           "leaves samples out (call the model as model(X), on the dataset's own features)")


def _expect_the_metric(per_rank, model, dataset, what):
    loss, accuracy = exact_metrics(model, dataset)
    reference = per_rank[0]["result"]
    for rank, facts in enumerate(per_rank[1:], start=1):
        expect(_matches(facts["result"], reference), f"{what}: rank {rank}'s numbers",
               f"the same as rank 0's {_show(reference)}", _show(facts["result"]),
               "every rank must report the whole dataset's metric: combine the ranks' sums and "
               "counts (all_reduce), or gather every rank's per-sample results on every rank")
    if _matches(reference, [loss, accuracy]):
        return
    raise GradingError(f"{what}: (mean loss, accuracy)", f"{_show([loss, accuracy])}, one "
                       f"process's metric over the {len(dataset)} samples, each once",
                       _show(reference), _diagnosis(reference, model, dataset, len(per_rank)))


def _matches(got, expected) -> bool:
    return (abs(got[0] - expected[0]) <= LOSS_RTOL * abs(expected[0])
            and abs(got[1] - expected[1]) <= ACCURACY_ATOL)


def _show(numbers) -> str:
    return f"(loss {numbers[0]:.6f}, accuracy {numbers[1]:.6f})"


def _diagnosis(got, model, dataset, world_size) -> str:
    """The hint: which common mistake's numbers `got` equals, computed here from the shares."""
    n_samples = len(dataset)
    padded = sampler_shares(n_samples, world_size)
    strided = [list(range(rank, n_samples, world_size)) for rank in range(world_size)]
    dropped = sampler_shares(n_samples, world_size, drop_last=True)

    def pooled(shares):
        losses, correct = sample_metrics(model, dataset, [i for share in shares for i in share])
        return [losses.mean().item(), correct.mean().item()]

    def mean_of_means(shares):
        means = [pooled([share]) for share in shares]
        return [sum(m[0] for m in means) / world_size, sum(m[1] for m in means) / world_size]

    mistakes = [
        (mean_of_means(strided), "that is the mean of the ranks' means: the ranks hold different "
         "numbers of samples, so reduce sums and counts, then divide"),
        (pooled(padded), "that counts the samples DistributedSampler repeats to pad the last "
         "ranks' shares: leave out each rank's entries past the real data"),
        (mean_of_means(padded), "that averages the ranks' means over padded shares: the repeated "
         "samples count, and a mean of means is not the mean"),
        (pooled(dropped), "that leaves out the samples drop_last=True drops: evaluation needs "
         "every sample"),
        ([value * n_samples / (world_size * len(padded[0])) for value in pooled(strided)],
         "that counts the zeros a padded gather added as samples: cut each rank's part to the "
         "size that rank sent"),
    ] + [(pooled([share]), f"that is rank {rank}'s share alone: combine every rank's results")
         for shares in (strided, padded) for rank, share in enumerate(shares)]
    for numbers, hint in mistakes:
        if _matches(got, numbers):
            return hint
    return ("sum the losses and count the correct predictions and the samples on each rank, "
            "all_reduce the three, and divide: each real sample once, no padding")
