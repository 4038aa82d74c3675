"""Graders for lesson 10, the input pipeline: a loader's data wait measured and the workers it
needs, and a loader that hides the wait of a deliberately slow dataset.

- measure the data wait: the record measure_data_wait made in this kernel (checks/measured_records:
  its seconds the sums of its steps, its clocks in agreement), of the lesson's loader (SlowDataset,
  no workers, batches of 32) against gpu_step: every step's data phase at least the 32 reads of
  1 ms and its compute at least 20 ms, since a sleep never ends early. No upper bound: a loaded
  machine only wakes sleepers later, so a correct measurement is never too slow. Then the share
  (data over all phases, within 1e-6) and the workers, 1.5 x data / compute rounded up (any
  integer type), judged against that record.
- a loader that hides the data wait, on each of 2 ranks: a DataLoader over the lesson's
  SlowDataset (or a Subset of it), read_seconds untouched, the precomputed neighbour features, at
  least 3 workers; the batches it deals and delivers hold 32 samples, however it was built
  (batch_size and a sampler, or a batch_sampler); the ranks' samples of one epoch shuffled,
  disjoint and together the whole dataset; a measured data-wait share below 25% on every rank.

The loader's grader runs the learner's function on 2 gloo ranks; each first reads its loader's
configuration (no measurement needed), then measures its data-wait share against a fixed 20 ms
stand-in for a GPU step (a sleep, so it grades the same on a busy laptop and on a GPU node), and
shuts the loader's workers down.
"""
import math
import numbers
import os
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, Subset

from .engine import GradingError, expect, expect_close, expect_whole_number, grader, wrong_answer
from .engine.measured import expect_recorded, unit_slip
from .engine.ranks import run_on_ranks
from ..topics.input_pipeline import (READ_SECONDS, DataWait, SlowDataset, device_step,
                                     measure_data_wait, neighbour_features, precompute_features,
                                     shutdown_workers)

# -- exercise 1: measure a loader's data wait, and size its workers -----------------------------

HEADROOM = 1.5
MEASURE_CALL = "measure_data_wait(loader, gpu_step)"
GPU_STEP_SECONDS = 0.020  # the lesson's gpu_step
MEASURED_BATCH_SIZE, MIN_MEASURED_STEPS = 32, 5
CLOCK_SLACK = 1e-4  # a sleep never ends early; this only absorbs the clock's rounding


@grader("measure the data wait")
def check_loader_measurement(measurement, share, num_workers):
    _expect_the_sums_of_its_steps(measurement)
    expect_recorded(measurement, DataWait, "measurement", MEASURE_CALL,
                    lambda record: record["data"] + record["compute"])
    _expect_the_lessons_loader(measurement)
    data, compute = measurement["data"], measurement["compute"]
    expect_close(_as_float(share), data / (data + compute),
                 "share, the data-wait share of your measurement",
                 "the seconds waiting for data over the seconds of all phases: a fraction "
                 "between 0 and 1", rtol=1e-6, atol=1e-9)
    expected = math.ceil(HEADROOM * data / compute)
    expect_whole_number(num_workers, "num_workers", "a number of processes is a whole number: "
                        "round the way that keeps the headroom")
    expect(num_workers == expected, "num_workers, from your measurement", str(expected),
           str(num_workers), _workers_hint(num_workers, data, compute))


def step_phases(record: DataWait) -> list:
    """[(seconds waiting for the batch, seconds in the step)] of each measured step."""
    return [(loaded - started, finished - loaded) for started, loaded, finished in record.steps]


def _expect_the_sums_of_its_steps(record):
    """A record's seconds per phase are the sums of its steps' (added in the same order)."""
    if not isinstance(record, DataWait):
        return  # expect_recorded says what it is instead
    phases = step_phases(record)
    for index, phase in enumerate(("data", "compute")):
        recorded, got = sum(seconds[index] for seconds in phases), record.get(phase)
        if isinstance(got, (int, float)) and abs(got - recorded) <= 1e-9 * max(1.0, recorded):
            continue
        ratio = got / recorded if isinstance(got, (int, float)) and recorded > 0 else 0.0
        expect(False, f"measurement['{phase}']",
               f"{recorded:.6f} s, the sum of its {len(phases)} recorded steps", repr(got),
               unit_slip(ratio) or "the seconds were changed after measuring: pass the record "
               "as measure_data_wait returned it")


