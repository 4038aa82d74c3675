"""Graders of lesson 09, scaling: speedup and efficiency measured on 1, 2 and 4 ranks with the
oversubscribed world sizes flagged, a diagnosis of whether a step is communication-bound from
paired measurements, and a batch plan.

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
- communication-bound or not: diagnose(with_sync, without_sync), on pairs of step times drawn at
  grading time (grading_seed), returns the median of the pair-by-pair shares (with - without) /
  with, the median's 90% interval (scaling.median_interval, the sign test's), and
  "communication-bound" (all of it above 0.5), "compute-bound" (all below) or "undecided";
  compared with scaling.communication_share,
  which the learner may not call. The cases: load swinging between pairs, one odd pair, a
  share straddling one half, and communication that is 60% of the compute but 37.5% of the step.
- batch plan for a global batch: (batch_size, grad_accum_steps), whole numbers of any integer
  type, that give exactly the global batch with the fewest micro-batches that fit; a ValueError
  when the ranks cannot share it evenly.
"""
import numbers
import statistics

import numpy as np
import torch

from ..runtime.shared.env import cpu_cores
from ..topics.scaling import ScalingRuns, communication_share
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


# -- Exercise 2: is a step communication-bound? (a diagnosis from paired measurements) ---------

VERDICTS = ("communication-bound", "compute-bound", "undecided")
PAIRS = 16


def share_cases(seed):
    """Paired step times (with_sync, without_sync) drawn from `seed` (grading_seed: at grading
    time, data the notebook never saw), each a case a diagnosis can get wrong:
    - communication-bound, the load swinging 1-4x from pair to pair (only pairs see through it),
      and one pair where a burst hit the step without communication (the minimum is misleading);
    - compute-bound, the same swings;
    - a share spread around one half: undecided;
    - communication 60% of the compute, 37.5% of the step: compute-bound (a share of the
      compute, not of the step, says the opposite)."""
    generator = torch.Generator().manual_seed(seed)

    def uniform(low, high, n=PAIRS):
        return (low + (high - low) * torch.rand(n, generator=generator, dtype=torch.float64)).tolist()

    def paired(compute, communication, swing, jitter=0.03):
        loads, shake = uniform(1, swing), uniform(1 - jitter, 1 + jitter, 2 * PAIRS)
        without = [compute * load * shake[i] for i, load in enumerate(loads)]
        with_sync = [(compute + communication) * load * shake[PAIRS + i]
                     for i, load in enumerate(loads)]
        return with_sync, without

    scale = uniform(0.5, 2, 4)
    with_a, without_a = paired(1e-3 * scale[0], 5e-3 * scale[0], 4)
    burst = int(torch.randint(0, PAIRS, (1,), generator=generator))
    without_a[burst] = 0.8 * with_a[burst]  # a burst slowed the step without communication
    with_b, without_b = paired(20e-3 * scale[1], 2e-3 * scale[1], 4)
    order = torch.randperm(PAIRS, generator=generator).tolist()  # spread evenly over 0.3-0.7
    shares = [0.3 + 0.4 * k / (PAIRS - 1) + shake for k, shake in zip(order, uniform(-.02, .02))]
    without_c = [4e-3 * scale[2] * load for load in uniform(1, 2)]
    with_c = [alone / (1 - share) for alone, share in zip(without_c, shares)]
    with_d, without_d = paired(10e-3 * scale[3], 6e-3 * scale[3], 1.5, jitter=0.01)
    return [("communication-bound, under swinging load", with_a, without_a),
            ("compute-bound, under swinging load", with_b, without_b),
            ("a share around one half", with_c, without_c),
            ("communication 60% of the compute", with_d, without_d)]


def _diagnoses(diagnose, cases):
    """On the learner's side: each case's (share, (low, high), verdict) as plain data."""
    results = []
    for _, with_sync, without_sync in cases:
        got = diagnose(list(with_sync), list(without_sync))
        results.append({"shown": repr(got)[:160], "value": as_plain(got)})
    return results


def _unpack(value):
    """(share, low, high, verdict) from the learner's result, or None."""
    try:
        share, interval, verdict = value
        low, high = interval
        return float(share), float(low), float(high), verdict
    except (TypeError, ValueError):
        return None


@grader("communication-bound or not: a diagnosis")
def check_communication_share(diagnose):
    cases = share_cases(grading_seed(9))
    results = call_learner(_diagnoses, diagnose, cases,
                           what="diagnose(with_sync, without_sync)",
                           written_by_you=communication_share)
    for (name, with_sync, without_sync), result in zip(cases, results):
        share, (low, high), verdict = communication_share(with_sync, without_sync)
        what = f"diagnose(...) on {PAIRS} pairs of steps ({name})"
        got = _unpack(result["value"])
        expect(got is not None, what, "(share, (low, high), verdict)", result["shown"],
               "return the median share, its 10th and 90th percentiles as a pair, and the verdict")
        expect_close(got[0], share, f"{what}: the share",
                     "each pair's share is (with - without) / with, the communication's part of "
                     "that pair's whole step; the median of those shares (pair the steps: the "
                     "load changes from pair to pair)", rtol=1e-6, atol=1e-9)
        expect_close(got[1:3], (low, high), f"{what}: (low, high)",
                     "the 90% interval of the median of the pair-by-pair shares "
                     "(scaling.median_interval(shares)): not the minimum and maximum, which one "
                     "odd pair moves, nor the spread of single pairs", rtol=1e-6, atol=1e-9)
        expect(got[3] == verdict, f"{what}: the verdict", repr(verdict), repr(got[3]),
               f"one of {VERDICTS}: communication-bound only when the whole interval is above "
               "one half, compute-bound only when it is all below; otherwise the measurement "
               "cannot tell")


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
