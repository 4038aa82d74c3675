"""Graders of lesson 09, scaling: speedup and efficiency measured on 1, 2 and 4 ranks with the
oversubscribed world sizes flagged, the predicted time of a gradient all-reduce, and a batch plan.

- scaling efficiency, measured: the learner's strong-scaling runs as measure_scaling recorded them
  ({world_size: [seconds of each run]}, world sizes 1, 2 and 4), a report {world_size: (speedup,
  efficiency, oversubscribed)} (speedup from the runs' medians, statistics.median's, within
  1e-6; oversubscribed when there are more ranks than cpu_cores(); any kind of number and
  Python's or NumPy's bool) and the best world size that is not oversubscribed. The runs must be
  a measurement: the record scaling.measure_scaling made in this session, unchanged (every step's
  seconds of every run, its clocks agreeing with them, its seal: checks/engine/measured.py), of strong
  scaling. Judged against that record, never against a new run, so no band is needed: the load
  of a busy machine changes the runs, and an honest report of any run passes; typed-in runs
  ({1: [1], 2: [.5], 4: [.25]}) or runs converted to milliseconds have no record.
- predicted all-reduce time: a ring's 2 (N - 1) alpha + 2 (N - 1) / N x bytes x beta.
- batch plan for a global batch: (batch_size, grad_accum_steps), whole numbers of any integer
  type, that give exactly the global batch with the fewest micro-batches that fit; a ValueError
  when the ranks cannot share it evenly.
"""
import numbers
import statistics

import numpy as np
import torch

from ..runtime.shared.env import cpu_cores
from ..topics.cost_model import ring_all_reduce_time
from ..topics.scaling import ScalingRuns
from .engine import expect, expect_close, grader
from .engine.boundary import grading_seed
from .engine.learner_call import call_learner
from .engine.measured import expect_recorded
from .engine.observations import as_plain

# -- Exercise 1: scaling efficiency on this machine (a measurement) ------------------------------

MEASURED_WORLD_SIZES = (1, 2, 4)

@grader("scaling efficiency, measured")
def check_scaling_efficiency(runs, report, best_world_size, cores=None):
    cores = cpu_cores() if cores is None else cores
    medians = _expect_recorded_runs(runs)
    expect(isinstance(report, dict) and sorted(report) == sorted(medians), "report",
           f"a dict with one entry per world size you measured, {sorted(medians)}",
           repr(report)[:120])
    for world_size in sorted(medians):
        entry = report[world_size]
        what = f"report[{world_size}]"
        expect(isinstance(entry, (tuple, list)) and len(entry) == 3, what,
               "a triple (speedup, efficiency, oversubscribed)", repr(entry)[:120])
        speedup = medians[1] / medians[world_size]
        expect_close(_floats(entry[:2]), (speedup, speedup / world_size),
                     f"{what}: (speedup, efficiency) from your runs' medians",
                     f"the medians of your runs give a speedup of {speedup:.4g} on {world_size} "
                     f"ranks (the same work per step, so faster means larger): compare your "
                     f"pair with it, and with its share per rank", rtol=1e-6)
        oversubscribed = entry[2]
        expect(_is_bool(oversubscribed) and bool(oversubscribed) == (world_size > cores),
               f"{what}: oversubscribed", f"{world_size > cores} ({world_size} ranks, "
               f"{cores} CPU cores here)", repr(oversubscribed),
               "a world size is oversubscribed when it has more ranks than cpu_cores(): the "
               "ranks take turns on the cores, so its timing measures the machine, not DDP")
    trusted = [n for n in medians if n <= cores]
    best = max(trusted, key=lambda n: medians[1] / medians[n])
    expect(best_world_size == best, "best_world_size",
           f"{best}: the fastest of the world sizes that are not oversubscribed, {sorted(trusted)}",
           repr(best_world_size), "pick by speedup, and leave out the oversubscribed world sizes "
           "however fast they looked: their timing is not meaningful")
    expect_recorded(runs, ScalingRuns, "strong_runs", "scaling.measure_scaling",
                    lambda record: sum(sum(timing.seconds) + sum(timing.warmup_seconds)
                                       for timings in record.timings.values()
                                       for timing in timings))
    expect(runs.scaling == "strong", "strong_runs", "a strong-scaling measurement (the same "
           "global batch on every world size)", f"{runs.scaling} scaling",
           "pass the strong-scaling runs: speedup = t1 / tN holds for them only")


