"""Graders of lesson 09, scaling: strong scaling's efficiency measured in pairs with the conclusion
its interval supports, a diagnosis of whether a step is communication-bound from paired
measurements, and a batch plan.

- scaling efficiency, measured in pairs: the learner's measurement, the SpeedupPairs that
  scaling.measure_speedup_pairs recorded in this session, unchanged (its seal and its clocks:
  checks/engine/measured.py), of strong scaling on 2 or more ranks and no more ranks than
  cpu_cores() (more take turns on the cores), with at least PAIRS pairs; and their
  efficiency_report(one_rank, ranks, world_size, kind), run on pairs drawn at grading time
  (grading_seed) and on their own measurement, returning the median of the pair-by-pair
  efficiencies (speedup t1 / tN, or N t1 / tN under weak scaling, over N), the median's 90%
  interval (scaling.median_interval) and "faster than 1 rank" (all of it above 1 / N), "slower
  than 1 rank" (all below) or "undecided"; compared with scaling.pairs_efficiency, which the
  learner may not call. The cases: load swinging between pairs with one odd pair, weak scaling,
  4 ranks around 1 rank's speed, and a model too small to split.
- communication-bound or not: diagnose(with_sync, without_sync), on pairs of step times drawn at
  grading time (grading_seed), returns the median of the pair-by-pair shares (with - without) /
  with, the median's 90% interval (scaling.median_interval, the sign test's), and
  "communication-bound" (all of it above 0.5), "compute-bound" (all below) or "undecided";
  compared with scaling.communication_share, which the learner may not call. The cases: load swinging between pairs, one odd pair, a
  share straddling one half, and communication that is 60% of the compute but 37.5% of the step.
- batch plan for a global batch: (batch_size, grad_accum_steps), whole numbers of any integer
  type, that give exactly the global batch with the fewest micro-batches that fit; a ValueError
  when the ranks cannot share it evenly.
"""
import functools
import numbers

import torch

from ..runtime.shared.env import cpu_cores
from ..topics.scaling import SPEEDUP_VERDICTS, SpeedupPairs, communication_share, pairs_efficiency
from .engine import expect, expect_close, grader
from .engine.boundary import grading_seed
from .engine.learner_call import call_learner
from .engine.measured import expect_recorded
from .engine.observations import as_plain

PAIRS = 16  # pairs in each case drawn at grading time, and the fewest a measurement may have


def _uniform(generator, low, high, n=PAIRS):
    return (low + (high - low) * torch.rand(n, generator=generator, dtype=torch.float64)).tolist()


# -- Exercise 1: strong scaling's efficiency, measured in pairs ----------------------------------

def efficiency_cases(seed):
    """Pairs of step times (one_rank, ranks, world_size, kind) drawn from `seed` (grading_seed),
    each a case an efficiency report can get wrong:
    - strong scaling on 2 ranks at about 1.4x, the load swinging 1-4x from pair to pair and one
      pair where a burst hit the 2-rank step (a mean of the ratios, or a ratio of the two lists'
      medians, moves; the median of the pairs' ratios does not);
    - weak scaling on 2 ranks, each step 1.6 times longer: a speedup of 1.25 counts N's samples;
    - strong scaling on 4 ranks whose speedups spread around 1: undecided, at an efficiency of
      about 1/4 (a verdict against one half or 1 is wrong);
    - a model too small to split, 2 ranks at about 0.3x: slower than 1 rank."""
    generator = torch.Generator().manual_seed(seed)

    def paired(seconds, ratios, swing, jitter=0.03):
        loads, shake = _uniform(generator, 1, swing), _uniform(generator, 1 - jitter, 1 + jitter)
        one_rank = [seconds * load for load in loads]
        return one_rank, [alone / ratio * wobble for alone, ratio, wobble in
                          zip(one_rank, ratios, shake)]

    scale = _uniform(generator, 0.5, 2, 4)
    one_a, ranks_a = paired(8e-3 * scale[0], [1.4] * PAIRS, 4)
    burst = int(torch.randint(0, PAIRS, (1,), generator=generator))
    ranks_a[burst] *= 3  # a burst of load slowed one 2-rank sample
    one_b, ranks_b = paired(5e-3 * scale[1], [1 / 1.6] * PAIRS, 2)  # t1 / tN
    order = torch.randperm(PAIRS, generator=generator).tolist()  # spread evenly over 0.7-1.3
    one_c, ranks_c = paired(6e-3 * scale[2], [0.7 + 0.6 * k / (PAIRS - 1) for k in order], 1.5)
    one_d, ranks_d = paired(0.6e-3 * scale[3], [0.3] * PAIRS, 2, jitter=0.1)
    return [("strong scaling on 2 ranks, under swinging load", one_a, ranks_a, 2, "strong"),
            ("weak scaling on 2 ranks", one_b, ranks_b, 2, "weak"),
            ("strong scaling on 4 ranks, around 1 rank's speed", one_c, ranks_c, 4, "strong"),
            ("a model too small to split, 2 ranks", one_d, ranks_d, 2, "strong")]


