"""Graders for lesson 12 (multi-node): global ranks from a node layout, the ranks that share a
rank's node (run on ranks), and an all-reduce health check measured on this machine.

- global rank: node_rank x nproc_per_node + local_rank.
- ranks on my node: the learner's function runs on 3 to 5 gloo ranks laid out as uneven "nodes"
  (each rank sees the GROUP_RANK, LOCAL_RANK and LOCAL_WORLD_SIZE torchrun would give it on such a
  layout); on every rank it returns the global ranks on that rank's node, in order (any sequence
  of whole numbers).
- health check: the learner's recorded (nbytes, seconds, bus bandwidth) per size, from at least 3
  sizes up to 1 MiB or more; each bus bandwidth nbytes / seconds x 2 (N - 1) / N of its own row
  (within 1e-6), and the best of them. A measurement varies from run to run, so the grader judges
  the numbers against the rows the learner recorded, not against a new run."""
import os

import torch.distributed as dist

from ..topics.cluster import rank_layout
from . import GradingError, expect, expect_close, expect_equal, grader, wrong_answer
from .ranks import run_on_ranks

# (nnodes, nproc_per_node): nnodes != nproc_per_node in most, so swapping the two shows.
LAYOUTS = [(2, 4), (3, 2), (4, 8), (1, 3), (2, 1), (5, 3)]
NODE_LAYOUTS = [[2, 1], [1, 3], [2, 2, 1]]  # uneven nodes: a guess from one node's count fails
HEALTH_MIN_SIZES = 3
HEALTH_LARGEST_AT_LEAST = 2**20
# A health check as this lesson's cell records one on 2 CPU ranks: (nbytes, seconds, bus bytes/s)
RECORDED_HEALTH = [(nbytes, seconds, nbytes / seconds) for nbytes, seconds in
                   [(2**16, 744e-6), (2**18, 506e-6), (2**20, 640e-6), (2**22, 2.219e-3),
                    (2**24, 17.271e-3)]]  # 2 (N - 1) / N = 1 on 2 ranks


@grader("global rank")
def check_global_rank(global_rank):
    for nnodes, nproc_per_node in LAYOUTS:
        for node_rank in range(nnodes):
            for local_rank in range(nproc_per_node):
                expect_equal(global_rank(node_rank, local_rank, nproc_per_node),
                             node_rank * nproc_per_node + local_rank,
                             f"global_rank(node_rank={node_rank}, local_rank={local_rank}, "
                             f"nproc_per_node={nproc_per_node})",
                             hint="ranks are numbered node by node: the nproc_per_node ranks of "
                                  "every earlier node come first, then this node's local_rank")


@grader("ranks on my node")
def check_ranks_on_my_node(ranks_on_my_node):
    for nproc_per_node in NODE_LAYOUTS:
        layout = rank_layout(list(nproc_per_node))
        got = run_on_ranks(_as_placed, ranks_on_my_node, layout,
                           nprocs=len(layout), what=f"ranks_on_my_node on nodes {nproc_per_node}",
                           hang_hint="every rank must call the same collectives: all of them "
                                     "call all_gather_object (or all_gather) once")
        for place, ranks in zip(layout, got):
            expected = [other.rank for other in layout if other.node_rank == place.node_rank]
            expect(_whole_numbers(ranks), f"rank {place.rank}'s ranks_on_my_node() on nodes "
                   f"{nproc_per_node}", "a list of global ranks (whole numbers)",
                   repr(ranks)[:120])
            expect_equal([int(rank) for rank in ranks], expected,
                         f"rank {place.rank}'s ranks_on_my_node() on nodes {nproc_per_node} (it "
                         f"runs on node {place.node_rank})",
                         "nodes may hold different numbers of ranks: gather every rank's "
                         "GROUP_RANK (dist.all_gather_object), then keep the ranks whose node is "
                         "yours, in order")


def _as_placed(ranks_on_my_node, layout):
    """Inside a rank: set the node variables torchrun would on `layout`, then call the learner's."""
    place = layout[dist.get_rank()]
    os.environ.update(GROUP_RANK=str(place.node_rank), LOCAL_RANK=str(place.local_rank),
                      LOCAL_WORLD_SIZE=str(place.local_world_size))
    return ranks_on_my_node()


def _whole_numbers(ranks):
    try:
        return all(int(rank) == rank and not isinstance(rank, bool) for rank in ranks)
    except (TypeError, ValueError):
        return False


