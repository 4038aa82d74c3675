"""Measuring and modelling how data-parallel training speeds up with more ranks: speedup,
efficiency, Amdahl's law, a step's time as compute plus a ring all-reduce, and batch planning.

Strong scaling keeps the global batch and splits it over N ranks (ideal: N times less time per
step); weak scaling keeps each rank's batch, so a step does N times the work (ideal: the same time).
"""
import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .cost_model import ring_all_reduce_time
from ..training.data import make_dataset
from ..runtime.shared.env import cpu_cores, device_for_rank
from ..runtime.launcher.launch import launch
from ..training.models import make_model
from .timing import Timing, clock_now, seal, sealed_here, synchronize
from .traffic import count_traffic

__all__ = ["SCALINGS", "speedup", "efficiency", "amdahl_speedup", "fit_amdahl",
           "all_reduce_seconds", "predict_step_seconds", "accumulation_plan", "StepTiming",
           "time_ddp_steps", "measure_step_seconds", "ScalingRuns", "measure_scaling",
           "median_of_runs", "cpu_cores"]  # cpu_cores: more ranks than cores oversubscribe them

SCALINGS = ("strong", "weak")


def speedup(step_seconds: dict, scaling: str = "strong") -> dict:
    """{world_size: speedup over 1 rank}, from {world_size: seconds per step} (1 must be a key).

    Speedup is a ratio of throughputs. Under strong scaling a step does the same work on any
    world size, so it is t1 / tN; under weak scaling a step on N ranks does N times the work,
    so it is N t1 / tN.
    """
    _check_scaling(scaling)
    if 1 not in step_seconds:
        raise ValueError(f"speedup is relative to 1 rank: step_seconds needs the key 1, "
                         f"got {sorted(step_seconds)}")
    work = (lambda n: 1) if scaling == "strong" else (lambda n: n)
    return {n: work(n) * step_seconds[1] / seconds for n, seconds in step_seconds.items()}


def efficiency(step_seconds: dict, scaling: str = "strong") -> dict:
    """{world_size: speedup / world_size}: 1.0 is perfect scaling, 0.5 wastes half of each rank."""
    return {n: value / n for n, value in speedup(step_seconds, scaling).items()}


def amdahl_speedup(serial_fraction, world_size):
    """Amdahl's law: a fraction s of one rank's time cannot be split, so S(N) = 1 / (s + (1-s)/N)."""
    world_size = np.asarray(world_size, dtype=np.float64)
    return 1.0 / (serial_fraction + (1.0 - serial_fraction) / world_size)


def fit_amdahl(world_sizes, speedups) -> float:
    """The serial fraction s that fits measured speedups best, by least squares on 1 / S.

    Amdahl's law rearranged is a line through the origin: 1/S - 1/N = s (1 - 1/N).
    A measured slowdown (S < 1) fits s > 1: Amdahl's law cannot explain it (communication can).
    """
    sizes = np.asarray(world_sizes, dtype=np.float64)
    measured = np.asarray(speedups, dtype=np.float64)
    if sizes.shape != measured.shape or sizes.ndim != 1:
        raise ValueError(f"got {sizes.size} world sizes and {measured.size} speedups; "
                         f"pass one speedup per world size")
    if not np.any(sizes > 1):
        raise ValueError("fitting Amdahl's law needs a speedup measured on more than 1 rank")
    if np.any(measured <= 0):
        raise ValueError("every speedup must be positive")
    x, y = 1.0 - 1.0 / sizes, 1.0 / measured - 1.0 / sizes
    return float(np.dot(x, y) / np.dot(x, x))