def _expect_the_lessons_loader(record):
    """The record is of the loader the exercise names, measured against gpu_step: a loader without
    workers over SlowDataset, batches of 32, each step's phases no shorter than their sleeps."""
    steps = len(record.steps)
    expect(steps >= MIN_MEASURED_STEPS, "the steps your measurement recorded",
           f"at least {MIN_MEASURED_STEPS} (measure_data_wait's default is 20)", str(steps),
           "a few steps say little about a loader: keep the default number of steps")
    expect(record.num_workers == 0, "the measured loader's num_workers", "0",
           str(record.num_workers), "the exercise measures the loader without workers: with "
           "workers the data phase is no longer the reads of one batch")
    expect(set(record.batch_sizes) == {MEASURED_BATCH_SIZE}, "the measured batches' sizes",
           f"{MEASURED_BATCH_SIZE} in every step", str(sorted(set(record.batch_sizes))),
           "measure the loader the exercise names, with its batch size")
    reads = MEASURED_BATCH_SIZE * READ_SECONDS
    for step, (data, compute) in enumerate(step_phases(record)):
        expect(data >= reads * (1 - CLOCK_SLACK), f"the data phase of measured step {step}",
               f"at least {reads * 1000:.0f} ms: {MEASURED_BATCH_SIZE} reads of "
               f"{READ_SECONDS * 1000:.0f} ms, each a sleep that cannot end early",
               f"{data * 1000:.2f} ms", "measure the loader that reads its samples in the loop: "
               "no workers, nothing loaded ahead")
        expect(compute >= GPU_STEP_SECONDS * (1 - CLOCK_SLACK),
               f"the compute phase of measured step {step}",
               f"at least {GPU_STEP_SECONDS * 1000:.0f} ms (gpu_step sleeps that long)",
               f"{compute * 1000:.2f} ms", "measure with the lesson's gpu_step as the step")
    expect(record.dataset == "SlowDataset", "the measured loader's dataset",
           "SlowDataset (precomputed_dataset)", record.dataset,
           "measure a DataLoader over the lesson's precomputed_dataset")


def _workers_hint(num_workers, data, compute):
    if isinstance(num_workers, numbers.Integral) and num_workers < HEADROOM * data / compute:
        return ("too few for the measured reads: with headroom, the workers together must "
                "deliver batches faster than the loop takes them")
    return ("one worker delivers a batch in the time the loop waited for one without workers; "
            "use the measured reads and step, not the nominal ones, and the exercise's headroom")


def _as_float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value  # expect_close describes what came back


# Made-up figures: what a busy 2-core machine measured once, typed in rather than measured.
MADE_UP = {"data": 0.946, "compute": 0.404}


def _record_of(loader, step, change=None):
    """A real record, made cheaply at import, of a measurement the exercise did not ask for."""
    record = measure_data_wait(loader, step, steps=MIN_MEASURED_STEPS, warmup=0)
    if change is not None:
        change(record)
    return record


def _in_milliseconds(record):
    record["data"], record["compute"] = record["data"] * 1000, record["compute"] * 1000


def _no_op_step(batch):
    return None


def _list_of_batches():
    X, y = torch.zeros(MEASURED_BATCH_SIZE, 16), torch.zeros(MEASURED_BATCH_SIZE, dtype=torch.long)
    return [(X, y)] * MIN_MEASURED_STEPS


