"""Graders for lesson 10, the input pipeline: a loader's data wait measured and the workers it
needs, and a loader that hides the wait of a deliberately slow dataset.

- measure the data wait: the record measure_data_wait made in this kernel (checks/measured_records:
  its seconds the sums of its steps, its clocks in agreement), of the lesson's loader (SlowDataset,
  no workers, batches of 32) against gpu_step: every step's data phase at least the 32 reads of
  1 ms and its compute at least 20 ms, since a sleep never ends early. No upper bound: a loaded
  machine only wakes sleepers later, so a correct measurement is never too slow. Then the share
  (data over all phases, within 1e-6) and the workers, 1.5 x data / compute rounded up (any
  integer type), judged against that record.
- evaluate on every rank: evaluation.py (the whole dataset's loss and accuracy, each sample once,
  from ranks whose DistributedSampler pads).
- a loader that hides the data wait, on each of 2 ranks: a DataLoader over the lesson's
  SlowDataset (or a Subset of it), read_seconds untouched, the precomputed neighbour features, at
  least 3 workers; the batches it deals and delivers hold 32 samples, however it was built
  (batch_size and a sampler, or a batch_sampler); the ranks' samples of one epoch shuffled,
  disjoint and together the whole dataset; a measured data-wait share below 25% on every rank.

The loader's grader runs the learner's function on 2 gloo ranks (loader_probe.py); each first reads
its loader's configuration (no measurement needed), then measures its data-wait share against a
fixed 20 ms stand-in for a GPU step (a sleep, so it grades the same on a busy laptop and on a GPU
node), and shuts the loader's workers down.
"""
import math
import numbers

from ..engine import expect, expect_close, expect_whole_number, grader
from ..engine.measured import expect_recorded, unit_slip
from ..engine.ranks import run_on_ranks
from ...topics.input_pipeline import READ_SECONDS, DataWait, SlowDataset
from .evaluation import check_distributed_evaluation  # noqa: F401 (the third exercise's grader)
from .loader_probe import (MAX_SHARE, MEASURED_STEPS, STEP_SECONDS, data_share, features_error,
                           loader_on_rank)

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


# -- exercise 2: a loader that hides the wait ---------------------------------------------------

BATCH_SIZE = 32
MIN_WORKERS = math.ceil(HEADROOM * BATCH_SIZE * READ_SECONDS / STEP_SECONDS)  # 2.4 -> 3
FEATURES_TOLERANCE = 1e-5
N_SAMPLES = len(SlowDataset())
RANKS = 2
LAUNCH_TIMEOUT_S = 120


@grader("a loader that hides the data wait")
def check_fast_loader(fast_loader):
    per_rank = run_on_ranks(loader_on_rank, fast_loader, _expect_configuration, nprocs=RANKS,
                            what=f"fast_loader() on {RANKS} ranks", timeout=LAUNCH_TIMEOUT_S,
                            hang_hint="fast_loader() should only build a DataLoader; the check "
                                      "iterates it")
    # fast_loader() takes no input: the loader and its dataset are the learner's, nothing to draw
    for rank, facts in enumerate(per_rank):
        _expect_configuration({**facts, "features_error": features_error(facts)}, rank)
    _expect_shares_of_one_epoch([facts["order"] for facts in per_rank])
    for rank, facts in enumerate(per_rank):
        expect(facts["loaded_sizes"] == [BATCH_SIZE], f"the batches rank {rank} received",
               f"{BATCH_SIZE} samples each", str(facts["loaded_sizes"]),
               "the loader deals batches of 32, but what reaches the loop differs: look at "
               "what turns the samples into a batch")
        share = data_share(facts)
        expect(share < MAX_SHARE, f"the data-wait share measured on rank {rank}",
               f"below {MAX_SHARE:.2f}", f"{share:.2f} (waited "
               f"{facts['waited'] * 1000:.0f} ms in {MEASURED_STEPS} steps of "
               f"{STEP_SECONDS * 1000:.0f} ms)", "the batches do not arrive as fast as the step "
               "takes them; if the machine is very busy (other programs), run the check again")


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
