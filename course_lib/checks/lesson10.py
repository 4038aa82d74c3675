"""Graders for lesson 10, the input pipeline: a loader's data wait measured and the workers it
needs, and a loader that hides the wait of a deliberately slow dataset.

- measure the data wait: what measure_data_wait recorded for the learner's loader (seconds of
  'data' and of 'compute'), its data-wait share (data over all phases, within 1e-6) and the
  workers that follow from it, 1.5 x data / compute rounded up (any integer type). A measurement
  varies from run to run, so the grader judges the numbers against the one the learner recorded.
- a loader that hides the data wait, on each of 2 ranks: a DataLoader over the lesson's
  SlowDataset with batch_size 32, read_seconds untouched, the precomputed neighbour features, at
  least 3 workers; the ranks' samples of one epoch shuffled, disjoint and together the whole
  dataset (a DistributedSampler, however made); a measured data-wait share below 25% on every rank.

The loader's grader runs the learner's function on 2 gloo ranks; each first reads its loader's
configuration (no measurement needed), then measures its data-wait share against a fixed 20 ms
stand-in for a GPU step (a sleep, so it grades the same on a busy laptop and on a GPU node), and
shuts the loader's workers down.
"""
import math
import os
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

from . import GradingError, expect, expect_close, expect_whole_number, grader, wrong_answer
from .ranks import run_on_ranks
from ..topics.input_pipeline import (READ_SECONDS, SlowDataset, device_step, measure_data_wait,
                        neighbour_features, precompute_features, shutdown_workers)

# -- exercise 1: measure a loader's data wait, and size its workers -----------------------------

HEADROOM = 1.5
# What measure_data_wait recorded for the precomputed loader without workers on a busy 2-core
# machine: 20 steps, reads of a batch 47.3 ms (nominally 32 ms), the 20 ms step 20.2 ms.
RECORDED_MEASUREMENT = {"data": 0.946, "compute": 0.404}


@grader("measure the data wait")
def check_loader_measurement(measurement, share, num_workers):
    data, compute = _expect_a_measurement(measurement)
    expect_close(_as_float(share), data / (data + compute),
                 "share, the data-wait share of your measurement",
                 "the seconds waiting for data over the seconds of all phases: a fraction "
                 "between 0 and 1", rtol=1e-6, atol=1e-9)
    expected = math.ceil(HEADROOM * data / compute)
    expect_whole_number(num_workers, "num_workers",
                        "workers come whole: round up with math.ceil, which returns an int")
    expect(num_workers == expected, "num_workers, from your measurement", str(expected),
           str(num_workers), f"without workers the data phase is the reads of one batch, so one "
           f"worker delivers a batch every data / steps seconds and the loop takes one every "
           f"compute / steps: {HEADROOM} x data / compute, rounded up. Use what you measured, "
           f"not the nominal read time")


def _expect_a_measurement(measurement):
    """(data seconds, seconds of every other phase) of a recorded run, or a GradingError."""
    try:
        data = float(measurement["data"])
        compute = sum(float(seconds) for phase, seconds in measurement.items() if phase != "data")
    except (KeyError, TypeError, ValueError, AttributeError):
        data = compute = None
    expect(data is not None and data > 0 and compute > 0, "measurement",
           "the seconds per phase that measure_data_wait returned: 'data' and 'compute', both "
           "positive", repr(measurement)[:120],
           "pass what measure_data_wait(loader, gpu_step) returned, unchanged")
    return data, compute


def _as_float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value  # expect_close describes what came back


def _reference(measurement=RECORDED_MEASUREMENT):
    data, compute = measurement["data"], measurement["compute"]
    return measurement, data / (data + compute), math.ceil(HEADROOM * data / compute)


def _with(share=None, num_workers=None, measurement=RECORDED_MEASUREMENT):
    _, right_share, right_workers = _reference(measurement)
    return (measurement, right_share if share is None else share,
            right_workers if num_workers is None else num_workers)


_DATA, _COMPUTE = RECORDED_MEASUREMENT["data"], RECORDED_MEASUREMENT["compute"]


# -- exercise 2: a loader that hides the wait ---------------------------------------------------

BATCH_SIZE = 32
STEP_SECONDS = 0.020
MAX_SHARE = 0.25
MEASURED_STEPS, WARMUP_STEPS = 20, 10
MEASUREMENTS = 3
MIN_WORKERS = math.ceil(HEADROOM * BATCH_SIZE * READ_SECONDS / STEP_SECONDS)  # 2.4 -> 3
SAMPLES_TO_COMPARE = (0, 1, 777)
FEATURES_TOLERANCE = 1e-5
N_SAMPLES = len(SlowDataset())
RANKS = 2
LAUNCH_TIMEOUT_S = 120


