"""The alpha-beta cost model of communication: a message of n bytes takes alpha + n * beta
seconds (alpha: latency, beta: seconds per byte); measuring, fitting, and bus bandwidth; a health
check (lesson 12) that compares an all-reduce's bus bandwidth with what one link of the ring carries.

    ring all-reduce:   2 (N - 1) alpha + 2 (N - 1) / N * n * beta
    naive all-reduce:  2 (N - 1) (alpha + n * beta)       (all through rank 0's link)
    tree all-reduce:   2 ceil(log2 N) (alpha + n * beta)   (reduce up a binary tree, broadcast down)

Bytes, per step, for the parameters P of a data-parallel model: DDP's ring all-reduce makes every
rank send (and receive) 2 (N - 1) / N * P; torch's ZeRO-1 (ZeroRedundancyOptimizer under DDP)
adds a broadcast of every parameter, (N - 1) / N * P more on a ring: 1.5 times DDP's bytes.
DataParallel broadcasts P from device 0 and reduces P back onto it, which with NCCL is P each
way through device 0, and without NCCL a star of copies, (N - 1) * P each way.

Bus bandwidth follows nccl-tests (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md): the
algorithm bandwidth n / t times 2 (N - 1) / N, the fraction of the data each rank must move in
an all-reduce. It is comparable across world sizes and to the hardware's link speed.
"""
import math
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from .timing import clock_now, seal, sealed_here, synchronize

__all__ = ["AllReduceSweep", "ring_all_reduce_time", "naive_all_reduce_time", "tree_all_reduce_time",
           "ring_all_reduce_bytes", "ring_broadcast_bytes", "data_parallel_device0_bytes",
           "fit_alpha_beta", "algorithm_bandwidth", "bus_bandwidth", "measure_all_reduce",
           "PUBLISHED_ALL_REDUCE", "PUBLISHED_SOURCE", "published_seconds", "HEALTHY_SHARE",
           "measure_ring_link", "all_reduce_health"]


def ring_all_reduce_time(nbytes, world_size, alpha, beta):
    """Seconds for a ring all-reduce of `nbytes` over `world_size` ranks."""
    return 2 * (world_size - 1) * alpha + _ring_fraction(world_size) * nbytes * beta


def naive_all_reduce_time(nbytes, world_size, alpha, beta):
    """Seconds when every rank sends its tensor to rank 0 and rank 0 sends the sum back."""
    return 2 * (world_size - 1) * (alpha + nbytes * beta)


def tree_all_reduce_time(nbytes, world_size, alpha, beta):
    """Seconds to reduce whole tensors up a binary tree, then broadcast the sum back down."""
    return 2 * math.ceil(math.log2(world_size)) * (alpha + nbytes * beta)


def ring_all_reduce_bytes(nbytes, world_size):
    """Bytes each rank sends, and receives, in a ring all-reduce of `nbytes`: 2 (N - 1) / N."""
    return _ring_fraction(world_size) * nbytes


def ring_broadcast_bytes(nbytes, world_size):
    """Bytes each rank sends on average in a pipelined ring broadcast of `nbytes`: (N - 1) / N.

    The root sends the tensor once and every rank but the last forwards it: N - 1 copies among N
    ranks (nccl-tests' doc/PERFORMANCE.md: a broadcast's bus bandwidth is its algorithm bandwidth).
    """
    return (world_size - 1) / world_size * nbytes


def data_parallel_device0_bytes(parameter_bytes, devices, nccl=True):
    """Bytes device 0 sends, and receives, per nn.DataParallel step for parameters and gradients.

    Every forward, replicate broadcasts the parameters from device 0 (comm.broadcast_coalesced);
    every backward sums the replicas' gradients onto it (comm.reduce_add_coalesced); nothing is
    sent back, the next forward broadcasts again. With NCCL both are NCCL collectives, whose root
    sends (broadcast) or receives (reduce) the data once whatever the number of devices
    (nccl-tests' doc/PERFORMANCE.md: bus bandwidth = algorithm bandwidth for both). Without NCCL
    they are plain copies, one per other device: a star through device 0.
    """
    if devices < 1:
        raise ValueError(f"devices={devices}: DataParallel needs at least one device")
    if devices == 1:
        return 0  # one device: nn.DataParallel calls the module directly, nothing is copied
    return parameter_bytes if nccl else (devices - 1) * parameter_bytes


def _ring_fraction(world_size):
    return 2 * (world_size - 1) / world_size


def algorithm_bandwidth(nbytes, seconds):
    """Bytes per second as the user sees it: the tensor's size over the time."""
    return nbytes / seconds


def bus_bandwidth(nbytes, seconds, world_size):
    """nccl-tests' bus bandwidth of an all-reduce: algorithm bandwidth * 2 (N - 1) / N."""
    return algorithm_bandwidth(nbytes, seconds) * _ring_fraction(world_size)


