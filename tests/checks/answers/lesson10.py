"""Lesson 10's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import math
import os
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from course_lib.checks import lesson10
from course_lib.topics.input_pipeline import SlowDataset, measure_data_wait, precompute_features

from . import answer, wrong_answer


def features_file(kind: str) -> str:
    """A features file for the answers below: the right features, or the raw inputs. Kept in the
    temporary folder under a fixed name and written atomically, so that ranks that build their
    loaders at the same moment share one file and never read half of it."""
    path = Path(tempfile.gettempdir()) / f"course_lib-lesson10-{kind}-{lesson10.N_SAMPLES}.pt"
    if not path.exists():
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        if kind == "right":
            precompute_features(SlowDataset(), str(partial))
        else:
            torch.save(SlowDataset().X, partial)
        os.replace(partial, path)
    return str(path)


def lesson10_measurement():
    """A real measurement of lesson 10's loader (fewer steps than the lesson's 20, to be quick)."""
    from course_lib.topics.input_pipeline import SlowDataset, device_step, measure_data_wait

    dataset = SlowDataset(features_path=features_file("right"))
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

    dataset = SlowDataset(features_path=features_file("right"))
    sampler = DistributedSampler(dataset, num_replicas=int(os.environ["WORLD_SIZE"]),
                                 rank=int(os.environ["RANK"]), seed=7)
    return DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=4, prefetch_factor=4,
                      persistent_workers=True)


def loader_with_a_hand_made_share_and_more_workers():
    from course_lib.topics.input_pipeline import SlowDataset

    dataset = SlowDataset(features_path=features_file("right"))
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(1)).tolist()
    share = order[dist.get_rank()::dist.get_world_size()]  # a list is a sampler too
    return DataLoader(dataset, batch_size=32, sampler=share, num_workers=6)


def loader_with_a_batch_sampler():
    from torch.utils.data import BatchSampler
    from course_lib.topics.input_pipeline import SlowDataset

    dataset = SlowDataset(features_path=features_file("right"))
    batches = BatchSampler(DistributedSampler(dataset), 32, False)
    return DataLoader(dataset, batch_sampler=batches, num_workers=4)


def loader_over_a_subset():
    from torch.utils.data import Subset
    from course_lib.topics.input_pipeline import SlowDataset

    dataset = SlowDataset(features_path=features_file("right"))
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


# Wrong answers

BATCH_SIZE, RANKS = lesson10.BATCH_SIZE, lesson10.RANKS
MEASURED_BATCH_SIZE, MIN_MEASURED_STEPS = lesson10.MEASURED_BATCH_SIZE, lesson10.MIN_MEASURED_STEPS
# Made-up figures: what a busy 2-core machine measured once, typed in rather than measured.
MADE_UP = {"data": 0.946, "compute": 0.404}


def record_of(loader, step, change=None):
    """A real record, made cheaply at import, of a measurement the exercise did not ask for."""
    record = measure_data_wait(loader, step, steps=MIN_MEASURED_STEPS, warmup=0)
    if change is not None:
        change(record)
    return record


def in_milliseconds(record):
    record["data"], record["compute"] = record["data"] * 1000, record["compute"] * 1000


def no_op_step(batch):
    return None


def list_of_batches():
    X, y = torch.zeros(MEASURED_BATCH_SIZE, 16), torch.zeros(MEASURED_BATCH_SIZE, dtype=torch.long)
    return [(X, y)] * MIN_MEASURED_STEPS


def unread_slow_dataset():
    return DataLoader(SlowDataset(n_samples=MIN_MEASURED_STEPS * MEASURED_BATCH_SIZE,
                                  read_seconds=0.0), batch_size=MEASURED_BATCH_SIZE)


def default_loader():
    return DataLoader(SlowDataset(), batch_size=BATCH_SIZE, shuffle=True)


def precomputed(**options):
    dataset = SlowDataset(features_path=features_file("right"), **options)
    return dataset, DistributedSampler(dataset)


def workers_without_precomputing():
    dataset = SlowDataset()
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=DistributedSampler(dataset),
                      num_workers=4)


def precomputed_two_workers():
    dataset, sampler = precomputed()
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler, num_workers=2)


def smaller_batch():
    dataset, sampler = precomputed()
    return DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=4)


def batch_sampler_of_16():
    dataset, sampler = precomputed()
    return DataLoader(dataset, batch_sampler=BatchSampler(sampler, 16, False), num_workers=4)


def free_reads():
    dataset, sampler = precomputed(read_seconds=0.0)
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler, num_workers=4)


def not_shuffled():
    dataset = SlowDataset(features_path=features_file("right"))
    return DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=4,
                      sampler=DistributedSampler(dataset, shuffle=False))


def precomputed_raw_inputs():
    dataset = SlowDataset(features_path=features_file("raw"))
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=DistributedSampler(dataset),
                      num_workers=4)


def whole_dataset_on_every_rank():
    dataset = SlowDataset(features_path=features_file("right"))
    return DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, num_workers=4)


def rank_zero_share_everywhere():
    dataset = SlowDataset(features_path=features_file("right"))
    return DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=4,
                      sampler=DistributedSampler(dataset, num_replicas=RANKS, rank=0))


WRONG_ANSWERS = {
    lesson10.check_loader_measurement: [
        wrong_answer("made-up seconds, share and workers consistent with them",
                     MADE_UP, 0.946 / 1.35, 4),
        wrong_answer("the same figures in milliseconds", {"data": 946.0, "compute": 404.0},
                     0.946 / 1.35, 4),
        wrong_answer("a real record, converted to milliseconds in place",
                     record_of(list_of_batches(), no_op_step, in_milliseconds), 0.5, 1),
        wrong_answer("a list of batches in memory measured, with no step: no reads, no compute",
                     record_of(list_of_batches(), no_op_step), 0.5, 1),
        wrong_answer("SlowDataset with read_seconds=0, no step",
                     record_of(unread_slow_dataset(), no_op_step), 0.5, 1),
    ],
    lesson10.check_fast_loader: [
        wrong_answer("the default loader: no workers, features per sample", default_loader),
        wrong_answer("4 workers, features still computed per sample",
                     workers_without_precomputing),
        wrong_answer("precomputed features, 2 workers (no headroom)", precomputed_two_workers),
        wrong_answer("a smaller batch", smaller_batch),
        wrong_answer("a batch_sampler of 16 over the DistributedSampler", batch_sampler_of_16),
        wrong_answer("reads made free (read_seconds=0)", free_reads),
        wrong_answer("precomputed features and 4 workers, but not shuffled", not_shuffled),
        wrong_answer("precomputed the raw inputs, not the neighbour features",
                     precomputed_raw_inputs),
        wrong_answer("no DistributedSampler: every rank loads the whole dataset",
                     whole_dataset_on_every_rank),
        wrong_answer("a DistributedSampler fixed to rank 0's share", rank_zero_share_everywhere),
    ],
}


# -- evaluate on every rank (checks/lesson10/evaluation.py) --------------------------------------

def _sums_and_counts(model, dataset, indices):
    """(loss sum, correct, count) of `indices`, in float64, for the answers below."""
    import torch.nn.functional as F

    X, y = dataset.tensors
    index = torch.as_tensor(list(indices), dtype=torch.long)
    with torch.no_grad():
        logits = model(X[index])
    return torch.tensor([F.cross_entropy(logits, y[index], reduction="sum").item(),
                         (logits.argmax(1) == y[index]).sum().item(), len(index)],
                        dtype=torch.float64)


def _sums_and_counts_ratio(totals):
    """(mean loss, accuracy) from reduced (loss sum, correct, count)."""
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def evaluate_by_gathering_objects(model, dataset):
    """A strided share, then every rank's per-sample results gathered (all_gather_object)."""
    import torch.nn.functional as F

    rank, world = dist.get_rank(), dist.get_world_size()
    X, y = dataset.tensors
    with torch.no_grad():
        logits = model(X[rank::world])
    mine = list(zip(F.cross_entropy(logits, y[rank::world], reduction="none").tolist(),
                    (logits.argmax(1) == y[rank::world]).tolist()))
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    results = [pair for part in everyone for pair in part]
    return (sum(loss for loss, _ in results) / len(results),
            sum(right for _, right in results) / len(results))


