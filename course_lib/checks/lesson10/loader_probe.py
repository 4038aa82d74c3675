"""Lesson 10's fast_loader inside each rank: the loader's facts as plain values a rank can send
back (its dataset's features as read, not judged: the grader compares them), and, when the
grader's rules accept them, its measured seconds of data wait and of compute against a 20 ms step."""
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Subset

from ..engine import GradingError
from ...topics.input_pipeline import (SlowDataset, device_step, measure_data_wait,
                                      neighbour_features, shutdown_workers)

STEP_SECONDS = 0.020  # a fixed stand-in for a GPU step (a sleep): the same on a laptop and a node
MAX_SHARE = 0.25
MEASURED_STEPS, WARMUP_STEPS = 20, 10
MEASUREMENTS = 3
SAMPLES_TO_COMPARE = (0, 1, 777)


def loader_on_rank(fast_loader, expect_configuration):
    """Inside a rank: the facts of this rank's loader, and, when they are right, its data wait.

    The best of up to MEASUREMENTS: a busy machine only ever adds waiting, and a loader with too
    few workers waits in every measurement, however quiet the machine. `expect_configuration`
    is the grader's rule for the facts: a loader it rejects is not measured, nor one whose ranks'
    shares of an epoch are not shuffled, disjoint and whole (the orders are gathered from every
    rank first, by every rank, so no rank waits in a collective that another skips)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "more workers than cores": nothing but the verdict
        loader = fast_loader()
        try:
            facts = loader_facts(loader)
            orders = [None] * dist.get_world_size()
            dist.all_gather_object(orders, facts.get("order"))
            try:  # only to spare measuring a loader the grader will reject: it judges again
                expect_configuration({**facts, "features_error": features_error(facts)},
                                     dist.get_rank())
            except GradingError:
                return facts  # the grader says what is wrong; nothing worth measuring
            if not shares_of_one_epoch(orders):
                return facts  # the same: the grader says how the shares are wrong
            for _ in range(MEASUREMENTS):
                times = measure_data_wait(loader, device_step(STEP_SECONDS), steps=MEASURED_STEPS,
                                          warmup=WARMUP_STEPS)
                facts.update(waited=float(times["data"]), computed=float(times["compute"]),
                             loaded_sizes=sorted(set(times.batch_sizes)))
                if data_share(facts) < MAX_SHARE:
                    break
        finally:
            if isinstance(loader, DataLoader):
                shutdown_workers(loader)
    return facts


def shares_of_one_epoch(orders) -> bool:
    """Whether the ranks' orders are each shuffled and together every sample once."""
    if any(order is None or order == sorted(order) for order in orders):
        return False
    everything = sorted(index for order in orders for index in order)
    return everything == list(range(len(everything))) and len(everything) == len(SlowDataset())


def loader_facts(loader) -> dict:
    """What the grader checks of a loader, as plain values a rank can send back: its dataset (under
    any Subset), its workers, and the batches of one epoch as the loader deals them (indices into
    the dataset), however the loader was built: batch_size and a sampler, or a batch_sampler."""
    facts = {"type": type(loader).__name__}
    if not isinstance(loader, DataLoader):
        return facts
    dataset, to_dataset = loader.dataset, list(range(len(loader.dataset)))
    while isinstance(dataset, Subset):  # a Subset's index i is its dataset's indices[i]
        to_dataset = [int(dataset.indices[i]) for i in to_dataset]
        dataset = dataset.dataset
    facts.update(dataset=type(dataset).__name__, num_workers=loader.num_workers)
    if isinstance(dataset, SlowDataset):
        batches = [[to_dataset[int(i)] for i in batch] for batch in loader.batch_sampler]
        facts.update(read_seconds=dataset.read_seconds, n_samples=len(dataset),
                     precomputed=dataset.features_path is not None,
                     batch_sizes=sorted({len(batch) for batch in batches}),
                     order=[index for batch in batches for index in batch])
        if dataset.features_path is not None:
            rows = [i % len(dataset) for i in SAMPLES_TO_COMPARE]
            facts.update(X=dataset.X.detach().clone(), k=int(dataset.k), rows=rows,
                         features=torch.stack([torch.as_tensor(dataset[row][0]) for row in rows]))
    return facts


def features_error(facts) -> float:
    """How far the features the loader's dataset read are from those its samples' neighbours give
    (0 when the dataset computes them on the fly: no file, no features to read)."""
    if "features" not in facts:
        return 0.0
    expected = neighbour_features(facts["X"], torch.tensor(facts["rows"]), facts["k"])
    return (facts["features"] - expected).abs().max().item()


def data_share(facts) -> float:
    """The measured share of the steps' time spent waiting for data."""
    return facts["waited"] / (facts["waited"] + facts["computed"])
