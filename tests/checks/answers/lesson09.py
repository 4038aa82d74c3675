"""Lesson 09's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import itertools
import math
import statistics

import numpy as np

from course_lib.checks import lesson09
from course_lib.runtime.shared.env import cpu_cores
from course_lib.topics.cost_model import naive_all_reduce_time, ring_all_reduce_time
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


def all_reduce_seconds_from_the_cost_model(n_parameters, world_size, alpha, beta,
                                           bytes_per_parameter=4):
    from course_lib.topics.cost_model import ring_all_reduce_time

    return ring_all_reduce_time(n_parameters * bytes_per_parameter, world_size, alpha, beta)


def all_reduce_seconds_per_step(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    steps = 2 * (world_size - 1)
    chunk_bytes = n_parameters * bytes_per_parameter / world_size
    return np.float64(steps * (alpha + chunk_bytes * beta))


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
    lesson09.check_all_reduce_seconds: [
        answer("the course's cost model", all_reduce_seconds_from_the_cost_model),
        answer("per ring step, a numpy float", all_reduce_seconds_per_step),
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


def parameters_as_bytes(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    return ring_all_reduce_time(n_parameters, world_size, alpha, beta)


def through_rank_zero(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    return naive_all_reduce_time(n_parameters * bytes_per_parameter, world_size, alpha, beta)


def reduce_scatter_half_only(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    nbytes = n_parameters * bytes_per_parameter
    return (world_size - 1) * alpha + (world_size - 1) / world_size * nbytes * beta


def always_fp32(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    return ring_all_reduce_time(n_parameters * 4, world_size, alpha, beta)


def all_reduce_stub(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
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
    lesson09.check_all_reduce_seconds: [
        wrong_answer("counts parameters as bytes", parameters_as_bytes),
        wrong_answer("all through rank 0 (naive all-reduce)", through_rank_zero),
        wrong_answer("counts only the reduce-scatter half of the ring",
                     reduce_scatter_half_only),
        wrong_answer("assumes fp32 gradients whatever bytes_per_parameter says", always_fp32),
        wrong_answer("the unfinished stub", all_reduce_stub),
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