def fit_alpha_beta(sizes_bytes, seconds, world_size=None, errors="relative"):
    """Fit alpha (seconds) and beta (seconds per byte) to measured times; returns (alpha, beta).

    Without world_size the times are of single messages, t = alpha + n * beta. With it they are
    ring all-reduce times (what measure_all_reduce returns), and the ring model is inverted.
    The fit minimises relative errors, because times span decades from latency-bound small
    messages to bandwidth-bound large ones, and plain least squares would ignore the small ones;
    errors="log" minimises the squared logs of predicted / measured instead (as alike a weighing).
    """
    sizes = np.asarray(sizes_bytes, dtype=np.float64)
    times = np.asarray(seconds, dtype=np.float64)
    if sizes.shape != times.shape or sizes.ndim != 1:
        raise ValueError(f"got {sizes.size} sizes and {times.size} times; pass one time per size")
    if len(np.unique(sizes)) < 2:
        raise ValueError("fitting alpha and beta needs at least two different message sizes")
    if np.any(times <= 0):
        raise ValueError("every time must be positive; check the measurement (units: seconds)")
    scale = sizes.max()  # sizes near 1e9 next to ones of 1: scale so the columns are alike
    design = np.stack([np.ones_like(sizes), sizes / scale], axis=1) / times[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    alpha, beta = float(intercept), float(slope / scale)
    if errors == "log":
        alpha, beta = _fit_in_log_space(sizes, times, alpha, beta)
    elif errors != "relative":
        raise ValueError(f"errors={errors!r} is not 'relative' or 'log'")
    if world_size is None:
        return alpha, beta
    if world_size < 2:
        raise ValueError("an all-reduce on 1 rank sends nothing; fit times from world_size >= 2")
    return alpha / (2 * (world_size - 1)), beta / _ring_fraction(world_size)


def _fit_in_log_space(sizes, times, alpha, beta):
    """Gauss-Newton on (log alpha, log beta), from a first (alpha, beta), for sum log(t' / t)^2."""
    logs = np.log(np.maximum([alpha, beta], 1e-30))
    for _ in range(200):
        terms = np.exp(logs) * np.stack([np.ones_like(sizes), sizes], axis=1)
        predicted = terms.sum(axis=1)
        step = np.linalg.lstsq(terms / predicted[:, None], np.log(predicted / times), rcond=None)[0]
        logs -= step
        if np.abs(step).max() < 1e-10:
            break
    return float(np.exp(logs[0])), float(np.exp(logs[1]))


class AllReduceSweep(list):
    """measure_all_reduce's result: [(nbytes, seconds), ...], each the median of its repeats, with
    the raw record it came from: `repeats` (for each size, the seconds of each repeat, the slowest
    rank's), `world_size`, `backend`, `clock` (clock_now() at the start and at the end, on this
    rank) and a seal. `recorded_here()` says whether measure_all_reduce made it in this session,
    unchanged."""

    def facts(self):
        return (list(self), self.repeats, self.world_size, self.backend, self.clock)

    def recorded_here(self) -> bool:
        try:
            return sealed_here(self, self.facts())
        except AttributeError:  # made by hand: no raw record
            return False


def measure_all_reduce(sizes_bytes, repeats=20, warmup=5, dtype=torch.float32, device=None):
    """Time dist.all_reduce inside a rank; returns [(nbytes, seconds), ...], equal on all ranks
    (an AllReduceSweep, which keeps each repeat's time and its clock: the record of a measurement).

    Call it on every rank with the same arguments. Each repeat starts with all ranks lined up
    by a small all-reduce, and on a GPU waits for the kernel (torch.cuda.synchronize) before
    stopping the clock. A repeat's time is the slowest rank's; each size reports the median.
    nbytes is rounded down to whole elements of `dtype`.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    device = _device_of_backend(device)
    element_size = torch.empty((), dtype=dtype).element_size()
    results, raw, started = AllReduceSweep(), [], clock_now()
    for nbytes in sizes_bytes:
        if nbytes < element_size:
            raise ValueError(f"size {nbytes} bytes is smaller than one {dtype} element")
        tensor = torch.zeros(int(nbytes) // element_size, dtype=dtype, device=device)
        for _ in range(warmup):
            dist.all_reduce(tensor)
        times = torch.tensor([_time_one_all_reduce(tensor) for _ in range(repeats)],
                             dtype=torch.float64, device=device)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the collective ends with the slowest rank
        raw.append(times.tolist())
        results.append((tensor.numel() * element_size, statistics.median(times.tolist())))
    results.repeats, results.world_size = raw, dist.get_world_size()
    results.backend, results.clock = str(dist.get_backend()), (started, clock_now())
    results.seal = seal(results.facts())
    return results


def _time_one_all_reduce(tensor):
    line_up = torch.zeros(1, device=tensor.device)
    dist.all_reduce(line_up)
    synchronize(tensor.device)
    start = time.perf_counter()
    dist.all_reduce(tensor)
    synchronize(tensor.device)  # CUDA calls return before the GPU is done
    return time.perf_counter() - start


# Published all-reduce sweeps of GPU clusters, (payload bytes, bus bandwidth in GB/s), from
# stas00/ml-engineering, network/benchmarks/README.md (its all_reduce_bench.py, torch's
# all_reduce over NCCL; on the H200 node it agrees with nccl-tests within 2%, 3-7% from 1 to
# 16 MiB). Bus bandwidth as in nccl-tests: n / t * 2 (N - 1) / N.
PUBLISHED_ALL_REDUCE = {
    "one node of 8 H200 (NVLink)": dict(world_size=8, points=[
        (32 * 2**10, 3.15), (1 * 2**20, 74.57), (16 * 2**20, 255.90), (128 * 2**20, 414.54),
        (1 * 2**30, 465.91), (16 * 2**30, 482.25)]),
    "4 nodes of 8 B200 (32 GPUs, network between nodes)": dict(world_size=32, points=[
        (32 * 2**10, 0.65), (1 * 2**20, 12.47), (16 * 2**20, 71.80), (128 * 2**20, 260.50),
        (1 * 2**30, 365.99), (16 * 2**30, 376.71)]),
}


def published_seconds(cluster: str):
    """([payload bytes], [seconds]) of a PUBLISHED_ALL_REDUCE sweep: t = n / busbw * 2 (N-1) / N."""
    sweep = PUBLISHED_ALL_REDUCE[cluster]
    fraction = 2 * (sweep["world_size"] - 1) / sweep["world_size"]
    return ([nbytes for nbytes, _ in sweep["points"]],
            [nbytes * fraction / (busbw * 1e9) for nbytes, busbw in sweep["points"]])


PUBLISHED_SOURCE = ("github.com/stas00/ml-engineering, network/benchmarks/README.md at commit "
                    "0cc3de5 (all_reduce_bench.py's tables)")


# A health check (lesson 12): an all-reduce's bus bandwidth against what one link of the ring carries.
HEALTHY_SHARE = 0.5  # healthy: the best bus bandwidth reaches at least half of the expected figure


def measure_ring_link(nbytes, repeats=5, warmup=2, dtype=torch.float32, device=None):
    """Inside a rank: bytes per second on one link of a ring while every rank sends `nbytes` to the
    next rank and receives as many from the one before, as each step of a ring all-reduce does:
    nbytes / the median over `repeats` of the slowest rank's time. Call it on every rank (2 or more)."""
    device = _device_of_backend(device)
    outgoing = torch.zeros(int(nbytes) // torch.empty((), dtype=dtype).element_size(), dtype=dtype,
                           device=device)
    incoming = torch.empty_like(outgoing)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    exchange = [dist.P2POp(dist.isend, outgoing, (rank + 1) % world_size),  # one batch: no deadlock,
                dist.P2POp(dist.irecv, incoming, (rank - 1) % world_size)]   # on NCCL too (its docstring)
    times = []
    for repeat in range(warmup + repeats):
        dist.barrier()
        synchronize(device)
        start = time.perf_counter()
        for request in dist.batch_isend_irecv(exchange):
            request.wait()
        synchronize(device)
        if repeat >= warmup:
            times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return outgoing.numel() * outgoing.element_size() / statistics.median(slowest.tolist())


def all_reduce_health(sizes_bytes, expected_bus_bandwidth, repeats=5, warmup=2):
    """Inside a rank: the course's health check. For each size, `warmup` all-reduces left out, then
    `repeats` timed ones, the ranks lined up by a barrier before each, each repeat's time the
    slowest rank's; {"rows": [{nbytes, times, seconds (their median), algorithm_bandwidth,
    bus_bandwidth}], "best_bus_bandwidth", "healthy": best >= HEALTHY_SHARE x expected}."""
    device, rows = _device_of_backend(None), []
    for size in sizes_bytes:
        tensor = torch.zeros(int(size) // 4, device=device)  # float32
        for _ in range(warmup):
            dist.all_reduce(tensor)
        times = []
        for _ in range(repeats):
            dist.barrier()
            synchronize(device)
            start = time.perf_counter()
            dist.all_reduce(tensor)
            synchronize(device)
            times.append(time.perf_counter() - start)
        slowest = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        nbytes, seconds = tensor.numel() * tensor.element_size(), statistics.median(slowest.tolist())
        rows.append(dict(nbytes=nbytes, times=slowest.tolist(), seconds=seconds,
                         algorithm_bandwidth=algorithm_bandwidth(nbytes, seconds),
                         bus_bandwidth=bus_bandwidth(nbytes, seconds, dist.get_world_size())))
    best = max(row["bus_bandwidth"] for row in rows)
    return {"rows": rows, "best_bus_bandwidth": best,
            "healthy": best >= HEALTHY_SHARE * expected_bus_bandwidth}


def _device_of_backend(device):
    """`device`, or where this rank's collectives can run: its current GPU under NCCL, else the CPU."""
    if device is not None:
        return torch.device(device)
    if dist.get_backend() == "nccl":  # NCCL only moves tensors on GPUs
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
