"""Lesson 09's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import itertools
import math
import statistics

import numpy as np

from course_lib.checks import lesson09
from course_lib.runtime.shared.env import cpu_cores
from course_lib.topics.scaling import median_interval
from test_measured_graders import measured_answer, strong_runs

from . import answer, wrong_answer


def scaling_report_with_numpy():
    runs = strong_runs()
    medians = {n: np.median(values) for n, values in runs.items()}  # numpy floats
    cores = cpu_cores()
    report = {n: [medians[1] / t, medians[1] / t / n, np.bool_(n > cores)]
              for n, t in medians.items()}
    best = max((n for n in report if not report[n][2]), key=lambda n: report[n][0])
    return runs, report, best


def scaling_report_from_throughputs():
    runs, cores = strong_runs(), cpu_cores()
    samples_per_second = {n: 1 / statistics.median(values) for n, values in runs.items()}
    report = {}
    for n in sorted(runs):
        speedup = samples_per_second[n] / samples_per_second[1]
        report[n] = (speedup, speedup / n, n > cores)
    trusted = {n: report[n][0] for n in report if n <= cores}
    return runs, report, sorted(trusted, key=trusted.get)[-1]


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
        measured_answer("numpy medians and bools, lists", scaling_report_with_numpy),
        measured_answer("from throughputs, the best by sorting", scaling_report_from_throughputs),
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

# Strong scaling as measure_scaling recorded it on a busy 2-core machine: three runs per world
# size, and 4 ranks (oversubscribed there) faster than 2 in two runs, as neighbours make happen.
RECORDED_RUNS = {1: [17.9e-3, 12.0e-3, 10.2e-3], 2: [8.2e-3, 7.9e-3, 8.7e-3],
                 4: [6.5e-3, 11.9e-3, 5.9e-3]}


def reference_report(runs=RECORDED_RUNS, cores=2):
    """(runs, report, best_world_size), right for `runs`: each wrong answer below changes one."""
    medians = {n: statistics.median(values) for n, values in runs.items()}
    report = {n: (medians[1] / t, medians[1] / t / n, n > cores) for n, t in medians.items()}
    best = max((n for n in medians if n <= cores), key=lambda n: medians[1] / medians[n])
    return runs, report, best


def with_report(change):
    runs, report, best = reference_report()
    return runs, {n: change(n, *entry) for n, entry in report.items()}, best


def mean_of_runs():
    means = {n: sum(values) / len(values) for n, values in RECORDED_RUNS.items()}
    report = {n: (means[1] / t, means[1] / t / n, n > 2) for n, t in means.items()}
    return RECORDED_RUNS, report, 2


def best_including_oversubscribed():
    runs, report, _ = reference_report()
    return runs, report, 4


def speedup_upside_down():
    return with_report(lambda n, speedup, efficiency, flag: (1 / speedup, 1 / speedup / n, flag))


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
        wrong_answer("speedup tN / t1, upside down", *speedup_upside_down(), cores=2),
        wrong_answer("efficiency not divided by N",
                     *with_report(lambda n, speedup, efficiency, flag: (speedup, speedup, flag)),
                     cores=2),
        wrong_answer("flags no world size as oversubscribed",
                     *with_report(lambda n, speedup, efficiency, flag: (speedup, efficiency,
                                                                        False)), cores=2),
        wrong_answer("means of the runs, where the check asks for medians", *mean_of_runs(),
                     cores=2),
        wrong_answer("picks the oversubscribed 4 ranks because they looked fastest",
                     *best_including_oversubscribed(), cores=2),
        wrong_answer("a report of made-up times, not the recorded runs",
                     {1: [0.01], 2: [0.005]}, reference_report()[1], 2, cores=2),
        wrong_answer("made up: {1: [1], 2: [.5], 4: [.25]}, reported right",
                     *reference_report({1: [1], 2: [.5], 4: [.25]}), cores=2),
        wrong_answer("wrong unit: the runs in milliseconds, reported right",
                     *reference_report({n: [t * 1e3 for t in runs]
                                        for n, runs in RECORDED_RUNS.items()}), cores=2),
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