def evaluate_by_uneven_gather(model, dataset):
    """A contiguous share in batches of 8; sizes gathered first, then padded tensors, trimmed."""
    import torch.nn.functional as F

    rank, world = dist.get_rank(), dist.get_world_size()
    bounds = [len(dataset) * r // world for r in range(world + 1)]
    X, y = dataset.tensors
    losses, right = [], []
    with torch.no_grad():
        for start in range(bounds[rank], bounds[rank + 1], 8):
            end = min(start + 8, bounds[rank + 1])
            logits = model(X[start:end])
            losses.append(F.cross_entropy(logits, y[start:end], reduction="none"))
            right.append((logits.argmax(1) == y[start:end]).float())
    mine = torch.stack([torch.cat(losses), torch.cat(right)])
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([mine.shape[1]]))
    longest = max(int(size) for size in sizes)
    padded = [torch.zeros(2, longest) for _ in range(world)]
    dist.all_gather(padded, F.pad(mine, (0, longest - mine.shape[1])))
    every = torch.cat([part[:, :int(size)] for part, size in zip(padded, sizes)], dim=1)
    return every[0].mean().item(), every[1].mean().item()


def evaluate_mean_of_means(model, dataset):
    rank, world = dist.get_rank(), dist.get_world_size()
    loss_sum, correct, count = _sums_and_counts(model, dataset, range(rank, len(dataset), world))
    means = torch.stack([loss_sum / count, correct / count])
    dist.all_reduce(means)
    return (means / world).tolist()


