"""Graders for lesson 12 (multi-node): each process's global rank from what its node tells it and
the ranks that share a rank's node (both run on ranks), and an all-reduce health check measured
on this machine.

- global rank: the learner's global_rank() runs on 3 and 4 gloo ranks laid out as the uneven
  "nodes" RANK_LAYOUTS, each seeing the GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_WORLD_SIZE torchrun's
  agent gives it, without RANK and WORLD_SIZE, and joined in an order drawn from grading_seed
  (so the process group's own rank is not the answer); on every rank it returns (RANK,
  WORLD_SIZE) as torchrun numbers them (_assign_worker_ranks in
  torch/distributed/elastic/agent/server/api.py: the local world sizes of the nodes before, plus
  LOCAL_RANK), whole numbers.
- ranks on my node: the learner's function runs on 3 and 5 gloo ranks laid out as uneven "nodes"
  (each rank sees the GROUP_RANK, LOCAL_RANK and LOCAL_WORLD_SIZE torchrun would give it on such a
  layout); on every rank it returns the global ranks on that rank's node, in order (any sequence
  of whole numbers).
- health check: the learner's health_check(sizes_bytes, expected_bus_bandwidth) runs on 2 gloo
  ranks and on 3 (where 2 (N - 1) / N is 4/3, and 2/N differs from it), at sizes drawn from
  grading_seed, with every dist.all_reduce watched (its bytes and its time, ranks.py) while a
  rank other than 0, drawn too, finishes each all-reduce of those sizes DELAY_S late, as a slow
  GPU or link would. Judged here (health.py) on what came back: no call of the course's
  measure_all_reduce or all_reduce_health; one row per size with the tensor's bytes; at least
  one all-reduce of each size before the timed ones (a warm-up left out); the other ranks'
  timed all-reduces short (a barrier lined them up, so their clocks did not run while the slow
  rank arrived); the median of the times the slowest rank's (against the check's own clock on
  the same calls); seconds their median (or a middle mean), algorithm bandwidth nbytes /
  seconds and bus bandwidth that times 2 (N - 1) / N, the best of them, and the verdict: healthy
  against an expectation of 1 B/s, unhealthy against 1 PB/s.
"""
import random

import torch

from ...topics.cluster import rank_layout
from ..engine import expect, expect_equal, expect_whole_number, grader
from ..engine.boundary import grading_seed
from ..engine.ranks import run_on_ranks
from .health import judge
from .ranks import placed_global_rank, placed_ranks_on_my_node, watched_health_check

RANK_LAYOUTS = [[1, 2], [2, 1, 1]]  # uneven: neither one node's count nor a constant 2 fits all
NODE_LAYOUTS = [[2, 1], [2, 2, 1]]  # uneven nodes: a guess from one node's count fails
# The health check's runs: (ranks, expected bus bandwidth in B/s): any machine is healthy against
# 1 B/s and none against 1 PB/s. 3 ranks: 2 (N - 1) / N = 4/3, which neither (N - 1) / N nor 2/N is.
HEALTH_RUNS = [(2, 1.0), (3, 1e15)]
# The slow rank's lateness: 25 to 70 times an all-reduce of the drawn sizes on a quiet 2-core
# machine (0.7 to 2 ms); the lined-up ranks' all-reduces must stay under half of it.
DELAY_S = 0.05
HEALTH_SEED = 12


def rank_cases(seed):
    """RANK_LAYOUTS, each with an order of arrival drawn from `seed` (grading_seed): process i of
    the process group plays layout[order[i]], so the process group's rank is not the answer, and
    the first to join is on a later node than 0."""
    generator = torch.Generator().manual_seed(seed)
    cases = []
    for nproc_per_node in RANK_LAYOUTS:
        n = sum(nproc_per_node)
        order = [int(i) for i in torch.randperm(n, generator=generator)]
        while order[0] < nproc_per_node[0]:  # the first to join is not on node 0: neither the
            order = order[1:] + order[:1]     # group's ranks nor nodes in order of arrival fit
        cases.append((nproc_per_node, order))
    return cases


