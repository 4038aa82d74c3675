"""Lesson 09's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import dataclasses
import itertools
import math
import statistics
import time

import numpy as np

from course_lib.checks import lesson09
from course_lib.topics.scaling import SpeedupPairs, median_interval
from course_lib.topics.timing import seal
from test_measured_graders import measured_answer, speedup_pairs

from . import answer, wrong_answer


def report_from_speedups(one_rank, ranks, world_size, kind):
    work = world_size if kind == "weak" else 1
    speedups = np.array(one_rank) * work / np.array(ranks)  # numpy: the interval of the speedup
    low, high = np.array(median_interval(speedups)) / world_size
    if low * world_size > 1:
        verdict = "faster than 1 rank"
    elif high * world_size < 1:
        verdict = "slower than 1 rank"
    else:
        verdict = "undecided"
    return np.median(speedups) / world_size, [low, high], verdict


def report_with_the_sign_test_by_hand(one_rank, ranks, world_size, kind):
    factor = (world_size if kind == "weak" else 1) / world_size
    efficiencies = sorted(factor * alone / many for alone, many in zip(one_rank, ranks))
    n, k, below = len(efficiencies), 0, 0.0
    while below + math.comb(n, k) / 2 ** n <= 0.05:  # the sign test's interval, by hand
        below += math.comb(n, k) / 2 ** n
        k += 1
    low, high = efficiencies[k - 1], efficiencies[n - k]
    verdicts = {(True, False): "faster than 1 rank", (False, True): "slower than 1 rank"}
    return (statistics.median(efficiencies), (low, high),
            verdicts.get((low > 1 / world_size, high < 1 / world_size), "undecided"))


def diagnose_with_its_own_interval(with_sync, without_sync):
    shares = sorted((synced - alone) / synced for synced, alone in zip(with_sync, without_sync))
    n, k, below = len(shares), 0, 0.0
    while below + math.comb(n, k) / 2 ** n <= 0.05:  # the sign test's interval, by hand
        below += math.comb(n, k) / 2 ** n
        k += 1
    low, high = shares[k - 1], shares[n - k]
    if low > 0.5:
        verdict = "communication-bound"
    elif high < 0.5:
        verdict = "compute-bound"
    else:
        verdict = "undecided"
    return statistics.median(shares), [low, high], verdict


def diagnose_with_arrays(with_sync, without_sync):
    from course_lib.topics.scaling import median_interval

    synced, alone = np.asarray(with_sync), np.asarray(without_sync)
    shares = 1 - alone / synced  # numpy floats, a numpy array of the two ends
    interval = np.array(median_interval(shares))
    verdicts = {(True, False): "communication-bound", (False, True): "compute-bound"}
    return np.median(shares), interval, verdicts.get((interval[0] > 0.5, interval[1] < 0.5),
                                                     "undecided")


def plan_by_decreasing_batch(global_batch_size, max_batch_size, world_size):
    per_rank, remainder = divmod(global_batch_size, world_size)
    if remainder:
        raise ValueError("the global batch does not split evenly over the ranks")
    for batch_size in range(min(max_batch_size, per_rank), 0, -1):
        if per_rank % batch_size == 0:
            return [batch_size, per_rank // batch_size]


def plan_from_divisors(global_batch_size, max_batch_size, world_size):
    if global_batch_size % world_size != 0:
        raise ValueError(f"{global_batch_size} does not divide by {world_size}")
    per_rank = global_batch_size // world_size
    steps = next(k for k in itertools.count(math.ceil(per_rank / max_batch_size))
                 if per_rank % k == 0)
    return np.int64(per_rank // steps), np.int64(steps)


ALTERNATIVES = {
    lesson09.check_scaling_efficiency: [  # real measurements, made when the test runs
        measured_answer("numpy speedups over N, a list", lambda: (speedup_pairs(),
                                                                  report_from_speedups)),
        measured_answer("the sign test by hand", lambda: (speedup_pairs(),
                                                          report_with_the_sign_test_by_hand)),
    ],
    lesson09.check_communication_share: [
        answer("the sign test's interval by hand, a list", diagnose_with_its_own_interval),
        answer("numpy arrays and the course's median_interval", diagnose_with_arrays),
    ],
    lesson09.check_accumulation_plan: [
        answer("decreasing batch sizes, a list", plan_by_decreasing_batch),
        answer("divisors from the ceiling, numpy ints", plan_from_divisors),
    ],
}


# Wrong answers

# Pairs as measure_speedup_pairs records them on a busy 2-core machine (strong scaling at about
# 1.4x, the load swinging from pair to pair), sealed as it seals them: a record made here.
LOADS = [1.0, 2.6, 1.3, 3.1, 1.1, 1.8, 2.2, 1.0, 3.8, 1.5, 1.2, 2.9, 1.6, 1.1, 2.4, 1.9]
RATIOS = [1.42, 1.35, 1.51, 1.28, 1.47, 0.61, 1.39, 1.44, 1.33, 1.52, 1.40, 1.37, 1.46, 1.30,
          1.43, 1.38]  # pair 5: a burst of load hit the 2-rank step


def recorded_pairs(scaling="strong", world_size=2, pairs=16, **fields):
    one_rank = [6e-3 * load for load in LOADS[:pairs]]
    measured = SpeedupPairs(one_rank, [t / ratio for t, ratio in zip(one_rank, RATIOS)],
                            world_size, scaling, batch_size=2048, steps_per_sample=5)
    now = (time.time(), time.perf_counter())
    measured.clock = ((now[0] - 5, now[1] - 5), now)
    measured.seal = seal(measured.facts())
    return dataclasses.replace(measured, **fields)


def _verdict_against(low, high, threshold):
    return ("faster than 1 rank" if low > threshold else "slower than 1 rank" if high < threshold
            else "undecided")


def _efficiencies(one_rank, ranks, world_size, kind):
    work = world_size if kind == "weak" else 1
    return [work * alone / many / world_size for alone, many in zip(one_rank, ranks)]


def _report(efficiencies, world_size, center=statistics.median, interval=median_interval):
    low, high = interval(efficiencies)
    return center(efficiencies), (low, high), _verdict_against(low, high, 1 / world_size)


def mean_of_the_ratios(one_rank, ranks, world_size, kind):
    return _report(_efficiencies(one_rank, ranks, world_size, kind), world_size,
                   center=statistics.mean)


def ratio_of_the_medians(one_rank, ranks, world_size, kind):
    work = world_size if kind == "weak" else 1
    efficiency = work * statistics.median(one_rank) / statistics.median(ranks) / world_size
    low, high = median_interval(_efficiencies(one_rank, ranks, world_size, kind))
    return efficiency, (low, high), _verdict_against(low, high, 1 / world_size)


def speedup_inverted(one_rank, ranks, world_size, kind):
    return _report(_efficiencies(ranks, one_rank, world_size, kind), world_size)


def world_size_left_out(one_rank, ranks, world_size, kind):
    speedups = [alone / many for alone, many in zip(one_rank, ranks)]  # neither N t1 nor / N
    low, high = median_interval(speedups)
    return statistics.median(speedups), (low, high), _verdict_against(low, high, 1)


def weak_scaling_without_n(one_rank, ranks, world_size, kind):
    return _report(_efficiencies(one_rank, ranks, world_size, "strong"), world_size)


def verdict_against_one(one_rank, ranks, world_size, kind):
    efficiency, (low, high), _ = _report(_efficiencies(one_rank, ranks, world_size, kind), world_size)
    return efficiency, (low, high), _verdict_against(low, high, 1.0)  # "efficiency above 100%"


def verdict_from_the_median_speedup(one_rank, ranks, world_size, kind):
    efficiency, interval, _ = _report(_efficiencies(one_rank, ranks, world_size, kind), world_size)
    return efficiency, interval, ("faster than 1 rank" if efficiency * world_size > 1
                                  else "slower than 1 rank")


def efficiency_min_and_max(one_rank, ranks, world_size, kind):
    return _report(_efficiencies(one_rank, ranks, world_size, kind), world_size,
                   interval=lambda values: (min(values), max(values)))


def the_librarys_report(one_rank, ranks, world_size, kind):
    from course_lib.topics import scaling

    return scaling.pairs_efficiency(one_rank, ranks, world_size, kind)


def report_stub(one_rank, ranks, world_size, kind):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


def _verdict(low, high):
    return ("communication-bound" if low > 0.5 else "compute-bound" if high < 0.5
            else "undecided")


def _shares(with_sync, without_sync):
    return [(synced - alone) / synced for synced, alone in zip(with_sync, without_sync)]


def share_of_the_compute(with_sync, without_sync):
    shares = [(synced - alone) / alone for synced, alone in zip(with_sync, without_sync)]
    low, high = median_interval(shares)
    return float(np.median(shares)), (low, high), _verdict(low, high)


def unpaired_medians(with_sync, without_sync):
    share = 1 - np.median(without_sync) / np.median(with_sync)
    slow_with, fast_with = median_interval(with_sync)
    slow_without, fast_without = median_interval(without_sync)
    low, high = 1 - fast_without / slow_with, 1 - slow_without / fast_with
    return share, (low, high), _verdict(low, high)


def verdict_from_the_median(with_sync, without_sync):
    shares = _shares(with_sync, without_sync)
    share = float(np.median(shares))
    return share, median_interval(shares), "communication-bound" if share > 0.5 else "compute-bound"


def min_and_max(with_sync, without_sync):
    shares = _shares(with_sync, without_sync)
    return float(np.median(shares)), (min(shares), max(shares)), _verdict(min(shares), max(shares))


def spread_of_single_pairs(with_sync, without_sync):
    shares = _shares(with_sync, without_sync)
    low, high = np.percentile(shares, [10, 90])
    return float(np.median(shares)), (low, high), _verdict(low, high)


def mean_share(with_sync, without_sync):
    shares = _shares(with_sync, without_sync)
    low, high = median_interval(shares)
    return float(np.mean(shares)), (low, high), _verdict(low, high)


def share_of_time_computing(with_sync, without_sync):
    shares = [alone / synced for synced, alone in zip(with_sync, without_sync)]
    low, high = median_interval(shares)
    return float(np.median(shares)), (low, high), _verdict(low, high)


def the_librarys_diagnosis(with_sync, without_sync):
    from course_lib.topics.scaling import communication_share

    return communication_share(with_sync, without_sync)


def diagnose_stub(with_sync, without_sync):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


def largest_batch_rounding_up(global_batch_size, max_batch_size, world_size):
    per_rank = global_batch_size // world_size
    batch_size = min(max_batch_size, per_rank)
    return batch_size, math.ceil(per_rank / batch_size)


def ignores_world_size(global_batch_size, max_batch_size, world_size):
    for steps in range(1, global_batch_size + 1):
        if global_batch_size % steps == 0 and global_batch_size // steps <= max_batch_size:
            return global_batch_size // steps, steps


def never_checks_even_split(global_batch_size, max_batch_size, world_size):
    per_rank = global_batch_size // world_size  # no check that the ranks share it evenly
    for steps in range(1, per_rank + 1):
        if per_rank % steps == 0 and per_rank // steps <= max_batch_size:
            return per_rank // steps, steps


def plan_stub(global_batch_size, max_batch_size, world_size):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


WRONG_ANSWERS = {
    lesson09.check_scaling_efficiency: [
        wrong_answer("the mean of the pairs' efficiencies", recorded_pairs(), mean_of_the_ratios),
        wrong_answer("the ratio of the two lists' medians, unpaired", recorded_pairs(),
                     ratio_of_the_medians),
        wrong_answer("speedup tN / t1, upside down", recorded_pairs(), speedup_inverted),
        wrong_answer("the world size left out: the speedup reported as the efficiency",
                     recorded_pairs(), world_size_left_out),
        wrong_answer("weak scaling's N times the samples left out", recorded_pairs(),
                     weak_scaling_without_n),
        wrong_answer("faster only when the efficiency is above 1, not 1 / N", recorded_pairs(),
                     verdict_against_one),
        wrong_answer("a verdict from the median alone, where the interval straddles 1 / N",
                     recorded_pairs(), verdict_from_the_median_speedup),
        wrong_answer("the minimum and maximum for the interval", recorded_pairs(),
                     efficiency_min_and_max),
        wrong_answer("calls the library's pairs_efficiency", recorded_pairs(), the_librarys_report),
        wrong_answer("the unfinished stub", recorded_pairs(), report_stub),
        wrong_answer("the pairs typed in, not measured",
                     SpeedupPairs(*dataclasses.astuple(recorded_pairs())[:6]), report_from_speedups),
        wrong_answer("the measured pairs converted to milliseconds",
                     recorded_pairs(one_rank=[t * 1e3 for t in recorded_pairs().one_rank],
                                    ranks=[t * 1e3 for t in recorded_pairs().ranks]),
                     report_from_speedups),
        wrong_answer("the pairs' lists passed as a dict", vars(recorded_pairs()),
                     report_from_speedups),
        wrong_answer("pairs of weak scaling, where the exercise measures strong",
                     recorded_pairs("weak"), report_from_speedups),
        wrong_answer("2 ranks on a machine of 1 core: oversubscribed", recorded_pairs(),
                     report_from_speedups, cores=1),
        wrong_answer("8 pairs: too few for the median's interval", recorded_pairs(pairs=8),
                     report_from_speedups),
    ],
    lesson09.check_communication_share: [
        wrong_answer("the communication as a share of the compute, not of the step",
                     share_of_the_compute),
        wrong_answer("unpaired: the two lists' medians and percentiles taken apart",
                     unpaired_medians),
        wrong_answer("a verdict from the median alone, never undecided", verdict_from_the_median),
        wrong_answer("the minimum and maximum for the interval", min_and_max),
        wrong_answer("the 10th-90th percentiles of single pairs for the median's interval",
                     spread_of_single_pairs),
        wrong_answer("the mean share, where the check asks for the median", mean_share),
        wrong_answer("the share of the step spent computing", share_of_time_computing),
        wrong_answer("calls the library's communication_share", the_librarys_diagnosis),
        wrong_answer("the unfinished stub", diagnose_stub),
    ],
    lesson09.check_accumulation_plan: [
        wrong_answer("takes the largest micro-batch and rounds the steps up",
                     largest_batch_rounding_up),
        wrong_answer("forgets the world size", ignores_world_size),
        wrong_answer("never checks that the ranks share the batch evenly",
                     never_checks_even_split),
        wrong_answer("the unfinished stub", plan_stub),
    ],
}
