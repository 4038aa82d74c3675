"""Lesson 12's health check, judged from what its ranks returned (ranks.watched_health_check): the
rows the learner's function computed on rank 0, and every rank's record of its dist.all_reduce
calls (bytes, seconds), taken while one rank (not 0) finished each all-reduce late. Plain data
only: no learner code runs here."""
import statistics

import numpy as np
import torch

from ..engine import GradingError, expect, expect_close
from ..engine.learner_call import library_call_hint
from ..engine.measured import unit_slip
from ...topics.cost_model import HEALTHY_SHARE

ROW_KEYS = ("nbytes", "times", "seconds", "algorithm_bandwidth", "bus_bandwidth")
MIN_REPEATS = 3
SLOWEST_BAND = (0.7, 3.0)   # the learner's median against the slowest rank's, as this grader timed it
EXTRA_S = 0.01              # ... plus 10 ms on the slow side: a deschedule between the two clocks


def judge(outcomes, sizes, expected, slow_rank, delay_s, healthy_wanted):
    """Raise a GradingError at the first thing wrong in one run of the learner's health check."""
    world_size, what = len(outcomes), f"health_check on {len(outcomes)} ranks"
    library = outcomes[0]["library"]
    expect(not library, what, "your own timing of dist.all_reduce", f"a call of the course's "
           f"{library[0] if library else ''}",
           library_call_hint(f"course_lib.topics.cost_model.{library[0]}" if library else "", "exercise 3"))
    result = outcomes[0]["result"]
    rows = _rows(result, sizes, what)
    for size, row in zip(sizes, rows):
        where = f"{what}: the row of {size:,} bytes"
        calls = [[seconds for nbytes, seconds in outcome["calls"] if nbytes == size] for outcome in outcomes]
        _expect_called(outcomes[0]["calls"], size, calls[0], where)
        timed = _expect_warm_up_left_out(calls, row, where)
        _expect_lined_up(timed, slow_rank, delay_s, where)
        _expect_slowest(timed, row, slow_rank, where)
        _expect_arithmetic(row, world_size, where)
    best = max(row["bus_bandwidth"] for row in rows)
    expect_close(result["best_bus_bandwidth"], best, f"{what}: best_bus_bandwidth",
                 "the largest bus bandwidth of your rows, in bytes per second", rtol=1e-6)
    rule = best >= HEALTHY_SHARE * expected
    expect(result["healthy"] is rule and rule is healthy_wanted, f"{what}: healthy, against an "
           f"expected {expected:.3g} B/s", f"{rule} (best {best:.3g} B/s against {HEALTHY_SHARE} x "
           f"the expected)", repr(result["healthy"]),
           f"healthy is True when the best bus bandwidth reaches at least {HEALTHY_SHARE} x "
           "expected_bus_bandwidth, False otherwise (a bool): the check passes one expectation "
           "no machine misses and one no machine reaches")


def _rows(result, sizes, what):
    shape = ('{"rows": [one dict per size with ' + ", ".join(ROW_KEYS) + '], '
             '"best_bus_bandwidth": a number, "healthy": a bool}')
    expect(isinstance(result, dict) and {"rows", "best_bus_bandwidth", "healthy"} <= set(result)
           and isinstance(result["rows"], (list, tuple)) and len(result["rows"]) == len(sizes),
           what, f"{shape}, {len(sizes)} rows for the sizes {sizes}", repr(result)[:200])
    rows = []
    for row in result["rows"]:
        try:
            times = [float(seconds) for seconds in torch.as_tensor(row["times"]).flatten().tolist()]
            rows.append(dict({key: float(row[key]) for key in ROW_KEYS if key != "times"}, times=times))
        except (TypeError, ValueError, KeyError, RuntimeError):
            raise GradingError(what, f"each row a dict with {', '.join(ROW_KEYS)} (times: each "
                               "repeat's seconds)", repr(row)[:200]) from None
    for size, row in zip(sizes, rows):
        expect(row["nbytes"] == size, f"{what}: nbytes of the row of {size:,} bytes", f"{size:,}",
               f"{row['nbytes']:,.0f}", _bytes_hint(row["nbytes"] / size))
    return rows


def _bytes_hint(ratio):
    if ratio == 0.25:
        return "nbytes is the tensor's size in bytes, numel() x element_size(): 4 bytes a float32"
    if ratio == 4:
        return "a size is in bytes: a float32 tensor of size // 4 elements holds it"
    return "one row per size, in the order of sizes_bytes, each with the bytes all-reduced"