@grader("a loader that hides the data wait")
def check_fast_loader(fast_loader):
    per_rank = run_on_ranks(_loader_on_rank, fast_loader, nprocs=RANKS,
                            what=f"fast_loader() on {RANKS} ranks", timeout=LAUNCH_TIMEOUT_S,
                            hang_hint="fast_loader() should only build a DataLoader; the check "
                                      "iterates it")
    for rank, facts in enumerate(per_rank):
        _expect_configuration(facts, rank)
    _expect_shares_of_one_epoch([facts["order"] for facts in per_rank])
    for rank, facts in enumerate(per_rank):
        expect(facts["share"] < MAX_SHARE, f"the data-wait share measured on rank {rank}",
               f"below {MAX_SHARE:.2f}", f"{facts['share']:.2f} (waited "
               f"{facts['waited'] * 1000:.0f} ms in {MEASURED_STEPS} steps of "
               f"{STEP_SECONDS * 1000:.0f} ms)", "more workers, or a larger prefetch_factor; if "
               "the machine is very busy (other programs), run the check again")


def _loader_on_rank(fast_loader):
    """Inside a rank: the facts of this rank's loader, and, when they are right, its data wait.

    The best of up to MEASUREMENTS: a busy machine only ever adds waiting, and a loader with too
    few workers waits in every measurement, however quiet the machine."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "more workers than cores": nothing but the verdict
        loader = fast_loader()
        try:
            facts = _facts(loader)
            try:
                _expect_configuration(facts, dist.get_rank())
            except GradingError:
                return facts  # the grader says what is wrong; nothing worth measuring
            for _ in range(MEASUREMENTS):
                times = measure_data_wait(loader, device_step(STEP_SECONDS), steps=MEASURED_STEPS,
                                          warmup=WARMUP_STEPS)
                facts.update(share=times["data"] / (times["data"] + times["compute"]),
                             waited=times["data"])
                if facts["share"] < MAX_SHARE:
                    break
        finally:
            if isinstance(loader, DataLoader):
                shutdown_workers(loader)
    return facts


def _facts(loader) -> dict:
    """What the grader checks of a loader, as plain values a rank can send back."""
    facts = {"type": type(loader).__name__}
    if not isinstance(loader, DataLoader):
        return facts
    dataset = loader.dataset
    facts.update(dataset=type(dataset).__name__, batch_size=loader.batch_size,
                 num_workers=loader.num_workers)
    if isinstance(dataset, SlowDataset):
        facts.update(read_seconds=dataset.read_seconds, n_samples=len(dataset),
                     precomputed=dataset.features_path is not None,
                     order=[index for batch in loader.batch_sampler for index in batch])
        if dataset.features_path is not None:
            facts["features_error"] = max(
                (dataset[index][0] - neighbour_features(dataset.X, torch.tensor([index]),
                                                        dataset.k)[0]).abs().max().item()
                for index in (i % len(dataset) for i in SAMPLES_TO_COMPARE))
    return facts


def _expect_configuration(facts, rank):
    where = f" on rank {rank}"
    expect(facts["type"] == "DataLoader", "fast_loader()" + where, "a torch.utils.data.DataLoader",
           facts["type"], "return the DataLoader you built")
    expect(facts["dataset"] == "SlowDataset", "the loader's dataset" + where, "a SlowDataset",
           facts["dataset"], "load the lesson's SlowDataset, not another dataset")
    expect(facts["batch_size"] == BATCH_SIZE, "the loader's batch_size" + where, str(BATCH_SIZE),
           str(facts["batch_size"]), "keep the batch the model trains on: a smaller batch only "
           "looks faster")
    expect(facts["read_seconds"] == READ_SECONDS, "the dataset's read_seconds" + where,
           f"{READ_SECONDS} (the files take that long to read)", str(facts["read_seconds"]),
           "leave read_seconds alone: hide the reads behind compute instead")
    expect(facts["precomputed"], "the dataset's features_path" + where,
           "the file of precomputed neighbour features", "None (computed for every sample, "
           "in every epoch)", "pass features_path=features_path (precomputed above)")
    expect(facts["features_error"] <= FEATURES_TOLERANCE, "the precomputed features" + where,
           "the neighbour features of each sample", f"features off by up to "
           f"{facts['features_error']:.3g}", "precompute with precompute_features(dataset, "
           "path), for this dataset")
    expect(facts["num_workers"] >= MIN_WORKERS, "the loader's num_workers" + where,
           f"at least {MIN_WORKERS} ({HEADROOM} x {BATCH_SIZE} x {READ_SECONDS} s / "
           f"{STEP_SECONDS} s, rounded up)", str(facts["num_workers"]),
           "each worker needs 32 ms per batch and the step takes 20 ms: add workers, with "
           "headroom")
    expect(facts["n_samples"] == N_SAMPLES, "the dataset's number of samples" + where,
           str(N_SAMPLES), str(facts["n_samples"]), "keep the whole dataset")


def _expect_shares_of_one_epoch(orders):
    everything = sorted(index for order in orders for index in order)
    expect(everything == list(range(N_SAMPLES)), f"the samples the {RANKS} ranks load in one epoch",
           f"every one of the {N_SAMPLES} samples once, each rank its own share",
           f"{len(everything)} samples, {len(everything) - len(set(everything))} of them loaded "
           "twice" if len(everything) != len(set(everything)) else f"{len(everything)} samples",
           "give the DataLoader a DistributedSampler(dataset): it reads this rank and the number "
           "of ranks from the process group, and gives every rank a different share")
    expect(all(order != sorted(order) for order in orders), "the order of each rank's samples",
           "shuffled", "in order", "DistributedSampler shuffles by default (shuffle=True): keep "
           "it; a model trained on samples in a fixed order learns worse")


def _features_file(kind: str) -> str:
    """A features file for the wrong and the alternative answers: the right features, or the raw
    inputs. Kept in the temporary folder under a fixed name and written atomically, so that ranks
    that build their loaders at the same moment share one file and never read half of it."""
    path = Path(tempfile.gettempdir()) / f"course_lib-lesson10-{kind}-{N_SAMPLES}.pt"
    if not path.exists():
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        if kind == "right":
            precompute_features(SlowDataset(), str(partial))
        else:
            torch.save(SlowDataset().X, partial)
        os.replace(partial, path)
    return str(path)


def _default_loader():
    return DataLoader(SlowDataset(), batch_size=BATCH_SIZE, shuffle=True)


def _precomputed(**options):
    dataset = SlowDataset(features_path=_features_file("right"), **options)
    return dataset, DistributedSampler(dataset)


def _workers_without_precomputing():
    dataset = SlowDataset()
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=DistributedSampler(dataset),
                      num_workers=4)


def _precomputed_two_workers():
    dataset, sampler = _precomputed()
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler, num_workers=2)


def _smaller_batch():
    dataset, sampler = _precomputed()
    return DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=4)


def _free_reads():
    dataset, sampler = _precomputed(read_seconds=0.0)
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler, num_workers=4)


def _not_shuffled():
    dataset = SlowDataset(features_path=_features_file("right"))
    return DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=4,
                      sampler=DistributedSampler(dataset, shuffle=False))


def _precomputed_raw_inputs():
    dataset = SlowDataset(features_path=_features_file("raw"))
    return DataLoader(dataset, batch_size=BATCH_SIZE, sampler=DistributedSampler(dataset),
                      num_workers=4)


def _whole_dataset_on_every_rank():
    dataset = SlowDataset(features_path=_features_file("right"))
    return DataLoader(dataset, batch_size=BATCH_SIZE, shuffle=True, num_workers=4)


def _rank_zero_share_everywhere():
    dataset = SlowDataset(features_path=_features_file("right"))
    return DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=4,
                      sampler=DistributedSampler(dataset, num_replicas=RANKS, rank=0))


WRONG_ANSWERS = {
    check_loader_measurement: [
        wrong_answer("share = data / compute, not over the total", *_with(share=_DATA / _COMPUTE)),
        wrong_answer("the compute share", *_with(share=_COMPUTE / (_DATA + _COMPUTE))),
        wrong_answer("a percentage", *_with(share=100 * _DATA / (_DATA + _COMPUTE))),
        wrong_answer("workers from the nominal 1 ms reads: 3",
                     *_with(num_workers=math.ceil(HEADROOM * 32 * 0.001 / 0.020))),
        wrong_answer("workers rounded down", *_with(num_workers=int(HEADROOM * _DATA / _COMPUTE))),
        wrong_answer("workers without headroom", *_with(num_workers=math.ceil(_DATA / _COMPUTE))),
        wrong_answer("workers as a float", *_with(num_workers=HEADROOM * _DATA / _COMPUTE)),
        wrong_answer("a measurement without its compute phase", {"data": _DATA}, 1.0, 2),
    ],
    check_fast_loader: [
        wrong_answer("the default loader: no workers, features per sample", _default_loader),
        wrong_answer("4 workers, features still computed per sample",
                     _workers_without_precomputing),
        wrong_answer("precomputed features, 2 workers (no headroom)", _precomputed_two_workers),
        wrong_answer("a smaller batch", _smaller_batch),
        wrong_answer("reads made free (read_seconds=0)", _free_reads),
        wrong_answer("precomputed features and 4 workers, but not shuffled", _not_shuffled),
        wrong_answer("precomputed the raw inputs, not the neighbour features",
                     _precomputed_raw_inputs),
        wrong_answer("no DistributedSampler: every rank loads the whole dataset",
                     _whole_dataset_on_every_rank),
        wrong_answer("a DistributedSampler fixed to rank 0's share", _rank_zero_share_everywhere),
    ],
}
