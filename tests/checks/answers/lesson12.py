"""Lesson 12's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import functools
import os
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from course_lib.checks import lesson12
from course_lib.topics import cost_model

from . import answer, wrong_answer


def _gathered():
    """Every process's (GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE), in the group's order."""
    mine = tuple(int(os.environ[name]) for name in ("GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return mine, everyone


def global_rank_by_sorting():
    # torchrun's order: by node, then by local rank; my RANK is my place in it
    mine, everyone = _gathered()
    return sorted(everyone).index(mine), len(everyone)


def global_rank_from_a_tensor():
    # node sizes all-gathered as a tensor: a cumulative sum over the nodes, numpy ints back
    node = torch.tensor([int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])])
    table = torch.zeros(dist.get_world_size(), 2, dtype=torch.long)
    dist.all_gather(list(table.unbind(0)), node)
    sizes = dict(table.tolist())  # node -> its processes
    before = sum(size for other, size in sizes.items() if other < int(os.environ["GROUP_RANK"]))
    return np.int64(before + int(os.environ["LOCAL_RANK"])), np.int64(sum(sizes.values()))


def ranks_on_my_node_from_a_tensor():
    node_ranks = torch.zeros(dist.get_world_size(), dtype=torch.long)
    mine = torch.tensor([int(os.environ["GROUP_RANK"])])
    dist.all_gather(list(node_ranks.split(1)), mine)  # views: each rank's slot of node_ranks
    return torch.nonzero(node_ranks == mine).flatten()  # a tensor of ranks


def ranks_on_my_node_from_local_ranks():
    # My node's first rank is my rank minus my LOCAL_RANK; LOCAL_WORLD_SIZE says how many follow
    first = dist.get_rank() - int(os.environ["LOCAL_RANK"])
    return tuple(np.arange(first, first + int(os.environ["LOCAL_WORLD_SIZE"])))  # numpy ints


def health_check(sizes_bytes, expected_bus_bandwidth, warmup=2, repeats=5, barrier=True,
                 slowest=True, count_bytes=True, factor=lambda n: 2 * (n - 1) / n,
                 element_bytes=4, bus=None, healthy=None):
    """The solution's health check; each keyword turns one part into a mistake a learner makes."""
    world_size, rows = dist.get_world_size(), []
    for size in sizes_bytes:
        tensor = torch.zeros(size // element_bytes)
        for _ in range(warmup):
            dist.all_reduce(tensor)
        times = []
        for _ in range(repeats):
            if barrier:
                dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(tensor)
            times.append(time.perf_counter() - start)
        times = torch.tensor(times, dtype=torch.float64)
        if slowest:
            dist.all_reduce(times, op=dist.ReduceOp.MAX)
        seconds = statistics.median(times.tolist())
        nbytes = tensor.numel() * tensor.element_size() if count_bytes else tensor.numel()
        rows.append(dict(nbytes=nbytes, times=times.tolist(), seconds=seconds,
                         algorithm_bandwidth=nbytes / seconds,
                         bus_bandwidth=bus or nbytes / seconds * factor(world_size)))
    best = max(row["bus_bandwidth"] for row in rows)
    verdict = best >= 0.5 * expected_bus_bandwidth if healthy is None else healthy
    return {"rows": rows, "best_bus_bandwidth": best, "healthy": verdict}


def health_check_monotonic(sizes_bytes, expected_bus_bandwidth):
    # time.monotonic, every rank's times gathered, the mean of the middle 3 of 5, numpy numbers
    world_size, rows = dist.get_world_size(), []
    for size in sizes_bytes:
        tensor = torch.ones(size // 4, dtype=torch.float32)
        dist.all_reduce(tensor)  # warm-up
        mine = []
        for _ in range(5):
            dist.barrier()
            start = time.monotonic()
            dist.all_reduce(tensor)
            mine.append(time.monotonic() - start)
        everyone = [None] * world_size
        dist.all_gather_object(everyone, mine)
        times = np.max(np.array(everyone), axis=0)  # each repeat's slowest rank
        seconds = np.sort(times)[1:-1].mean()
        nbytes = np.int64(tensor.nbytes)
        rows.append({"nbytes": nbytes, "times": times, "seconds": seconds,
                     "algorithm_bandwidth": nbytes / seconds,
                     "bus_bandwidth": nbytes / seconds * 2 * (world_size - 1) / world_size})
    best = max(row["bus_bandwidth"] for row in rows)
    return {"rows": rows, "best_bus_bandwidth": best, "healthy": bool(best >= expected_bus_bandwidth / 2)}


def health_check_lined_up_by_an_all_reduce(sizes_bytes, expected_bus_bandwidth):
    # perf_counter_ns, a one-element all-reduce as the line-up, 1 warm-up and 7 repeats, tensors back
    world_size, rows = dist.get_world_size(), []
    for size in sizes_bytes:
        tensor = torch.zeros(size // 4)
        dist.all_reduce(tensor)
        times = torch.zeros(7, dtype=torch.float64)
        for repeat in range(7):
            dist.all_reduce(torch.zeros(1))  # every rank arrives before the clock starts
            start = time.perf_counter_ns()
            dist.all_reduce(tensor)
            times[repeat] = (time.perf_counter_ns() - start) / 1e9
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        seconds = times.median()
        nbytes = tensor.numel() * tensor.element_size()
        algorithm = cost_model.algorithm_bandwidth(nbytes, seconds)
        rows.append(dict(nbytes=nbytes, times=times, seconds=seconds, algorithm_bandwidth=algorithm,
                         bus_bandwidth=cost_model.bus_bandwidth(nbytes, seconds, world_size)))
    best = torch.stack([row["bus_bandwidth"] for row in rows]).max()
    return {"rows": rows, "best_bus_bandwidth": best,
            "healthy": bool(best >= cost_model.HEALTHY_SHARE * expected_bus_bandwidth)}


ALTERNATIVES = {
    lesson12.check_global_rank: [
        answer("the place in the sorted (node, local rank) list", global_rank_by_sorting),
        answer("a tensor all-gathered, a cumulative sum, numpy ints", global_rank_from_a_tensor),
    ],
    lesson12.check_ranks_on_my_node: [
        answer("all_gather of a tensor, a tensor back", ranks_on_my_node_from_a_tensor),
        answer("from LOCAL_RANK and LOCAL_WORLD_SIZE, numpy ints",
               ranks_on_my_node_from_local_ranks),
    ],
    lesson12.check_health_check: [
        answer("time.monotonic, all_gather_object, the mean of the middle repeats, numpy",
               health_check_monotonic),
        answer("perf_counter_ns, an all-reduce as the line-up, tensors", health_check_lined_up_by_an_all_reduce),
    ],
}


# Wrong answers

def _env(name):
    return int(os.environ[name])


def rank_of_equal_nodes():
    """GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK: right only when every node is this one's size."""
    return (_env("GROUP_RANK") * _env("LOCAL_WORLD_SIZE") + _env("LOCAL_RANK"),
            _env("GROUP_WORLD_SIZE") * _env("LOCAL_WORLD_SIZE"))


def rank_with_nproc_per_node_hard_coded():
    return _env("GROUP_RANK") * 2 + _env("LOCAL_RANK"), dist.get_world_size()


def rank_of_the_process_group():
    return dist.get_rank(), dist.get_world_size()


def rank_with_a_float_world_size():
    mine, everyone = _gathered()
    return sorted(everyone).index(mine), float(len(everyone))


def rank_with_nodes_in_order_of_arrival():
    """Counts the nodes in the order their processes appear in the gather, not by GROUP_RANK."""
    mine, everyone = _gathered()
    nodes = list(dict.fromkeys(node for node, _, _ in everyone))  # first seen first
    sizes = {node: size for node, _, size in everyone}
    before = sum(sizes[node] for node in nodes[:nodes.index(mine[0])])
    return before + mine[1], len(everyone)


def rank_forgets_local_rank():
    mine, everyone = _gathered()
    return sum(1 for node, _, _ in everyone if node < mine[0]), len(everyone)


def global_rank_stub():
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


def ranks_from_equal_nodes():
    """Assumes every node holds LOCAL_WORLD_SIZE ranks: wrong after an uneven node."""
    node_rank, local_world_size = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    return list(range(node_rank * local_world_size, (node_rank + 1) * local_world_size))


def ranks_are_local():
    return list(range(int(os.environ["LOCAL_WORLD_SIZE"])))


def ranks_by_local_rank():
    """Gathers LOCAL_RANK instead of the node's rank."""
    local_ranks = [None] * dist.get_world_size()
    dist.all_gather_object(local_ranks, int(os.environ["LOCAL_RANK"]))
    mine = int(os.environ["LOCAL_RANK"])
    return [rank for rank, local_rank in enumerate(local_ranks) if local_rank == mine]


def ranks_of_the_whole_job():
    return list(range(dist.get_world_size()))


def health_of_the_course(sizes_bytes, expected_bus_bandwidth):
    return cost_model.all_reduce_health(sizes_bytes, expected_bus_bandwidth)


def health_from_measure_all_reduce(sizes_bytes, expected_bus_bandwidth):
    world_size, rows = dist.get_world_size(), []
    sweep = cost_model.measure_all_reduce(sizes_bytes, repeats=5, warmup=2)
    for (nbytes, seconds), times in zip(sweep, sweep.repeats):
        rows.append(dict(nbytes=nbytes, times=times, seconds=seconds, algorithm_bandwidth=nbytes / seconds,
                         bus_bandwidth=cost_model.bus_bandwidth(nbytes, seconds, world_size)))
    best = max(row["bus_bandwidth"] for row in rows)
    return {"rows": rows, "best_bus_bandwidth": best, "healthy": best >= 0.5 * expected_bus_bandwidth}


def health_stub(sizes_bytes, expected_bus_bandwidth):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


def _wrong_health(**mistake):
    return functools.partial(health_check, **mistake)


WRONG_ANSWERS = {
    lesson12.check_global_rank: [
        wrong_answer("assumes equal nodes (GROUP_RANK x LOCAL_WORLD_SIZE)", rank_of_equal_nodes),
        wrong_answer("nproc_per_node hard-coded as 2", rank_with_nproc_per_node_hard_coded),
        wrong_answer("returns the process group's dist.get_rank()", rank_of_the_process_group),
        wrong_answer("a float world size", rank_with_a_float_world_size),
        wrong_answer("numbers the nodes in order of arrival", rank_with_nodes_in_order_of_arrival),
        wrong_answer("forgets the local rank", rank_forgets_local_rank),
        wrong_answer("the stub", global_rank_stub),
    ],
    lesson12.check_ranks_on_my_node: [
        wrong_answer("assumes equal nodes of LOCAL_WORLD_SIZE ranks", ranks_from_equal_nodes),
        wrong_answer("returns local ranks", ranks_are_local),
        wrong_answer("groups by LOCAL_RANK, not by node", ranks_by_local_rank),
        wrong_answer("every rank of the job", ranks_of_the_whole_job),
    ],
    lesson12.check_health_check: [
        wrong_answer("the first (warm-up) call timed", _wrong_health(warmup=0)),
        wrong_answer("no barrier before the clock starts", _wrong_health(barrier=False)),
        wrong_answer("rank 0's time, not the slowest rank's", _wrong_health(slowest=False)),
        wrong_answer("the bus factor (N - 1) / N", _wrong_health(factor=lambda n: (n - 1) / n)),
        wrong_answer("the bus factor 2 / N: right on 2 ranks only", _wrong_health(factor=lambda n: 2 / n)),
        wrong_answer("bytes counted as numel", _wrong_health(count_bytes=False)),
        wrong_answer("tensors of size elements, not bytes", _wrong_health(element_bytes=1)),
        wrong_answer("a hard-coded bus bandwidth (100 Gb/s)", _wrong_health(bus=12.5e9)),
        wrong_answer("always healthy", _wrong_health(healthy=True)),
        wrong_answer("the course's measure_all_reduce in place of its own timing",
                     health_from_measure_all_reduce),
        wrong_answer("the course's all_reduce_health", health_of_the_course),
        wrong_answer("the stub", health_stub),
    ],
}
