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
- health check: the learner's health_check(sizes_bytes), run by the check on 3 gloo ranks (where
  2 (N - 1) / N is 4/3, not 1 as on 2 ranks) with measure_all_reduce observed inside the ranks:
  one row (nbytes, seconds, bus bandwidth) per size, its seconds those measure_all_reduce gave
  (seconds, not ms), its bus bandwidth nbytes / seconds x 2 (N - 1) / N (within 1e-6). Then the
  learner's recorded rows on nprocs ranks (at least 3 sizes, up to 1 MiB or more, each following
  from its own bytes and seconds) and the best of them. The best must be a measurement of this
  machine: when the learner's ranks ran on the CPU (fewer than 2 GPUs), within BAND (10x) of the
  best bus bandwidth the course's own measure_all_reduce gives on 3 ranks at the grading sizes
  (course code only: in class grading it runs again where the verdict is decided; re-measured 4
  more times, over 4 s, before it rejects). The band: on this 2-core machine, shared by other
  jobs, 2-rank runs gave best bus bandwidths of 0.9-1.8 GB/s and 3-rank runs 1.1-1.2 GB/s (gloo
  over loopback, bandwidth-bound at 4 MiB, which load slows far less than latency); a
  GB/s-for-bytes/s slip is 1e9 off. On GPUs (NCCL) the check cannot re-measure the same links on gloo: the rows are judged
  by their arithmetic and the function by its 3-rank run."""
import numbers
import os

import torch
import torch.distributed as dist

from .. import gpu_count
from ..topics import cost_model
from ..topics.cluster import rank_layout
from .engine import (
    GradingError,
    expect,
    expect_close,
    expect_equal,
    expect_whole_number,
    grader,
)
from .engine.boundary import grading_seed
from .engine.measured import expect_within_band, unit_slip
from .engine.observations import as_plain
from .engine.ranks import run_on_ranks

RANK_LAYOUTS = [[1, 2], [2, 1, 1]]  # uneven: neither one node's count nor a constant 2 fits all
NODE_LAYOUTS = [[2, 1], [2, 2, 1]]  # uneven nodes: a guess from one node's count fails
HEALTH_MIN_SIZES = 3
HEALTH_LARGEST_AT_LEAST = 2**20
HEALTH_GRADING_RANKS = 3                        # 2 (N - 1) / N = 4/3: a missing factor shows
HEALTH_GRADING_SIZES = [2**10, 2**16, 2**20, 2**22]  # fixed: the figures are measured, not drawn
BAND = 10                                       # the learner's best within 10x of the check's


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


def _placed_global_rank(global_rank, layout, order):
    """Inside a rank: the variables torchrun's agent gives layout[order[rank]], without RANK and
    WORLD_SIZE (what the learner computes); then the learner's global_rank()."""
    place = layout[order[dist.get_rank()]]
    for name in ("RANK", "WORLD_SIZE"):
        os.environ.pop(name, None)
    os.environ.update(GROUP_RANK=str(place.node_rank), LOCAL_RANK=str(place.local_rank),
                      LOCAL_WORLD_SIZE=str(place.local_world_size),
                      GROUP_WORLD_SIZE=str(layout[-1].node_rank + 1))
    got = global_rank()
    try:
        rank, world_size = got
    except (TypeError, ValueError):
        return {"shown": repr(got)[:120], "rank": None, "world_size": None}
    return {"shown": repr(got)[:120], "rank": _plain_number(rank),
            "world_size": _plain_number(world_size)}


def _plain_number(value):
    """A whole number as an int, a float as a float (to be rejected with its type), else a repr."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) \
        else repr(value)[:60]


@grader("global rank")
def check_global_rank(global_rank):
    for nproc_per_node, order in rank_cases(grading_seed(0)):
        layout = rank_layout(list(nproc_per_node))
        got = run_on_ranks(_placed_global_rank, global_rank, layout, order, nprocs=len(layout),
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
                         f"node {place.node_rank} holds ranks {expected} here; nodes may hold "
                         "different numbers of ranks, so a rank cannot work out the others' "
                         "nodes from its own: it must learn each rank's node from that rank")


def _as_placed(ranks_on_my_node, layout):
    """Inside a rank: set the node variables torchrun would on `layout`, then call the learner's."""
    place = layout[dist.get_rank()]
    os.environ.update(GROUP_RANK=str(place.node_rank), LOCAL_RANK=str(place.local_rank),
                      LOCAL_WORLD_SIZE=str(place.local_world_size))
    return as_plain(ranks_on_my_node())


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
def check_health_check(health_check, health, best_bus_bandwidth, nprocs):
    _expect_function_measures(health_check)
    expect(isinstance(nprocs, int) and nprocs >= 2, "nprocs",
           "the number of ranks you measured on, at least 2", repr(nprocs))
    rows = _expect_health_rows(health)
    fraction = 2 * (nprocs - 1) / nprocs
    for nbytes, seconds, bus in rows:
        expect_close(bus, nbytes / seconds * fraction,
                     f"the bus bandwidth you recorded for {nbytes:,.0f} bytes in {seconds:.3g} s "
                     f"on {nprocs} ranks",
                     "each row's bus bandwidth follows from its own bytes and seconds, as your "
                     "function computes it", rtol=1e-6)
    try:
        best = float(best_bus_bandwidth)
    except (TypeError, ValueError):
        raise GradingError("best_bus_bandwidth", "a number (bytes per second)",
                           repr(best_bus_bandwidth)[:120]) from None
    expect_close(best, max(bus for _, _, bus in rows), "best_bus_bandwidth",
                 "the largest bus bandwidth of your rows, in bytes per second", rtol=1e-6)
    if gpu_count() < 2:  # the learner's ranks ran on gloo, on this machine's CPU: compare
        expect_within_band(best, _machine_best_bus, BAND, "best_bus_bandwidth, against this machine",
                           "B/s", "measure on this machine, and report bytes per second")


