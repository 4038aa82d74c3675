"""Graders for lesson 10, the input pipeline: the data-wait share from phase times, how many
workers a loader needs, and a loader that hides the wait of a deliberately slow dataset.

- data-wait share: the time in the 'data' phase over the time in all phases, a fraction.
- number of workers: headroom x batch_size x read_seconds / step_seconds, rounded up to a whole
  number (any integer type: Python's int or numpy's).
- a loader that hides the data wait: a DataLoader over the lesson's SlowDataset with batch_size
  32, shuffled, read_seconds untouched, the precomputed neighbour features, at least 3 workers,
  and a measured data-wait share below 25%.

The loader's grader first checks its configuration (no measurement needed), then measures the
data-wait share against a fixed 20 ms stand-in for a GPU step (a sleep, so it grades the same on
a busy laptop and on a GPU node), and shuts the loader's workers down.
"""
import math
import tempfile
import warnings
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from . import expect, expect_close, expect_whole_number, grader, wrong_answer
from ..topics.input_pipeline import (READ_SECONDS, SlowDataset, device_step, measure_data_wait,
                        neighbour_features, precompute_features, shutdown_workers)

# -- exercise 1: the data-wait share ------------------------------------------------------------

PHASE_CASES = [  # (phase times, the share of data)
    ({"data": 0.30, "forward": 0.20, "backward": 0.40, "optimizer": 0.10}, 0.30),
    ({"forward": 0.5, "backward": 1.0, "data": 3.0, "optimizer": 0.5}, 0.60),
    ({"data": 1.5, "compute": 0.5}, 0.75),
    ({"data": 0.0, "forward": 0.1, "backward": 0.2, "optimizer": 0.1}, 0.0),
]


@grader("data-wait share")
def check_data_wait_share(data_wait_share):
    for phase_times, expected in PHASE_CASES:
        expect_close(data_wait_share(dict(phase_times)), expected,
                     f"data_wait_share({phase_times})",
                     hint="the time in the 'data' phase over the time in all phases together: "
                          "a fraction between 0 and 1, whatever the order of the phases",
                     rtol=1e-6, atol=1e-9)


def _share_is_one_minus(phase_times):
    return 1 - phase_times["data"] / sum(phase_times.values())


def _share_over_compute(phase_times):
    return phase_times["data"] / (sum(phase_times.values()) - phase_times["data"])


def _share_first_phase(phase_times):
    first = next(iter(phase_times.values()))
    return first / sum(phase_times.values())


def _share_in_percent(phase_times):
    return 100 * phase_times["data"] / sum(phase_times.values())


# -- exercise 2: how many workers ---------------------------------------------------------------

WORKER_CASES = [  # (batch_size, read_seconds, step_seconds, headroom or None for the default)
    (32, 0.001, 0.020, None),    # 1.5 x 32 ms / 20 ms = 2.4
    (64, 0.0005, 0.010, 1.5),    # 4.8
    (16, 0.002, 0.050, 1.0),     # 0.64
    (256, 0.0002, 0.030, 2.0),   # 3.41
    (8, 0.01, 0.025, 1.5),       # 4.8
]


def reference_num_workers_for(batch_size, read_seconds, step_seconds, headroom=1.5):
    return math.ceil(headroom * batch_size * read_seconds / step_seconds)


@grader("number of workers")
def check_num_workers_for(num_workers_for):
    for batch_size, read_seconds, step_seconds, headroom in WORKER_CASES:
        extra = {} if headroom is None else {"headroom": headroom}
        call = (f"num_workers_for({batch_size}, {read_seconds}, {step_seconds}"
                + (f", headroom={headroom})" if extra else ")"))
        got = num_workers_for(batch_size, read_seconds, step_seconds, **extra)
        expected = reference_num_workers_for(batch_size, read_seconds, step_seconds, **extra)
        expect_whole_number(got, call, "workers come whole: round up with math.ceil, which returns "
                            "an int")
        expect(got == expected, call, str(expected), str(got),
               "one worker builds a whole batch in batch_size x read_seconds; the loop needs a "
               "batch every step_seconds; multiply by the headroom, then round up")


def _workers_floor(batch_size, read_seconds, step_seconds, headroom=1.5):
    return int(headroom * batch_size * read_seconds / step_seconds)


def _workers_rounded(batch_size, read_seconds, step_seconds, headroom=1.5):
    return round(headroom * batch_size * read_seconds / step_seconds)


def _workers_without_headroom(batch_size, read_seconds, step_seconds, headroom=1.5):
    return math.ceil(batch_size * read_seconds / step_seconds)


def _workers_per_sample(batch_size, read_seconds, step_seconds, headroom=1.5):
    return math.ceil(headroom * read_seconds / step_seconds)


def _workers_not_rounded(batch_size, read_seconds, step_seconds, headroom=1.5):
    return headroom * batch_size * read_seconds / step_seconds


# -- exercise 3: a loader that hides the wait ---------------------------------------------------

BATCH_SIZE = 32
STEP_SECONDS = 0.020
MAX_SHARE = 0.25
MEASURED_STEPS, WARMUP_STEPS = 20, 10
MEASUREMENTS = 3
MIN_WORKERS = reference_num_workers_for(BATCH_SIZE, READ_SECONDS, STEP_SECONDS)  # 3
SAMPLES_TO_COMPARE = (0, 1, 777)