def all_reduce_seconds(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    """Seconds for a ring all-reduce of the gradients of `n_parameters` (fp32: 4 bytes each)."""
    return ring_all_reduce_time(n_parameters * bytes_per_parameter, world_size, alpha, beta)


def predict_step_seconds(compute_seconds, n_parameters, world_size, alpha, beta,
                         scaling="strong", serial_seconds=0.0, bytes_per_parameter=4):
    """A data-parallel step's time: compute, plus the gradients' all-reduce (not overlapped).

    `compute_seconds` is one rank's compute for the whole global batch of the 1-rank run; under
    strong scaling each rank computes 1/N of it, under weak scaling all of it. `serial_seconds`
    is the part nobody splits (Python, launching kernels, the optimizer), paid on every rank.
    """
    _check_scaling(scaling)
    compute = compute_seconds / world_size if scaling == "strong" else compute_seconds
    return serial_seconds + compute + all_reduce_seconds(n_parameters, world_size, alpha, beta,
                                                         bytes_per_parameter)


def accumulation_plan(global_batch_size: int, max_batch_size: int, world_size: int):
    """(batch_size, grad_accum_steps) that make exactly `global_batch_size` on `world_size`
    ranks with the fewest micro-batches, none larger than `max_batch_size` (what fits)."""
    for name, value in [("global_batch_size", global_batch_size),
                        ("max_batch_size", max_batch_size), ("world_size", world_size)]:
        if value < 1:
            raise ValueError(f"{name}={value} must be at least 1")
    if global_batch_size % world_size:
        raise ValueError(f"global_batch_size={global_batch_size} cannot be split evenly over "
                         f"world_size={world_size} ranks")
    per_rank = global_batch_size // world_size
    for grad_accum_steps in range(1, per_rank + 1):  # ends at the latest at micro-batches of 1
        if per_rank % grad_accum_steps == 0 and per_rank // grad_accum_steps <= max_batch_size:
            return per_rank // grad_accum_steps, grad_accum_steps


@dataclass
class StepTiming(Timing):
    """A Timing of training steps, with what was timed: how many ranks, DDP's `bucket_cap_mb`
    (None: DDP's default), and `buckets`, the gradient all-reduces DDP ran in one step (counted
    by `count_traffic` in a step after the timed ones; None on one rank, which has no DDP)."""

    world_size: int = 1
    bucket_cap_mb: Optional[float] = None
    buckets: Optional[int] = None


def time_ddp_steps(batch_size: int, hidden: int = 32, steps: int = 20, warmup: int = 5,
                   lr: float = 0.1, bucket_cap_mb: Optional[float] = None,
                   hidden_layers: int = 1) -> StepTiming:
    """Time training steps of the course model inside a rank (call it on every rank).

    Each step starts with the ranks lined up and, on a GPU, ends after a synchronisation; its
    time is the slowest rank's. One rank trains the plain model: the honest baseline is the best
    one-device program, not DDP talking to nobody. On several ranks DDP wraps the model with
    `bucket_cap_mb`; the `warmup` steps left out include its first, single-bucket step.
    """
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    device = device_for_rank()
    model = make_model(seed=0, hidden=hidden, hidden_layers=hidden_layers).to(device)
    if world_size > 1:
        device_ids = [device.index] if device.type == "cuda" else None
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids,
                                                          bucket_cap_mb=bucket_cap_mb)
    X, y = (tensor.to(device) for tensor in make_dataset(n_samples=batch_size, seed=rank).tensors)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    line_up = torch.zeros(1, device=device)

    def step():
        loss = F.cross_entropy(model(X), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()

    seconds = []
    for _ in range(warmup + steps):
        if world_size > 1:
            dist.all_reduce(line_up)  # start together, as in cost_model.measure_all_reduce
        synchronize(device)
        start = time.perf_counter()
        step()
        synchronize(device)  # on a GPU, the step is done when the kernels are, not when Python is
        seconds.append(time.perf_counter() - start)
    buckets = None
    if world_size > 1:  # a step ends when its slowest rank is done
        slowest = torch.tensor(seconds, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds = slowest.tolist()
        with count_traffic() as traffic:  # one more step, untimed: the counter slows every op
            step()
        buckets = traffic.collectives.count("all_reduce")
    return StepTiming(seconds=seconds[warmup:], warmup_seconds=seconds[:warmup],
                      world_size=world_size, bucket_cap_mb=bucket_cap_mb, buckets=buckets)


def measure_step_seconds(world_size: int, batch_size: int, hidden: int = 32, steps: int = 20,
                         warmup: int = 5, backend=None, timeout: float = 120,
                         output: str = "none") -> Timing:
    """Launch `world_size` fresh ranks, each training on `batch_size` samples; rank 0's Timing."""
    return launch(time_ddp_steps, batch_size, hidden=hidden, steps=steps, warmup=warmup,
                  nprocs=world_size, backend=backend, timeout=timeout, output=output)[0]


class ScalingRuns(dict):
    """measure_scaling's result, {world_size: [median seconds per step of each run]}, with the raw
    record it came from: `timings` ({world_size: [each run's StepTiming, every step's seconds]}),
    `batch_size`, `scaling`, `clock` (clock_now() at the start and at the end) and a seal.
    `recorded_here()` says whether measure_scaling made it in this session, unchanged."""

    def facts(self):
        return (sorted(self.items()), sorted(self.timings.items()), self.batch_size, self.scaling,
                self.clock)

    def recorded_here(self) -> bool:
        try:
            return sealed_here(self, self.facts())
        except AttributeError:  # made by hand: no raw record
            return False


def measure_scaling(world_sizes, batch_size: int, scaling: str = "strong", runs: int = 3,
                    **measure_kwargs) -> ScalingRuns:
    """{world_size: [median seconds per step of each run]}.

    `batch_size` is the global batch under strong scaling (each rank gets batch_size / N) and
    each rank's batch under weak scaling. The world sizes take turns, run after run, so that a
    burst of background load slows them all alike rather than one of them.
    """
    _check_scaling(scaling)
    for n in world_sizes:
        if scaling == "strong" and batch_size % n:
            raise ValueError(f"strong scaling splits the global batch {batch_size} over {n} "
                             f"ranks: pick a batch_size divisible by every world size")
    medians, started = ScalingRuns({n: [] for n in world_sizes}), clock_now()
    medians.timings = {n: [] for n in world_sizes}
    with warnings.catch_warnings(record=True) as caught:  # launch warns on every run: say it once
        warnings.simplefilter("always")
        for _ in range(runs):
            for n in world_sizes:
                per_rank = batch_size // n if scaling == "strong" else batch_size
                timing = measure_step_seconds(n, per_rank, **measure_kwargs)
                medians[n].append(timing.median)
                medians.timings[n].append(timing)
    for message, category in {str(w.message): w.category for w in caught}.items():
        warnings.warn(message, category, stacklevel=2)
    medians.batch_size, medians.scaling, medians.clock = batch_size, scaling, (started, clock_now())
    medians.seal = seal(medians.facts())
    return medians


def median_of_runs(medians: dict) -> dict:
    """{world_size: median over runs} from measure_scaling's result."""
    return {n: statistics.median(values) for n, values in medians.items()}


def _check_scaling(scaling: str) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not one of {SCALINGS}")