def _expect_called(all_calls, size, calls, where):
    if calls:
        return
    seen = sorted({nbytes for nbytes, _ in all_calls})
    hint = ("your tensors were 4 times too large: sizes are bytes, and a float32 element is 4 bytes"
            if 4 * size in seen else "all-reduce a float32 tensor of size // 4 elements at each size")
    expect(False, where, f"dist.all_reduce calls of a tensor of {size:,} bytes",
           f"all-reduces of {seen[:6]} bytes", hint)


def _expect_warm_up_left_out(calls, row, where):
    """The last len(times) calls of the size on each rank, once at least one came before them."""
    repeats, made = len(row["times"]), min(len(rank_calls) for rank_calls in calls)
    expect(repeats >= MIN_REPEATS and all(seconds > 0 for seconds in row["times"]), where,
           f"times: {MIN_REPEATS} or more repeats, each a positive number of seconds",
           repr(row["times"])[:120], "time several repeats: one can be slowed by anything")
    expect(made > repeats, where, f"at least one all-reduce of the size before the {repeats} you "
           f"timed (a warm-up, left out)", f"{made} all-reduces of it in all, {repeats} timed",
           "the first calls of a size pay one-time costs (buffers, connections; with NCCL the "
           "communicator itself): call it once or twice before you start timing, and leave those out")
    return [rank_calls[-repeats:] for rank_calls in calls]


def _expect_lined_up(timed, slow_rank, delay_s, where):
    for rank, seconds in enumerate(timed):
        if rank == slow_rank:
            continue
        waited = statistics.median(seconds)
        expect(waited < delay_s / 2, where, f"rank {rank}'s timed all-reduces as long as the "
               f"all-reduce itself (rank {slow_rank} came back {delay_s * 1e3:.0f} ms late from each: "
               "the check's slow rank)", f"{waited * 1e3:.1f} ms each, in the median",
               f"rank {rank}'s clock ran while it waited for rank {slow_rank} to arrive: line the "
               "ranks up (dist.barrier()) right before each start of the clock")


def _expect_slowest(timed, row, slow_rank, where):
    slowest = statistics.median(max(call) for call in zip(*timed))  # each repeat's slowest rank
    learner = statistics.median(row["times"])
    low, high = SLOWEST_BAND[0] * slowest, SLOWEST_BAND[1] * slowest + EXTRA_S
    if low <= learner <= high:
        return
    rank0 = statistics.median(timed[0])
    hint = unit_slip(learner / slowest) or (
        f"rank 0's own all-reduces took {rank0 * 1e3:.2g} ms, rank {slow_rank}'s {slowest * 1e3:.2g} ms: "
        "the collective ends with its slowest rank; take each repeat's largest time over the ranks "
        "(dist.all_reduce(times, op=dist.ReduceOp.MAX))" if learner < low else
        "time the all-reduce alone: the barrier and the sharing of the times come outside the clock")
    expect(False, f"{where}: the median of its times", f"between {low * 1e3:.3g} and {high * 1e3:.3g} ms "
           f"(the slowest rank's all-reduces took {slowest * 1e3:.3g} ms, by the check's clock)",
           f"{learner * 1e3:.3g} ms", hint)


def _expect_arithmetic(row, world_size, where):
    times, seconds = row["times"], row["seconds"]
    low, high = np.percentile(times, [25, 75])
    expect(low * (1 - 1e-9) <= seconds <= high * (1 + 1e-9), f"{where}: seconds",
           f"the median of its times (between {low:.4g} and {high:.4g} s)", f"{seconds:.4g}",
           unit_slip(seconds / statistics.median(times)) or "the median (or the mean of the middle "
           "repeats) of the times: one slow repeat must not move it")
    algorithm = row["nbytes"] / seconds
    expect_close(row["algorithm_bandwidth"], algorithm, f"{where}: algorithm_bandwidth",
                 unit_slip(row["algorithm_bandwidth"] / algorithm) or "nbytes / seconds, in bytes per second",
                 rtol=1e-6)
    factor = 2 * (world_size - 1) / world_size
    ratio = row["bus_bandwidth"] / (algorithm * factor)
    expect(abs(ratio - 1) <= 1e-6, f"{where}: bus_bandwidth", f"{algorithm * factor:.4g} B/s "
           f"(algorithm bandwidth x 2 (N - 1) / N = {factor:.3g} on {world_size} ranks)",
           f"{row['bus_bandwidth']:.4g} ({ratio:.3g} times it)",
           unit_slip(ratio) or (f"in a ring all-reduce each rank sends and receives 2 (N - 1) / N of "
           f"the data; your factor is {ratio * factor:.3g} on {world_size} ranks" if 0.2 < ratio < 3 else
           "it does not follow from your own bytes and seconds: compute it from them, never type it in"))