def evaluate_counting_the_padding(model, dataset):
    totals = _sums_and_counts(model, dataset, DistributedSampler(dataset, shuffle=False))
    dist.all_reduce(totals)
    return _sums_and_counts_ratio(totals)


def evaluate_with_drop_last(model, dataset):
    totals = _sums_and_counts(model, dataset, DistributedSampler(dataset, drop_last=True))
    dist.all_reduce(totals)
    return _sums_and_counts_ratio(totals)


def evaluate_rank_zero_share(model, dataset):
    rank, world = dist.get_rank(), dist.get_world_size()
    totals = _sums_and_counts(model, dataset, range(rank, len(dataset), world))
    dist.broadcast(totals, src=0)  # rank 0's numbers, for everyone
    return _sums_and_counts_ratio(totals)


def evaluate_uneven_gather_untrimmed(model, dataset):
    """Sizes gathered and the tensors padded to the longest, but the padding never cut off."""
    import torch.nn.functional as F

    rank, world = dist.get_rank(), dist.get_world_size()
    X, y = dataset.tensors
    with torch.no_grad():
        logits = model(X[rank::world])
    mine = torch.stack([F.cross_entropy(logits, y[rank::world], reduction="none"),
                        (logits.argmax(1) == y[rank::world]).float()])
    longest = math.ceil(len(dataset) / world)
    padded = [torch.zeros(2, longest) for _ in range(world)]
    dist.all_gather(padded, F.pad(mine, (0, longest - mine.shape[1])))
    every = torch.cat(padded, dim=1)
    return every[0].mean().item(), every[1].mean().item()


def evaluate_gathering_unequal_sizes(model, dataset):
    """all_gather into a list sized like this rank's own tensor: gloo refuses unequal sizes."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = _sums_and_counts(model, dataset, range(rank, len(dataset), world))
    X, y = dataset.tensors
    with torch.no_grad():
        right = (model(X[rank::world]).argmax(1) == y[rank::world]).float()
    parts = [torch.zeros_like(right) for _ in range(world)]
    dist.all_gather(parts, right)
    dist.all_reduce(mine)
    return (mine[0] / mine[2]).item(), torch.cat(parts).mean().item()


def evaluate_whole_dataset_everywhere(model, dataset):
    return _sums_and_counts_ratio(_sums_and_counts(model, dataset, range(len(dataset))))



def evaluate_hard_coded_two_ranks(model, dataset):
    rank = dist.get_rank()
    indices = list(DistributedSampler(dataset, num_replicas=2, rank=rank, shuffle=False))
    totals = _sums_and_counts(model, dataset, indices[:len(range(rank, len(dataset), 2))])
    dist.all_reduce(totals)
    return _sums_and_counts_ratio(totals)


def evaluate_float_world_size(model, dataset):
    """A share of len / world_size samples (a float), its end rounded down on every rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = len(dataset) / world
    totals = _sums_and_counts(model, dataset, range(int(rank * per_rank),
                                                    int(rank * per_rank) + int(per_rank)))
    dist.all_reduce(totals)
    return _sums_and_counts_ratio(totals)


ALTERNATIVES[lesson10.check_distributed_evaluation] = [
    answer("all_gather_object of every rank's per-sample results", evaluate_by_gathering_objects),
    answer("contiguous shares in batches, sizes gathered first, padded, trimmed",
           evaluate_by_uneven_gather),
]
WRONG_ANSWERS[lesson10.check_distributed_evaluation] = [
    wrong_answer("the mean of the ranks' means", evaluate_mean_of_means),
    wrong_answer("DistributedSampler's padding counted", evaluate_counting_the_padding),
    wrong_answer("DistributedSampler(drop_last=True)", evaluate_with_drop_last),
    wrong_answer("rank 0's share broadcast to all", evaluate_rank_zero_share),
    wrong_answer("padded gather, padding never trimmed", evaluate_uneven_gather_untrimmed),
    wrong_answer("all_gather of unequal sizes", evaluate_gathering_unequal_sizes),
    wrong_answer("the whole dataset on every rank", evaluate_whole_dataset_everywhere),
    wrong_answer("num_replicas hard-coded to 2", evaluate_hard_coded_two_ranks),
    wrong_answer("a float share len / world_size, rounded down", evaluate_float_world_size),
]