def _expect_recorded_runs(runs):
    """{world_size: median seconds} from measure_scaling's result, or a GradingError."""
    expected = (f"measure_scaling's dict {{world_size: [seconds of each run]}} with the world "
                f"sizes {list(MEASURED_WORLD_SIZES)}")
    try:
        medians = {int(n): statistics.median(float(t) for t in values)
                   for n, values in runs.items()}
    except (AttributeError, TypeError, ValueError, statistics.StatisticsError):
        medians = None
    expect(medians is not None and set(MEASURED_WORLD_SIZES) <= set(medians)
           and all(t > 0 for t in medians.values()), "strong_runs", expected, repr(runs)[:120],
           "pass the dict that scaling.measure_scaling returned (strong_runs above)")
    return medians


def _floats(values):
    return tuple(_as_float(value) for value in values)


def _as_float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value  # expect_close describes what came back


def _is_bool(value):
    return isinstance(value, (bool, np.bool_))


# -- Exercise 2: a predicted all-reduce time ------------------------------------------------------

ALL_REDUCE_CASES = [  # (n_parameters, world_size, alpha, beta, bytes_per_parameter)
    (25_600_000, 8, 10e-6, 1 / 50e9, 4),       # ResNet-50's gradients, fp32, 8 GPUs
    (1_000_000_000, 64, 20e-6, 1 / 25e9, 2),   # 1B parameters, bf16 gradients, 64 GPUs
    (676, 2, 50e-6, 1 / 2e9, 4),               # the course model on 2 CPU ranks
    (1_000_000, 1, 10e-6, 1 / 50e9, 4),        # one rank: nothing to send
]


def all_reduce_cases(seed):
    """ALL_REDUCE_CASES, then one drawn from `seed` (grading_seed: at grading time, one the
    notebook never saw)."""
    generator = torch.Generator().manual_seed(seed)
    draw = torch.rand(4, generator=generator, dtype=torch.float64).tolist()
    drawn = (int(1e6 + draw[0] * 1e9), 2 + int(draw[1] * 62), (5 + 45 * draw[2]) * 1e-6,
             1 / ((1 + 99 * draw[3]) * 1e9), 2 if draw[0] < 0.5 else 4)
    return ALL_REDUCE_CASES + [drawn]


def _all_reduce_answers(all_reduce_seconds, cases):
    """On the learner's side of the boundary: the answer to each case, as a plain number."""
    return [as_plain(all_reduce_seconds(n_parameters, world_size, alpha, beta,
                                        bytes_per_parameter=bytes_per_parameter))
            for n_parameters, world_size, alpha, beta, bytes_per_parameter in cases]


@grader("predicted all-reduce time")
def check_all_reduce_seconds(all_reduce_seconds):
    cases = all_reduce_cases(grading_seed(0))
    answers = call_learner(_all_reduce_answers, all_reduce_seconds, cases,
                           what="all_reduce_seconds(n_parameters, world_size, alpha, beta, "
                                "bytes_per_parameter=...)")
    for (n_parameters, world_size, alpha, beta, bytes_per_parameter), got in zip(cases, answers):
        expected = ring_all_reduce_time(n_parameters * bytes_per_parameter, world_size, alpha, beta)
        ratio = f"{_as_float(got) / expected:.3g} times" if expected and isinstance(
            _as_float(got), float) else "not"
        expect_close(_as_float(got), expected,
                     f"all_reduce_seconds({n_parameters:_}, {world_size}, alpha={alpha:g}, "
                     f"beta={beta:g}, bytes_per_parameter={bytes_per_parameter})",
                     f"your time is {ratio} the ring's here: count the bytes of the gradients, "
                     "the ring's steps, and what each rank sends in one step", rtol=1e-6,
                     atol=1e-15)


# -- Exercise 3: a batch plan for a target global batch --------------------------------------------