@grader("global rank")
def check_global_rank(global_rank):
    for nproc_per_node, order in rank_cases(grading_seed(0)):
        layout = rank_layout(list(nproc_per_node))
        got = run_on_ranks(placed_global_rank, global_rank, layout, order, nprocs=len(layout),
                           what=f"global_rank() on nodes {nproc_per_node}",
                           hang_hint="every rank must call the same collectives: all of them "
                                     "call all_gather_object (or all_gather) once")
        for joined, answer in enumerate(got):
            place = layout[order[joined]]
            where = (f"global_rank() of the process with GROUP_RANK={place.node_rank}, "
                     f"LOCAL_RANK={place.local_rank} on nodes {nproc_per_node}")
            expect(answer["rank"] is not None, where, "(RANK, WORLD_SIZE), two whole numbers",
                   answer["shown"])
            for name, value, expected in (("RANK", answer["rank"], place.rank),
                                          ("WORLD_SIZE", answer["world_size"], place.world_size)):
                expect_whole_number(value, f"{where}: its {name}",
                                    f"a {name} is a count of processes: return an int")
                expect_equal(value, expected, f"{where}: its {name}",
                             _rank_hint(name, value, place, nproc_per_node, joined))


def _rank_hint(name, value, place, nproc_per_node, joined):
    if value == joined:
        return ("that is its rank in the process group, the order in which the processes joined "
                "here, not torchrun's numbering: compute it from the nodes")
    if name == "WORLD_SIZE":
        return (f"the nodes hold {list(nproc_per_node)} processes: the world is all of them, and "
                "one node's LOCAL_WORLD_SIZE times the number of nodes counts equal nodes only")
    if value == place.node_rank * place.local_world_size + place.local_rank:
        return ("nodes may hold different numbers of processes: the ranks before this node are "
                "the sum of the earlier nodes' LOCAL_WORLD_SIZE, not GROUP_RANK x this node's")
    return (f"torchrun numbers the nodes by GROUP_RANK and, on each node, its processes by "
            f"LOCAL_RANK: here node {place.node_rank}'s first rank is "
            f"{place.rank - place.local_rank}")


def node_layouts(seed):
    """NODE_LAYOUTS with the last one's nodes rotated by `seed` (grading_seed): which node is the
    short one changes, so does every rank's answer; the world stays 3 to 5 ranks, what 2 cores run."""
    turn = seed % len(NODE_LAYOUTS[-1])
    return NODE_LAYOUTS[:-1] + [NODE_LAYOUTS[-1][turn:] + NODE_LAYOUTS[-1][:turn]]


@grader("ranks on my node")
def check_ranks_on_my_node(ranks_on_my_node):
    for nproc_per_node in node_layouts(grading_seed(0)):
        layout = rank_layout(list(nproc_per_node))
        got = run_on_ranks(placed_ranks_on_my_node, ranks_on_my_node, layout,
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
                         f"node {place.node_rank} holds ranks {expected} here; nodes may hold "
                         "different numbers of ranks, so a rank cannot work out the others' "
                         "nodes from its own: it must learn each rank's node from that rank")


def _whole_numbers(ranks):
    try:
        return all(int(rank) == rank and not isinstance(rank, bool) for rank in ranks)
    except (TypeError, ValueError):
        return False


def health_cases(seed):
    """For each of HEALTH_RUNS: (ranks, expected, sizes, slow rank), drawn from `seed`: two sizes,
    one of 8 to 32 KiB and one of 128 to 512 KiB (whole float32 elements, drawn: not the lesson's
    powers of two), and the rank (not 0) whose all-reduces come back late."""
    draw = random.Random(seed)
    return [(ranks, expected, [4 * draw.randint(2**k, 2**(k + 2)) for k in (11, 15)],
             draw.randint(1, ranks - 1)) for ranks, expected in HEALTH_RUNS]


@grader("all-reduce health check")
def check_health_check(health_check):
    for ranks, expected, sizes, slow_rank in health_cases(grading_seed(HEALTH_SEED)):
        outcomes = run_on_ranks(watched_health_check, health_check, sizes, expected, slow_rank,
                                DELAY_S, nprocs=ranks, what=f"health_check({sizes}, {expected:g}) "
                                f"on {ranks} ranks", hang_hint="every rank must make the same "
                                "collective calls in the same order: the same sizes, repeats and "
                                "barriers on all of them")
        judge(outcomes, sizes, expected, slow_rank, DELAY_S, healthy_wanted=expected < 1e3)
