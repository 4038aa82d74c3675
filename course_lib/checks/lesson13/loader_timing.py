"""Timing a learner's loader against the broken one inside a rank, in turns, on the same machine.

A busy machine only ever adds time, so each loader's best of MEASUREMENTS is what counts; the
batches each loader gives are recorded too, so that a faster loader of other samples is seen.
What loader_on_rank returns is plain data (engine/boundary.py): the grader compares it. The samples
on the slow storage come from the grading seed (make_dataset's seed DATA_SEED in a notebook).
"""
import math
import warnings

from torch.utils.data import DataLoader

from ...topics import debugging
from ...topics.input_pipeline import device_step, measure_data_wait, shutdown_workers
from ...training.data import make_dataset

MEASUREMENTS = 3          # each loader's best of this many, in turns
WARMUP, MEASURED = 4, 16  # the 20 batches of one epoch on each rank
DATA_SEED = 5             # debugging.SamplesOnDisk's own


def loader_on_rank(make_loader, data_seed: int = DATA_SEED) -> dict:
    """In a rank: this rank's batches from both loaders, and the seconds a step takes with each."""
    dataset = debugging.SamplesOnDisk()
    dataset.X, dataset.y = make_dataset(n_samples=len(dataset), seed=data_seed).tensors
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. "more workers than cores"
        loader = make_loader(dataset)
        own = getattr(getattr(loader, "dataset", None), "read_seconds", debugging.READ_SECONDS)
        facts = {"read_seconds": _number(dataset.read_seconds), "broken": [], "fixed": [],
                 "own_read_seconds": _number(own)}
        try:
            for _ in range(MEASUREMENTS):
                broken_loader = debugging.make_loader_broken(dataset)
                broken, facts["broken_batches"] = seconds_per_step(broken_loader)
                fixed, facts["batches"] = seconds_per_step(loader)
                facts["broken"].append(broken)
                facts["fixed"].append(fixed)
                if facts["batches"] != facts["broken_batches"]:
                    break
        finally:
            if isinstance(loader, DataLoader):
                shutdown_workers(loader)
    return facts


def seconds_per_step(loader):
    """(seconds a step takes with `loader`, [(sum of X, labels) of each batch]), or (inf, the
    error's text) when the loader cannot give MEASURED + WARMUP batches."""
    seen = []
    step = device_step(debugging.STEP_SECONDS)

    def record_then_step(batch):
        X, y = batch
        seen.append((round(float(X.sum()), 4), tuple(y.tolist())))
        step(batch)

    try:
        times = measure_data_wait(loader, record_then_step, steps=MEASURED, warmup=WARMUP)
    except (StopIteration, TypeError, ValueError) as error:
        return math.inf, f"{type(error).__name__}: {error}"[:120]
    return (times["data"] + times["compute"]) / MEASURED, seen


def _number(value):
    """A learner's value as plain data: the number it is, or its repr."""
    return value if type(value) in (int, float) else repr(value)
