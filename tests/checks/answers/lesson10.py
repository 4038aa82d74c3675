"""Lesson 10's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import os
from fractions import Fraction

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from course_lib.checks import lesson10


from . import answer, wrong_answer  # noqa: F401


def lesson10_measurement():
    """A real measurement of lesson 10's loader (fewer steps than the lesson's 20, to be quick)."""
    from course_lib.topics.input_pipeline import SlowDataset, device_step, measure_data_wait

    dataset = SlowDataset(features_path=lesson10._features_file("right"))
    return measure_data_wait(DataLoader(dataset, batch_size=32, shuffle=True), device_step(0.020),
                             steps=6, warmup=1)


LESSON10_MEASUREMENT = lesson10_measurement()


def loader_report_with_numpy(measurement):
    data, compute = np.float64(measurement["data"]), np.float64(measurement["compute"])
    share = data / (data + compute)
    return measurement, share, np.ceil(1.5 * data / compute).astype(np.int64)


def loader_report_from_data_wait_share(measurement):
    from course_lib.topics.input_pipeline import data_wait_share

    share = data_wait_share(measurement)
    workers = -(-1.5 * measurement["data"] // measurement["compute"])  # a ceiling by floor division
    return measurement, Fraction(share).limit_denominator(10**9), int(workers)


def loader_with_an_explicit_distributed_sampler():
    from course_lib.topics.input_pipeline import SlowDataset

    dataset = SlowDataset(features_path=lesson10._features_file("right"))
    sampler = DistributedSampler(dataset, num_replicas=int(os.environ["WORLD_SIZE"]),
                                 rank=int(os.environ["RANK"]), seed=7)
    return DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=4, prefetch_factor=4,
                      persistent_workers=True)


def loader_with_a_hand_made_share_and_more_workers():
    from course_lib.topics.input_pipeline import SlowDataset

    dataset = SlowDataset(features_path=lesson10._features_file("right"))
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(1)).tolist()
    share = order[dist.get_rank()::dist.get_world_size()]  # a list is a sampler too
    return DataLoader(dataset, batch_size=32, sampler=share, num_workers=6)


def loader_with_a_batch_sampler():
    from torch.utils.data import BatchSampler
    from course_lib.topics.input_pipeline import SlowDataset

    dataset = SlowDataset(features_path=lesson10._features_file("right"))
    batches = BatchSampler(DistributedSampler(dataset), 32, False)
    return DataLoader(dataset, batch_sampler=batches, num_workers=4)


def loader_over_a_subset():
    from torch.utils.data import Subset
    from course_lib.topics.input_pipeline import SlowDataset

    dataset = SlowDataset(features_path=lesson10._features_file("right"))
    share = Subset(dataset, range(dist.get_rank(), len(dataset), dist.get_world_size()))
    return DataLoader(share, batch_size=32, shuffle=True, num_workers=5)


ALTERNATIVES = {
    lesson10.check_loader_measurement: [
        answer("numpy floats and a numpy integer", *loader_report_with_numpy(LESSON10_MEASUREMENT)),
        answer("data_wait_share, a Fraction, a ceiling by floor division",
               *loader_report_from_data_wait_share(LESSON10_MEASUREMENT)),
    ],
    lesson10.check_fast_loader: [
        answer("DistributedSampler told its rank, persistent workers",
               loader_with_an_explicit_distributed_sampler),
        answer("a hand-made share as the sampler, 6 workers",
               loader_with_a_hand_made_share_and_more_workers),
        answer("batch_sampler=BatchSampler(DistributedSampler(dataset), 32, False)",
               loader_with_a_batch_sampler),
        answer("a Subset of this rank's share, shuffled, 5 workers", loader_over_a_subset),
    ],
}