def _expect_measured_pairs(pairs, cores):
    """The learner's measurement is a record of strong scaling on ranks this machine has cores for."""
    expect_recorded(pairs, SpeedupPairs, "strong_pairs", "scaling.measure_speedup_pairs",
                    lambda record: record.steps_per_sample * (sum(record.one_rank)
                                                              + sum(record.ranks)))
    expect(pairs.scaling == "strong", "strong_pairs", "pairs of strong scaling (the same global "
           "batch on 1 rank and on N)", f"pairs of {pairs.scaling} scaling",
           "measure with scaling='strong': the exercise asks whether splitting a batch pays")
    expect(2 <= pairs.world_size <= cores, "strong_pairs: the world size",
           f"2 to {cores} ranks (this machine's CPU cores)", f"{pairs.world_size} ranks",
           "more ranks than cores take turns on the cores: their timing measures the machine, "
           "not DDP; fewer than 2 have nothing to split")
    expect(len(pairs.one_rank) >= PAIRS, "strong_pairs: the pairs",
           f"at least {PAIRS} pairs", f"{len(pairs.one_rank)} pairs",
           "the median's interval narrows as the pairs grow in number: measure more of them")


def _reports(efficiency_report, cases):
    """On the learner's side: each case's (efficiency, (low, high), verdict) as plain data."""
    results = []
    for _, one_rank, ranks, world_size, kind in cases:
        got = efficiency_report(list(one_rank), list(ranks), world_size, kind)
        results.append({"shown": repr(got)[:160], "value": as_plain(got)})
    return results


@grader("scaling efficiency, measured in pairs")
def check_scaling_efficiency(pairs, efficiency_report, cores=None):
    _expect_measured_pairs(pairs, cpu_cores() if cores is None else cores)
    cases = efficiency_cases(grading_seed(1)) + [
        (f"your measurement ({pairs.world_size} ranks)", pairs.one_rank, pairs.ranks,
         pairs.world_size, pairs.scaling)]
    results = call_learner(_reports, efficiency_report, cases,
                           what="efficiency_report(one_rank, ranks, world_size, kind)",
                           written_by_you=(pairs_efficiency,))
    for (name, one_rank, ranks, world_size, kind), result in zip(cases, results):
        efficiency, (low, high), verdict = pairs_efficiency(one_rank, ranks, world_size, kind)
        what = f"efficiency_report(...) on {len(one_rank)} pairs ({name})"
        _expect_report(result, (efficiency, (low, high), verdict), what, "efficiency", (
            "each pair's speedup is " + ("N t1 / tN (weak scaling: N times the samples)"
                                          if kind == "weak" else "t1 / tN (strong scaling)")
            + f", its efficiency that over N = {world_size}; the median of the pairs' "
            "efficiencies (not a mean, nor a ratio of the two lists' medians: the load changes "
            "from pair to pair)",
            "the 90% interval of the median of the pair-by-pair efficiencies "
            "(scaling.median_interval(efficiencies)): not the minimum and maximum, nor the spread "
            "of single pairs",
            f"one of {SPEEDUP_VERDICTS}: N ranks are faster than 1 when the efficiency is above "
            f"1 / N = {1 / world_size:.3g} (a speedup above 1); say so only when the whole "
            "interval is on one side, otherwise the measurement cannot tell"))


def _expect_report(result, expected, what, quantity, hints):
    """The learner's (figure, (low, high), verdict) against `expected`, the reference's, part by
    part; `hints` for the figure, the interval and the verdict."""
    got = _unpack(result["value"])
    expect(got is not None, what, f"({quantity}, (low, high), verdict)", result["shown"],
           f"return the median {quantity}, the median's 90% interval as a pair, and the verdict")
    expect_close(got[0], expected[0], f"{what}: the {quantity}", hints[0], rtol=1e-6, atol=1e-9)
    expect_close(got[1:3], expected[1], f"{what}: (low, high)", hints[1], rtol=1e-6, atol=1e-9)
    expect(got[3] == expected[2], f"{what}: the verdict", repr(expected[2]), repr(got[3]), hints[2])


def _unpack(value):
    """(first, low, high, verdict) from a (number, (low, high), verdict) result, or None."""
    try:
        first, interval, verdict = value
        low, high = interval
        return float(first), float(low), float(high), verdict
    except (TypeError, ValueError):
        return None


# -- Exercise 2: is a step communication-bound? (a diagnosis from paired measurements) ---------

VERDICTS = ("communication-bound", "compute-bound", "undecided")


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
    uniform = functools.partial(_uniform, generator)

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


@grader("communication-bound or not: a diagnosis")
def check_communication_share(diagnose):
    cases = share_cases(grading_seed(9))
    results = call_learner(_diagnoses, diagnose, cases,
                           what="diagnose(with_sync, without_sync)",
                           written_by_you=(communication_share,))
    for (name, with_sync, without_sync), result in zip(cases, results):
        share, (low, high), verdict = communication_share(with_sync, without_sync)
        what = f"diagnose(...) on {PAIRS} pairs of steps ({name})"
        _expect_report(result, (share, (low, high), verdict), what, "share", (
            "each pair's share is (with - without) / with, the communication's part of that "
            "pair's whole step; the median of those shares (pair the steps: the load changes "
            "from pair to pair)",
            "the 90% interval of the median of the pair-by-pair shares "
            "(scaling.median_interval(shares)): not the minimum and maximum, which one odd pair "
            "moves, nor the spread of single pairs",
            f"one of {VERDICTS}: communication-bound only when the whole interval is above one "
            "half, compute-bound only when it is all below; otherwise the measurement cannot "
            "tell"))


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
