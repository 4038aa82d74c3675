"""Measuring and modelling how data-parallel training speeds up with more ranks: speedup,
efficiency, Amdahl's law, a step's time as compute plus a ring all-reduce, and batch planning.

Strong scaling keeps the global batch and splits it over N ranks (ideal: N times less time per
step); weak scaling keeps each rank's batch, so a step does N times the work (ideal: the same time).
"""
import math
import statistics
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .cost_model import ring_all_reduce_time
from ..training.data import make_dataset
from ..runtime.shared.env import choose_start_method, cpu_cores, device_for_rank, threads_per_rank
from ..runtime.launcher.launch import launch
from ..training.models import make_model
from .timing import Timing, clock_now, seal, sealed_here, spread, synchronize
from .traffic import count_traffic

__all__ = ["SCALINGS", "speedup", "efficiency", "amdahl_speedup", "fit_amdahl",
           "all_reduce_seconds", "predict_step_seconds", "accumulation_plan", "StepTiming",
           "time_ddp_steps", "measure_step_seconds", "ScalingRuns", "measure_scaling",
           "median_of_runs", "paired_ratios", "spread", "SyncCost", "time_sync_cost",
           "measure_sync_cost", "communication_share", "SpeedupPairs", "time_speedup_pairs",
           "measure_speedup_pairs", "median_interval", "SPEEDUP_VERDICTS", "pairs_efficiency",
           "rank_threads", "cpu_cores"]  # cpu_cores: more ranks than cores oversubscribe them

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
    by `count_traffic` in a step after the timed ones; None on one rank, which has no DDP), and
    `ddp`: False for twins, ranks that each train the plain model on their own batch)."""

    world_size: int = 1
    bucket_cap_mb: Optional[float] = None
    buckets: Optional[int] = None
    ddp: bool = True


def time_ddp_steps(batch_size: int, hidden: int = 32, steps: int = 20, warmup: int = 5,
                   lr: float = 0.1, bucket_cap_mb: Optional[float] = None,
                   hidden_layers: int = 1, ddp: bool = True) -> StepTiming:
    """Time training steps of the course model inside a rank (call it on every rank).

    Each step starts with the ranks lined up and, on a GPU, ends after a synchronisation; its
    time is the slowest rank's. One rank trains the plain model: the honest baseline is the best
    one-device program, not DDP talking to nobody. On several ranks DDP wraps the model with
    `bucket_cap_mb`; the `warmup` steps left out include its first, single-bucket step. With
    `ddp=False` each rank trains the plain model alone (twins: a 1-rank baseline that keeps as
    many processes busy as the run it is compared with), still lined up and timed as the slowest.
    """
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    device = device_for_rank()
    model = make_model(seed=0, hidden=hidden, hidden_layers=hidden_layers).to(device)
    if world_size > 1 and ddp:
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
        seconds = _slowest_rank(seconds, device)
    if world_size > 1 and ddp:
        with count_traffic() as traffic:  # one more step, untimed: the counter slows every op
            step()
        buckets = traffic.collectives.count("all_reduce")
    return StepTiming(seconds=seconds[warmup:], warmup_seconds=seconds[:warmup],
                      world_size=world_size, bucket_cap_mb=bucket_cap_mb, buckets=buckets, ddp=ddp)


def _slowest_rank(values, device):
    """Each entry's maximum over the ranks (call it on every rank)."""
    slowest = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def measure_step_seconds(world_size: int, batch_size: int, hidden: int = 32, steps: int = 20,
                         warmup: int = 5, backend=None, timeout: float = 120,
                         output: str = "none", twins: int = 1) -> Timing:
    """Launch `world_size` fresh ranks, each training on `batch_size` samples; rank 0's Timing.

    On 1 rank, `twins=2` launches two processes that each train the plain model alone (no DDP),
    so that the baseline keeps as many cores busy as a 2-rank run: on a CPU whose cores share
    caches, memory and a scheduler with other jobs, the comparison then measures the split of the
    batch and the all-reduce, not how busy the other core happened to be."""
    twinned = world_size == 1 and twins > 1
    return launch(time_ddp_steps, batch_size, hidden=hidden, steps=steps, warmup=warmup,
                  ddp=not twinned, nprocs=twins if twinned else world_size, backend=backend,
                  timeout=timeout, output=output)[0]