def reference_ranks_on_my_node():
    node_ranks = [None] * dist.get_world_size()
    dist.all_gather_object(node_ranks, int(os.environ["GROUP_RANK"]))
    mine = int(os.environ["GROUP_RANK"])
    return [rank for rank, node_rank in enumerate(node_ranks) if node_rank == mine]


@grader("all-reduce health check")
def check_health_check(health, best_bus_bandwidth, world_size):
    expect(isinstance(world_size, int) and world_size >= 2, "world_size",
           "the number of ranks you measured on, at least 2", repr(world_size))
    rows = _expect_health_rows(health)
    fraction = 2 * (world_size - 1) / world_size
    for nbytes, seconds, bus in rows:
        expect_close(bus, nbytes / seconds * fraction,
                     f"the bus bandwidth you recorded for {nbytes:,.0f} bytes in {seconds:.3g} s "
                     f"on {world_size} ranks",
                     "the algorithm bandwidth nbytes / seconds, times 2 (N - 1) / N: the share of "
                     "the data each rank sends in a ring all-reduce", rtol=1e-6)
    try:
        best = float(best_bus_bandwidth)
    except (TypeError, ValueError):
        raise GradingError("best_bus_bandwidth", "a number (bytes per second)",
                           repr(best_bus_bandwidth)[:120]) from None
    expect_close(best, max(bus for _, _, bus in rows), "best_bus_bandwidth",
                 "the largest bus bandwidth of your rows, in bytes per second", rtol=1e-6)


def _expect_health_rows(health):
    hint = ("record it with launch(your_function, SIZES, nprocs=nprocs)[0]: rank 0's list of "
            "(nbytes, seconds, bus bandwidth), one row per size")
    try:
        rows = [(float(nbytes), float(seconds), float(bus)) for nbytes, seconds, bus in health]
    except (TypeError, ValueError):
        rows = None
    expect(rows is not None and len(rows) >= HEALTH_MIN_SIZES
           and max(nbytes for nbytes, _, _ in rows) >= HEALTH_LARGEST_AT_LEAST, "health",
           f"at least {HEALTH_MIN_SIZES} rows (nbytes, seconds, bus bandwidth), up to "
           f"{HEALTH_LARGEST_AT_LEAST:,} bytes or more", repr(health)[:120], hint)
    expect(all(seconds > 0 for _, seconds, _ in rows), "health's times", "positive seconds",
           repr([seconds for _, seconds, _ in rows])[:120], hint)
    return rows


# Plausible mistakes.

def rank_forgets_local_rank(node_rank, local_rank, nproc_per_node):
    return node_rank * nproc_per_node


def rank_adds_node_rank(node_rank, local_rank, nproc_per_node):
    return node_rank + local_rank


def rank_interleaves_nodes(node_rank, local_rank, nproc_per_node):
    return local_rank * nproc_per_node + node_rank


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


def _health(change=lambda row: row, best=None, rows=RECORDED_HEALTH):
    changed = [change(row) for row in rows]
    return changed, max(bus for _, _, bus in changed) if best is None else best, 2


WRONG_ANSWERS = {
    check_global_rank: [
        wrong_answer("forgets the local rank", rank_forgets_local_rank),
        wrong_answer("adds the node rank to the local rank", rank_adds_node_rank),
        wrong_answer("numbers the ranks across nodes first", rank_interleaves_nodes),
    ],
    check_ranks_on_my_node: [
        wrong_answer("assumes equal nodes of LOCAL_WORLD_SIZE ranks", ranks_from_equal_nodes),
        wrong_answer("returns local ranks", ranks_are_local),
        wrong_answer("groups by LOCAL_RANK, not by node", ranks_by_local_rank),
        wrong_answer("every rank of the job", ranks_of_the_whole_job),
    ],
    check_health_check: [
        wrong_answer("algorithm bandwidth (no factor) on 4 ranks",
                     *_health(lambda row: (row[0], row[1], row[0] / row[1]))[:2], 4),
        wrong_answer("(N - 1) / N without the 2",
                     *_health(lambda row: (row[0], row[1], row[0] / row[1] / 2))),
        wrong_answer("N / (N - 1) upside down, on 4 ranks",
                     *_health(lambda row: (row[0], row[1], row[0] / row[1] * 4 / 3))[:2], 4),
        wrong_answer("the bus bandwidth of the largest message, not the best",
                     *_health(best=RECORDED_HEALTH[-1][2])),
        wrong_answer("in GB/s, not bytes per second",
                     *_health(lambda row: (row[0], row[1], row[2] / 1e9))),
        wrong_answer("a health check of small messages only", *_health(rows=RECORDED_HEALTH[:2])),
    ],
}
