"""Graders for lesson 12 (multi-node): global ranks from a node layout, ranks on uneven nodes,
and the bus bandwidth of an all-reduce.

- global rank: node_rank x nproc_per_node + local_rank.
- ranks on uneven nodes: for each node, the list of its global ranks, numbered node after node.
- bus bandwidth: the algorithm bandwidth (bytes / seconds) times 2 (N - 1) / N."""
from . import expect, expect_close, expect_equal, grader, wrong_answer

# (nnodes, nproc_per_node): nnodes != nproc_per_node in most, so swapping the two shows.
LAYOUTS = [(2, 4), (3, 2), (4, 8), (1, 3), (2, 1), (5, 3)]
UNEVEN_NODES = [[4, 2], [2, 4, 1], [8, 8, 4, 8], [1], [3, 1, 1, 2], [1, 5]]
# (nbytes, seconds, world_size): all-reduces from a laptop's gloo to a GPU cluster's NCCL
ALL_REDUCES = [(2**20, 1e-3, 2), (2**30, 0.025, 8), (4_000_000, 0.5, 3), (2**28, 0.01, 16),
               (256, 2e-5, 4)]


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


@grader("ranks on uneven nodes")
def check_ranks_on_each_node(ranks_on_each_node):
    for nproc_per_node in UNEVEN_NODES:
        got = ranks_on_each_node(list(nproc_per_node))
        expected, first = [], 0
        for nproc in nproc_per_node:
            expected.append(list(range(first, first + nproc)))
            first += nproc
        expect(isinstance(got, (list, tuple)) and len(got) == len(nproc_per_node),
               f"ranks_on_each_node({nproc_per_node})", f"{len(nproc_per_node)} lists, one per node",
               repr(got)[:120], "return one list of global ranks per node")
        expect_equal([list(ranks) for ranks in got], expected, f"ranks_on_each_node({nproc_per_node})",
                     hint="a node's first rank is the number of processes on all earlier nodes "
                          "(a running sum), not node_rank x this node's count")


@grader("bus bandwidth")
def check_bus_bandwidth(bus_bandwidth):
    for nbytes, seconds, world_size in ALL_REDUCES:
        expect_close(bus_bandwidth(nbytes, seconds, world_size),
                     nbytes / seconds * 2 * (world_size - 1) / world_size,
                     f"bus_bandwidth(nbytes={nbytes}, seconds={seconds}, world_size={world_size})",
                     hint="start from the algorithm bandwidth, nbytes / seconds (bytes per second), "
                          "and multiply by 2 (world_size - 1) / world_size",
                     rtol=1e-9)


# Plausible mistakes.

def rank_forgets_local_rank(node_rank, local_rank, nproc_per_node):
    return node_rank * nproc_per_node


def rank_adds_node_rank(node_rank, local_rank, nproc_per_node):
    return node_rank + local_rank


def rank_interleaves_nodes(node_rank, local_rank, nproc_per_node):
    return local_rank * nproc_per_node + node_rank


def ranks_with_own_count(nproc_per_node):
    return [[node_rank * nproc + local_rank for local_rank in range(nproc)]
            for node_rank, nproc in enumerate(nproc_per_node)]


def ranks_with_first_count(nproc_per_node):
    return [[node_rank * nproc_per_node[0] + local_rank for local_rank in range(nproc)]
            for node_rank, nproc in enumerate(nproc_per_node)]


def ranks_are_local(nproc_per_node):
    return [list(range(nproc)) for nproc in nproc_per_node]


def algorithm_bandwidth(nbytes, seconds, world_size):
    return nbytes / seconds


def bus_bandwidth_without_two(nbytes, seconds, world_size):
    return nbytes / seconds * (world_size - 1) / world_size


def bus_bandwidth_without_fraction(nbytes, seconds, world_size):
    return nbytes / seconds * 2


def bus_bandwidth_inverted_fraction(nbytes, seconds, world_size):
    return nbytes / seconds * 2 * world_size / (world_size - 1)


WRONG_ANSWERS = {
    check_global_rank: [
        wrong_answer("forgets the local rank", rank_forgets_local_rank),
        wrong_answer("adds the node rank to the local rank", rank_adds_node_rank),
        wrong_answer("numbers the ranks across nodes first", rank_interleaves_nodes),
    ],
    check_ranks_on_each_node: [
        wrong_answer("node_rank x this node's count, as if nodes were equal", ranks_with_own_count),
        wrong_answer("node_rank x the first node's count", ranks_with_first_count),
        wrong_answer("returns local ranks", ranks_are_local),
    ],
    check_bus_bandwidth: [
        wrong_answer("algorithm bandwidth (no factor)", algorithm_bandwidth),
        wrong_answer("(N - 1) / N without the 2", bus_bandwidth_without_two),
        wrong_answer("2 without (N - 1) / N", bus_bandwidth_without_fraction),
        wrong_answer("N / (N - 1) upside down", bus_bandwidth_inverted_fraction),
    ],
}