class ScalingRuns(dict):
    """measure_scaling's result, {world_size: [median seconds per step of each run]}, with the raw
    timings it came from: `timings` ({world_size: [each run's StepTiming, every step's seconds]}).
    (No grader takes it: lesson 09's exercise grades SpeedupPairs, which carries a seal.)"""


def measure_scaling(world_sizes, batch_size: int, scaling: str = "strong", runs: int = 3,
                    **measure_kwargs) -> ScalingRuns:
    """{world_size: [median seconds per step of each run]}.

    `batch_size` is the global batch under strong scaling (each rank gets batch_size / N) and
    each rank's batch under weak scaling. The world sizes take turns, run after run, so that a
    burst of background load slows them all alike rather than one of them. `measure_kwargs` go to
    measure_step_seconds (`twins=2`: the 1-rank baseline runs as twins).
    """
    _check_scaling(scaling)
    for n in world_sizes:
        if scaling == "strong" and batch_size % n:
            raise ValueError(f"strong scaling splits the global batch {batch_size} over {n} "
                             f"ranks: pick a batch_size divisible by every world size")
    medians = ScalingRuns({n: [] for n in world_sizes})
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
    return medians


def median_of_runs(medians: dict) -> dict:
    """{world_size: median over runs} from measure_scaling's result."""
    return {n: statistics.median(values) for n, values in medians.items()}


def rank_threads(nprocs: int = 2) -> int:
    """The intra-op threads (torch.set_num_threads) that `launch` gives each of `nprocs` ranks
    here: 1 when the ranks are forked (runtime/shared/env.threads_per_rank says why)."""
    return threads_per_rank(nprocs, choose_start_method()[0])


def paired_ratios(runs: dict, world_size: int, scaling: str = "strong") -> list:
    """Run by run, the speedup of `world_size` ranks over 1: run i of each, taken in turn."""
    _check_scaling(scaling)
    work = world_size if scaling == "weak" else 1
    return [work * one / many for one, many in zip(runs[1], runs[world_size])]