def _unread_slow_dataset():
    return DataLoader(SlowDataset(n_samples=MIN_MEASURED_STEPS * MEASURED_BATCH_SIZE,
                                  read_seconds=0.0), batch_size=MEASURED_BATCH_SIZE)


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
        expect(facts["loaded_sizes"] == [BATCH_SIZE], f"the batches rank {rank} received",
               f"{BATCH_SIZE} samples each", str(facts["loaded_sizes"]),
               "the loader deals batches of 32, but what reaches the loop differs: look at "
               "what turns the samples into a batch")
        expect(facts["share"] < MAX_SHARE, f"the data-wait share measured on rank {rank}",
               f"below {MAX_SHARE:.2f}", f"{facts['share']:.2f} (waited "
               f"{facts['waited'] * 1000:.0f} ms in {MEASURED_STEPS} steps of "
               f"{STEP_SECONDS * 1000:.0f} ms)", "the batches do not arrive as fast as the step "
               "takes them; if the machine is very busy (other programs), run the check again")


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
                             waited=times["data"], loaded_sizes=sorted(set(times.batch_sizes)))
                if facts["share"] < MAX_SHARE:
                    break
        finally:
            if isinstance(loader, DataLoader):
                shutdown_workers(loader)
    return facts


def _facts(loader) -> dict:
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
    expect(facts["batch_sizes"] == [BATCH_SIZE], "the sizes of the batches it deals" + where,
           f"{BATCH_SIZE} samples in every batch", str(facts["batch_sizes"]),
           "keep the batch the model trains on: a smaller batch only looks faster")
    expect(facts["read_seconds"] == READ_SECONDS, "the dataset's read_seconds" + where,
           f"{READ_SECONDS} (the files take that long to read)", str(facts["read_seconds"]),
           "leave read_seconds alone: hide the reads behind compute instead")
    expect(facts["precomputed"], "the dataset's features_path" + where,
           "the file of precomputed neighbour features", "None (computed for every sample, "
           "in every epoch)", "the features are computed again for every sample it reads: "
           "section 3 computed them once, into a file")
    expect(facts["features_error"] <= FEATURES_TOLERANCE, "the precomputed features" + where,
           "the neighbour features of each sample", f"features off by up to "
           f"{facts['features_error']:.3g}", "the file holds something other than this dataset's "
           "neighbour features")
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
           "each rank must load its own share of the epoch, a different one on every rank, "
           "together the whole dataset")
    expect(all(order != sorted(order) for order in orders), "the order of each rank's samples",
           "shuffled", "in order", "a rank's share arrives in index order: the model would see the "
           "same sequence every epoch, and learns worse")


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


def _batch_sampler_of_16():
    dataset, sampler = _precomputed()
    return DataLoader(dataset, batch_sampler=BatchSampler(sampler, 16, False), num_workers=4)


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
        wrong_answer("made-up seconds, share and workers consistent with them",
                     MADE_UP, 0.946 / 1.35, 4),
        wrong_answer("the same figures in milliseconds", {"data": 946.0, "compute": 404.0},
                     0.946 / 1.35, 4),
        wrong_answer("a real record, converted to milliseconds in place",
                     _record_of(_list_of_batches(), _no_op_step, _in_milliseconds), 0.5, 1),
        wrong_answer("a list of batches in memory measured, with no step: no reads, no compute",
                     _record_of(_list_of_batches(), _no_op_step), 0.5, 1),
        wrong_answer("SlowDataset with read_seconds=0, no step",
                     _record_of(_unread_slow_dataset(), _no_op_step), 0.5, 1),
    ],
    check_fast_loader: [
        wrong_answer("the default loader: no workers, features per sample", _default_loader),
        wrong_answer("4 workers, features still computed per sample",
                     _workers_without_precomputing),
        wrong_answer("precomputed features, 2 workers (no headroom)", _precomputed_two_workers),
        wrong_answer("a smaller batch", _smaller_batch),
        wrong_answer("a batch_sampler of 16 over the DistributedSampler", _batch_sampler_of_16),
        wrong_answer("reads made free (read_seconds=0)", _free_reads),
        wrong_answer("precomputed features and 4 workers, but not shuffled", _not_shuffled),
        wrong_answer("precomputed the raw inputs, not the neighbour features",
                     _precomputed_raw_inputs),
        wrong_answer("no DistributedSampler: every rank loads the whole dataset",
                     _whole_dataset_on_every_rank),
        wrong_answer("a DistributedSampler fixed to rank 0's share", _rank_zero_share_everywhere),
    ],
}