@grader("a loader that hides the data wait")
def check_fast_loader(fast_loader):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "more workers than cores": nothing but the verdict
        loader = fast_loader()
        try:
            _check_configuration(loader)
            # The best of up to MEASUREMENTS: a busy machine only ever adds waiting, and a loader
            # with too few workers waits in every measurement, however quiet the machine.
            for _ in range(MEASUREMENTS):
                times = measure_data_wait(loader, device_step(STEP_SECONDS), steps=MEASURED_STEPS,
                                          warmup=WARMUP_STEPS)
                share = times["data"] / (times["data"] + times["compute"])
                if share < MAX_SHARE:
                    break
        finally:
            if isinstance(loader, DataLoader):
                shutdown_workers(loader)
    expect(share < MAX_SHARE, "the measured data-wait share", f"below {MAX_SHARE:.2f}",
           f"{share:.2f} (waited {times['data'] * 1000:.0f} ms in {MEASURED_STEPS} steps of "
           f"{STEP_SECONDS * 1000:.0f} ms)",
           "more workers, or a larger prefetch_factor; if the machine is very busy (other "
           "programs), run the check again")


def _check_configuration(loader):
    expect(isinstance(loader, DataLoader), "fast_loader()", "a torch.utils.data.DataLoader",
           f"{type(loader).__name__}", "return the DataLoader you built")
    dataset = loader.dataset
    expect(isinstance(dataset, SlowDataset), "the loader's dataset", "a SlowDataset",
           f"{type(dataset).__name__}", "load the lesson's SlowDataset, not another dataset")
    expect(loader.batch_size == BATCH_SIZE, "the loader's batch_size", str(BATCH_SIZE),
           str(loader.batch_size), "keep the batch the model trains on: a smaller batch only "
           "looks faster")
    expect(dataset.read_seconds == READ_SECONDS, "the dataset's read_seconds",
           f"{READ_SECONDS} (the files take that long to read)", str(dataset.read_seconds),
           "leave read_seconds alone: hide the reads behind compute instead")
    expect(dataset.features_path is not None, "the dataset's features_path",
           "the file of precomputed neighbour features", "None (computed for every sample, "
           "in every epoch)", "pass features_path=features_path (precomputed above)")
    for index in SAMPLES_TO_COMPARE:
        index = index % len(dataset)
        expected = neighbour_features(dataset.X, torch.tensor([index]), dataset.k)[0]
        expect_close(dataset[index][0], expected, f"the precomputed features of sample {index}",
                     hint="precompute with precompute_features(dataset, path), for this dataset",
                     rtol=1e-5, atol=1e-6)
    expect(loader.num_workers >= MIN_WORKERS, "the loader's num_workers",
           f"at least {MIN_WORKERS} (num_workers_for({BATCH_SIZE}, {READ_SECONDS}, "
           f"{STEP_SECONDS}))", str(loader.num_workers),
           "each worker needs 32 ms per batch and the step takes 20 ms: add workers, with "
           "headroom")
    order = [index for batch in loader.batch_sampler for index in batch]
    expect(sorted(order) == list(range(len(dataset))) and order != sorted(order),
           "the order of the samples in one epoch", "every sample once, shuffled",
           "in order" if order == sorted(order) else f"{len(order)} indices, some missing or "
           "repeated", "keep shuffle=True: a model trained on samples in a fixed order learns "
           "worse, and a faster loader must not change what it learns")
    enough = MEASURED_STEPS + WARMUP_STEPS
    expect(len(loader) >= enough, "the loader's number of batches", f"at least {enough}",
           str(len(loader)), "keep the whole dataset (2048 samples)")


_files = {}


def _features_file(kind: str) -> str:
    """A features file for the wrong answers: the right features, or the raw inputs."""
    if kind not in _files:
        folder = tempfile.TemporaryDirectory()  # removed when the interpreter exits
        path = str(Path(folder.name) / f"{kind}.pt")
        if kind == "right":
            precompute_features(SlowDataset(), path)
        else:
            torch.save(SlowDataset().X, path)
        _files[kind] = (folder, path)
    return _files[kind][1]


def _default_loader():
    return DataLoader(SlowDataset(), batch_size=BATCH_SIZE, shuffle=True)


def _workers_without_precomputing():
    return DataLoader(SlowDataset(), batch_size=BATCH_SIZE, shuffle=True, num_workers=4)


def _precomputed_two_workers():
    return DataLoader(SlowDataset(features_path=_features_file("right")), batch_size=BATCH_SIZE,
                      shuffle=True, num_workers=2)


def _smaller_batch():
    return DataLoader(SlowDataset(features_path=_features_file("right")), batch_size=8,
                      shuffle=True, num_workers=4)


def _free_reads():
    return DataLoader(SlowDataset(read_seconds=0.0, features_path=_features_file("right")),
                      batch_size=BATCH_SIZE, shuffle=True, num_workers=4)


def _not_shuffled():
    return DataLoader(SlowDataset(features_path=_features_file("right")), batch_size=BATCH_SIZE,
                      num_workers=4)


def _precomputed_raw_inputs():
    return DataLoader(SlowDataset(features_path=_features_file("raw")), batch_size=BATCH_SIZE,
                      shuffle=True, num_workers=4)


WRONG_ANSWERS = {
    check_data_wait_share: [
        wrong_answer("returns the compute share (1 - data share)", _share_is_one_minus),
        wrong_answer("divides data by compute, not by the total", _share_over_compute),
        wrong_answer("takes the first phase as the data phase", _share_first_phase),
        wrong_answer("returns a percentage", _share_in_percent),
    ],
    check_num_workers_for: [
        wrong_answer("rounds down", _workers_floor),
        wrong_answer("rounds to the nearest", _workers_rounded),
        wrong_answer("forgets the headroom", _workers_without_headroom),
        wrong_answer("per sample, not per batch", _workers_per_sample),
        wrong_answer("returns a float, not rounded", _workers_not_rounded),
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
    ],
}
