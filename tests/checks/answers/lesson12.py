"""Lesson 12's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import os

import numpy as np
import torch
import torch.distributed as dist
from test_measured_graders import health_rows, measured_answer

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


def health_as_lists(sizes_bytes):
    world_size = dist.get_world_size()
    return [[nbytes, seconds, 2 * nbytes * (world_size - 1) / (world_size * seconds)]
            for nbytes, seconds in cost_model.measure_all_reduce(sizes_bytes, 5, 2)]


def health_from_the_cost_model(sizes_bytes):
    world_size = dist.get_world_size()
    return tuple((nbytes, seconds, cost_model.bus_bandwidth(nbytes, seconds, world_size))
                 for nbytes, seconds in cost_model.measure_all_reduce(sizes_bytes, repeats=3))


def health_answer(health_check, nprocs):
    """The arguments of check_health_check, with rows measured when the test runs."""
    def arguments():
        rows = health_rows(health_check, nprocs)
        return health_check, rows, np.max([row[2] for row in rows]), nprocs
    return arguments


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
        measured_answer("lists, a numpy float", health_answer(health_as_lists, 2)),
        measured_answer("the cost model's bus_bandwidth, a tuple, 4 ranks",
                        health_answer(health_from_the_cost_model, 4)),
    ],
}


# Wrong answers

# A health check as this lesson's cell records one on 2 CPU ranks: (nbytes, seconds, bus bytes/s)
RECORDED_HEALTH = [(nbytes, seconds, nbytes / seconds) for nbytes, seconds in
                   [(2**16, 744e-6), (2**18, 506e-6), (2**20, 640e-6), (2**22, 2.219e-3),
                    (2**24, 17.271e-3)]]  # 2 (N - 1) / N = 1 on 2 ranks


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


def _rows(sizes_bytes, row):
    """Inside a rank: row(nbytes, seconds, world_size) for each size measure_all_reduce timed."""
    world_size = dist.get_world_size()
    return [row(nbytes, seconds, world_size)
            for nbytes, seconds in cost_model.measure_all_reduce(sizes_bytes, repeats=5, warmup=2)]


def reference_health_check(sizes_bytes):
    return _rows(sizes_bytes, lambda n, s, N: (n, s, n / s * 2 * (N - 1) / N))


def health_without_the_factor(sizes_bytes):
    return _rows(sizes_bytes, lambda n, s, N: (n, s, n / s))


def health_without_the_2(sizes_bytes):
    return _rows(sizes_bytes, lambda n, s, N: (n, s, n / s * (N - 1) / N))


def health_in_gigabytes_per_second(sizes_bytes):
    return _rows(sizes_bytes, lambda n, s, N: (n, s, n / s * 2 * (N - 1) / N / 1e9))


def health_in_microseconds(sizes_bytes):
    return _rows(sizes_bytes, lambda n, s, N: (n, s * 1e6, n / (s * 1e6) * 2 * (N - 1) / N))


def health_typed_in(sizes_bytes):
    world_size = dist.get_world_size()
    return [(nbytes, 1e-3, nbytes / 1e-3 * 2 * (world_size - 1) / world_size)
            for nbytes in sizes_bytes]


def _health(health_check=reference_health_check, rows=RECORDED_HEALTH, best=None):
    return health_check, rows, max(bus for _, _, bus in rows) if best is None else best, 2


TYPED_IN_HEALTH = [(nbytes, nbytes / 100e9, 100e9) for nbytes in (2**18, 2**20, 2**22)]


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
        wrong_answer("algorithm bandwidth (no factor): right on 2 ranks only",
                     *_health(health_without_the_factor)),
        wrong_answer("(N - 1) / N without the 2", *_health(health_without_the_2)),
        wrong_answer("wrong unit: bus bandwidth in GB/s", *_health(health_in_gigabytes_per_second)),
        wrong_answer("wrong unit: seconds in microseconds", *_health(health_in_microseconds)),
        wrong_answer("made up: rows typed in by the function, nothing timed",
                     *_health(health_typed_in)),
        wrong_answer("made up: recorded rows of 100 GB/s, far from this machine",
                     *_health(rows=TYPED_IN_HEALTH)),
        wrong_answer("the bus bandwidth of the largest message, not the best",
                     *_health(best=RECORDED_HEALTH[-1][2])),
        wrong_answer("a health check of small messages only", *_health(rows=RECORDED_HEALTH[:2])),
    ],
}