PLAN_CASES = [  # (global_batch_size, max_batch_size, world_size, (batch_size, grad_accum_steps))
    (1024, 64, 1, (64, 16)), (1024, 64, 8, (64, 2)), (1024, 64, 64, (16, 1)),
    (1024, 48, 2, (32, 16)), (768, 100, 4, (96, 2)), (1000, 64, 8, (25, 5)),
]
IMPOSSIBLE_PLANS = [(1000, 64, 16), (96, 8, 5)]  # the global batch does not split over the ranks


def plan_cases(seed):
    """PLAN_CASES, then one drawn from `seed` (grading_seed), its plan worked out here: the fewest
    micro-batches that split the rank's share evenly and fit."""
    generator = torch.Generator().manual_seed(seed)
    world_size, per_rank, max_batch_size = (
        int(torch.randint(low, high, (1,), generator=generator)) for low, high in
        ((1, 17), (8, 513), (8, 129)))
    steps = next(steps for steps in range(1, per_rank + 1)
                 if per_rank % steps == 0 and per_rank // steps <= max_batch_size)
    return PLAN_CASES + [(per_rank * world_size, max_batch_size, world_size,
                          (per_rank // steps, steps))]


def _plans(accumulation_plan, cases, impossible):
    """On the learner's side: each plan as plain data (its text, its items as numbers of their own
    kind), and for each impossible case the exception's type or what came back instead."""
    plans = []
    for global_batch_size, max_batch_size, world_size, _ in cases:
        got = accumulation_plan(global_batch_size, max_batch_size, world_size)
        pair = isinstance(got, (tuple, list)) and len(got) == 2
        plans.append({"shown": repr(got)[:120], "items": [as_plain(v) for v in got] if pair else None,
                      "as_tuple": repr(tuple(got)) if pair else ""})
    refusals = []
    for global_batch_size, max_batch_size, world_size in impossible:
        try:
            got = accumulation_plan(global_batch_size, max_batch_size, world_size)
        except ValueError:
            refusals.append({"raised": "ValueError"})
        else:
            refusals.append({"returned": repr(got)[:120]})
    return plans, refusals


@grader("batch plan for a global batch")
def check_accumulation_plan(accumulation_plan):
    cases = plan_cases(grading_seed(0))
    plans, refusals = call_learner(_plans, accumulation_plan, cases, IMPOSSIBLE_PLANS,
                                   what="accumulation_plan(global_batch_size, max_batch_size, "
                                        "world_size)")
    for (global_batch_size, max_batch_size, world_size, expected), plan in zip(cases, plans):
        call = f"accumulation_plan({global_batch_size}, {max_batch_size}, {world_size})"
        got = plan["items"]
        expect(got is not None
               and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in got),
               call, "a pair of ints (batch_size, grad_accum_steps)", plan["shown"],
               "counts of samples and of micro-batches are whole numbers: a float, even 2.0, "
               "is not one")
        batch_size, grad_accum_steps = got
        product = batch_size * grad_accum_steps * world_size
        expect(product == global_batch_size, f"{call}: the global batch it gives",
               f"{global_batch_size}", f"{batch_size} x {grad_accum_steps} x {world_size} = "
               f"{product}", "batch_size x grad_accum_steps x world_size must be exactly the "
               "target: the learning rate was tuned for it; so grad_accum_steps must divide "
               "each rank's share")
        expect(batch_size <= max_batch_size, f"{call}: the micro-batch",
               f"at most max_batch_size = {max_batch_size} samples", str(batch_size),
               "a larger micro-batch does not fit in the device's memory")
        expect(tuple(got) == expected, call, f"{expected}: the fewest micro-batches",
               plan["as_tuple"], f"{got[1]} micro-batches per step, where {expected[1]} of "
               f"{expected[0]} samples would fit too: fewer micro-batches, larger ones, as long "
               "as they fit")
    for (global_batch_size, max_batch_size, world_size), refusal in zip(IMPOSSIBLE_PLANS, refusals):
        call = f"accumulation_plan({global_batch_size}, {max_batch_size}, {world_size})"
        expect("raised" in refusal, call,
               "a ValueError: the global batch does not split evenly over the ranks",
               refusal.get("returned", ""), f"{global_batch_size} samples cannot be shared evenly "
               f"by {world_size} ranks: no plan is valid, and the exercise asks for an error then")