def _run(health_check):
    return run_on_ranks(_observed, health_check, HEALTH_GRADING_SIZES, nprocs=HEALTH_GRADING_RANKS,
                        what=f"health_check on {HEALTH_GRADING_RANKS} ranks",
                        hang_hint="every rank must call measure_all_reduce with the same sizes")[0]


def _observed(health_check, sizes):
    """Inside a rank: the learner's rows, and the sweeps measure_all_reduce made meanwhile, as
    plain data: (nbytes, seconds) of each size of each sweep."""
    cost_model.recent_sweeps.clear()
    rows = health_check(sizes)
    return as_plain(rows), [[(int(nbytes), float(seconds)) for nbytes, seconds in sweep]
                            for sweep in cost_model.recent_sweeps]


def _machine_best_bus():
    """This machine's best bus bandwidth on the grading run's ranks and sizes, measured by the
    course's own measure_all_reduce (no learner code: it runs again wherever the grader runs)."""
    return run_on_ranks(_best_bus_on_rank, HEALTH_GRADING_SIZES, nprocs=HEALTH_GRADING_RANKS,
                        what=f"the check's own all-reduce on {HEALTH_GRADING_RANKS} ranks",
                        hang_hint="the course's own measurement hung: run the check again",
                        learner=False)[0]


def _best_bus_on_rank(sizes):
    factor = 2 * (dist.get_world_size() - 1) / dist.get_world_size()
    return max(nbytes / seconds * factor for nbytes, seconds in cost_model.measure_all_reduce(sizes))


def _expect_function_measures(health_check):
    """Run health_check on 3 ranks; its rows must be measure_all_reduce's, with the 4/3 factor."""
    grading = _run(health_check)
    rows, sweeps = grading
    what = f"health_check({HEALTH_GRADING_SIZES}) on {HEALTH_GRADING_RANKS} ranks"
    expect(bool(sweeps), what, "rows from a measurement (measure_all_reduce)",
           "no all-reduce was timed while it ran", "time the all-reduce at every size: typed-in "
           "or copied rows are no measurement")
    measured = {nbytes: seconds for sweep in sweeps for nbytes, seconds in sweep}  # by size
    try:
        rows = [(float(nbytes), float(seconds), float(bus)) for nbytes, seconds, bus in rows]
    except (TypeError, ValueError):
        rows = []
    expect([nbytes for nbytes, _, _ in rows] == [float(n) for n in HEALTH_GRADING_SIZES]
           and all(int(nbytes) in measured for nbytes, _, _ in rows), what,
           f"one row (nbytes, seconds, bus bandwidth) per size measured, for "
           f"{HEALTH_GRADING_SIZES}",
           repr(grading[0])[:120])
    factor = 2 * (HEALTH_GRADING_RANKS - 1) / HEALTH_GRADING_RANKS
    for nbytes, seconds, bus in rows:
        timed = measured[int(nbytes)]
        expect(abs(seconds - timed) <= 1e-9 * timed, f"{what}: the seconds of {nbytes:,.0f} bytes",
               f"{timed:.4g} s, what measure_all_reduce timed", f"{seconds:.4g}",
               unit_slip(seconds / timed) or "each row keeps the seconds measured for its size")
        expected = nbytes / timed * factor
        expect(abs(bus - expected) <= 1e-6 * expected,
               f"{what}: the bus bandwidth of {nbytes:,.0f} bytes", f"{expected:.4g} bytes/s",
               f"{bus:.4g} ({bus / expected:.3g} times it)", unit_slip(bus / expected) or
               f"on {HEALTH_GRADING_RANKS} ranks your bus bandwidth is {bus / expected:.3g} times "
               "the right one: the share of the data each rank moves in a ring depends on N "
               "(on 2 ranks it is 1, so the mistake hides there)")
    return grading


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