def median_interval(values, confidence: float = 0.9):
    """(low, high): a `confidence` interval for the median of `values`, from their order (the
    sign test's: the median lies below the k-th smallest with probability P(Binomial(n, 1/2) < k),
    whatever the distribution). It narrows as the values grow in number, while their spread does
    not: the interval a conclusion about the median may rest on."""
    ordered = sorted(float(value) for value in values)
    n = len(ordered)
    below = 0.0  # P(Binomial(n, 1/2) <= k - 1), for k = 1, 2, ...
    for k in range(1, n // 2 + 1):
        below += math.comb(n, k - 1) / 2 ** n
        if below > (1 - confidence) / 2:
            k -= 1
            break
    else:
        k = n // 2
    if k < 1:
        raise ValueError(f"{n} values are too few for a {confidence:.0%} interval of the median")
    return ordered[k - 1], ordered[n - k]


@dataclass
class SyncCost:
    """Pairs of DDP steps timed back to back on the same ranks, one with the gradients'
    all-reduce and one under no_sync (no communication): `with_sync[i]` and `without_sync[i]`
    are the i-th pair's seconds per step, the slowest rank's."""

    with_sync: List[float]
    without_sync: List[float]
    world_size: int
    batch_size: int
    hidden: int


def time_sync_cost(batch_size: int, hidden: int = 32, pairs: int = 16, warmup: int = 2,
                   steps_per_sample: int = 2, hidden_layers: int = 1) -> SyncCost:
    """Inside a rank (call it on every rank): what DDP's communication costs a step.

    The two variants take turns (with, without, without, with, ...), so that a burst of load
    slows both members of a pair; each sample is `steps_per_sample` steps, timed together.
    """
    world_size, rank = dist.get_world_size(), dist.get_rank()
    device = device_for_rank()
    model = make_model(seed=0, hidden=hidden, hidden_layers=hidden_layers).to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
    X, y = (tensor.to(device) for tensor in make_dataset(n_samples=batch_size, seed=rank).tensors)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    line_up, samples = torch.zeros(1, device=device), {True: [], False: []}
    for pair in range(warmup + pairs):
        for sync in ((True, False) if pair % 2 == 0 else (False, True)):
            dist.all_reduce(line_up)
            synchronize(device)
            start = time.perf_counter()
            for _ in range(steps_per_sample):
                with nullcontext() if sync else model.no_sync():  # no_sync: no all-reduce
                    loss = F.cross_entropy(model(X), y)
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                optimizer.step()
            synchronize(device)
            samples[sync].append((time.perf_counter() - start) / steps_per_sample)
    with_sync, without_sync = (_slowest_rank(samples[sync][warmup:], device)
                               for sync in (True, False))
    return SyncCost(with_sync, without_sync, world_size, batch_size, hidden)


@dataclass
class SpeedupPairs:
    """Pairs of steps timed back to back in the same processes: `one_rank[i]`, a plain model
    training alone in every process (twins, the 1-rank baseline), and `ranks[i]`, the DDP step
    on `world_size` ranks; the slowest process's seconds per step, each the mean of
    `steps_per_sample` steps. `speedups()`: pair by pair. measure_speedup_pairs adds its record:
    `clock` (clock_now() at the start and at the end) and a seal; `recorded_here()` says whether
    it made this one in this session, unchanged."""

    one_rank: List[float]
    ranks: List[float]
    world_size: int
    scaling: str
    batch_size: int = 0
    steps_per_sample: int = 1
    clock: tuple = ()
    seal: str = ""

    def speedups(self) -> list:
        work = self.world_size if self.scaling == "weak" else 1
        return [work * one / many for one, many in zip(self.one_rank, self.ranks)]

    def facts(self) -> tuple:
        return (list(self.one_rank), list(self.ranks), self.world_size, self.scaling,
                self.batch_size, self.steps_per_sample, tuple(self.clock))

    def recorded_here(self) -> bool:
        return sealed_here(self, self.facts())


def time_speedup_pairs(batch_size: int, scaling: str = "strong", hidden: int = 32,
                       pairs: int = 16, warmup: int = 2, steps_per_sample: int = 2):
    """Inside a rank (call it on every rank): the 1-rank step and the DDP step, taking turns.

    `batch_size` is the global batch (strong) or each rank's (weak). The baseline is the plain
    model on the whole 1-rank batch, run in every process at once, so that both variants keep
    the same cores busy; the two alternate (A B B A ...), so a burst of load slows both."""
    _check_scaling(scaling)
    world_size, rank = dist.get_world_size(), dist.get_rank()
    device = device_for_rank()
    per_rank = batch_size // world_size if scaling == "strong" else batch_size
    alone = make_model(seed=0, hidden=hidden).to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = torch.nn.parallel.DistributedDataParallel(make_model(seed=0, hidden=hidden).to(device),
                                                    device_ids=device_ids)
    variants = {False: (alone, batch_size), True: (ddp, per_rank)}
    data = {key: [t.to(device) for t in make_dataset(n_samples=n, seed=rank).tensors]
            for key, (_, n) in variants.items()}
    optimizers = {key: torch.optim.SGD(model.parameters(), lr=0.01)
                  for key, (model, _) in variants.items()}
    line_up, samples = torch.zeros(1, device=device), {False: [], True: []}
    for pair in range(warmup + pairs):
        for key in ((False, True) if pair % 2 == 0 else (True, False)):
            (model, _), (X, y) = variants[key], data[key]
            dist.all_reduce(line_up)
            synchronize(device)
            start = time.perf_counter()
            for _ in range(steps_per_sample):
                loss = F.cross_entropy(model(X), y)
                optimizers[key].zero_grad(set_to_none=True)
                loss.backward()
                optimizers[key].step()
            synchronize(device)
            samples[key].append((time.perf_counter() - start) / steps_per_sample)
    one_rank, ranks = (_slowest_rank(samples[key][warmup:], device) for key in (False, True))
    return SpeedupPairs(one_rank, ranks, world_size, scaling, batch_size, steps_per_sample)


def measure_speedup_pairs(world_size: int, batch_size: int, scaling: str = "strong",
                          hidden: int = 32, pairs: int = 16, steps_per_sample: int = 2,
                          backend=None, timeout: float = 120) -> SpeedupPairs:
    """Launch `world_size` fresh ranks and run time_speedup_pairs on them; rank 0's result,
    with its record: the clock around the launch, and a seal."""
    started = clock_now()
    measured = launch(time_speedup_pairs, batch_size, scaling, hidden=hidden, pairs=pairs,
                      steps_per_sample=steps_per_sample, nprocs=world_size, backend=backend,
                      timeout=timeout, output="none")[0]
    measured.clock = (started, clock_now())
    measured.seal = seal(measured.facts())
    return measured


SPEEDUP_VERDICTS = ("faster than 1 rank", "slower than 1 rank", "undecided")


def pairs_efficiency(one_rank, ranks, world_size: int, scaling: str = "strong"):
    """(efficiency, (low, high), verdict) from pairs of steps (SpeedupPairs' lists): each pair's
    speedup (t1 / tN, or N t1 / tN under weak scaling) over `world_size`, the median of those
    efficiencies and its 90% interval (median_interval); "faster than 1 rank" when the whole
    interval is above 1 / N (a speedup above 1), "slower than 1 rank" when it is all below,
    "undecided" when it straddles 1 / N. (Exercise 1's reference.)"""
    _check_scaling(scaling)
    work = world_size if scaling == "weak" else 1
    efficiencies = [work * one / many / world_size for one, many in zip(one_rank, ranks)]
    low, high = median_interval(efficiencies)
    verdict = (SPEEDUP_VERDICTS[0] if low > 1 / world_size
               else SPEEDUP_VERDICTS[1] if high < 1 / world_size else SPEEDUP_VERDICTS[2])
    return statistics.median(efficiencies), (low, high), verdict


def measure_sync_cost(world_size: int, batch_size: int, hidden: int = 32, pairs: int = 16,
                      steps_per_sample: int = 2, hidden_layers: int = 1, backend=None,
                      timeout: float = 120) -> SyncCost:
    """Launch `world_size` fresh ranks and run time_sync_cost on them; rank 0's SyncCost."""
    return launch(time_sync_cost, batch_size, hidden=hidden, pairs=pairs,
                  steps_per_sample=steps_per_sample, hidden_layers=hidden_layers,
                  nprocs=world_size, backend=backend, timeout=timeout, output="none")[0]


def communication_share(with_sync, without_sync):
    """(share, (low, high), verdict): the fraction of a step that its communication costs, pair
    by pair, (with - without) / with; the median of those shares and its 90% interval
    (median_interval); "communication-bound" when the whole interval is above one half,
    "compute-bound" when it is all below, "undecided" when it straddles one half.
    (Exercise 2's reference.)"""
    shares = [(synced - alone) / synced for synced, alone in zip(with_sync, without_sync)]
    low, high = median_interval(shares)
    verdict = ("communication-bound" if low > 0.5 else "compute-bound" if high < 0.5
               else "undecided")
    return statistics.median(shares), (low, high), verdict


def _check_scaling(scaling: str) -> None:
    if scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r} is not one of {SCALINGS}")
