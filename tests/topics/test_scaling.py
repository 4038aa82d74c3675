"""course_lib.topics.scaling: speedup and efficiency, Amdahl's law and its fit, the step-time model,
batch plans, spreads and the median's interval, the communication share's verdict, the published
sweeps, and timing real steps on 1 and 2 ranks (twins, pairs, with and without the all-reduce)."""
import dataclasses
import math

import numpy as np
import pytest

from course_lib.topics.cost_model import (PUBLISHED_ALL_REDUCE, bus_bandwidth, fit_alpha_beta,
                                          published_seconds, ring_all_reduce_time)
from course_lib.topics.scaling import (accumulation_plan, all_reduce_seconds, amdahl_speedup,
                                       communication_share, efficiency, fit_amdahl,
                                       measure_scaling, measure_speedup_pairs, measure_step_seconds,
                                       measure_sync_cost, median_interval, median_of_runs,
                                       paired_ratios, pairs_efficiency, predict_step_seconds,
                                       speedup, spread)
from course_lib.topics.timing import Timing


def test_strong_scaling_speedup_is_t1_over_tn():
    step_seconds = {1: 0.8, 2: 0.5, 4: 0.2}
    assert speedup(step_seconds) == pytest.approx({1: 1.0, 2: 1.6, 4: 4.0})
    assert efficiency(step_seconds) == pytest.approx({1: 1.0, 2: 0.8, 4: 1.0})


def test_weak_scaling_counts_n_times_the_work():
    step_seconds = {1: 0.1, 2: 0.1, 4: 0.125}
    assert speedup(step_seconds, "weak") == pytest.approx({1: 1.0, 2: 2.0, 4: 3.2})
    assert efficiency(step_seconds, "weak") == pytest.approx({1: 1.0, 2: 1.0, 4: 0.8})


def test_speedup_needs_one_rank_and_a_known_scaling():
    with pytest.raises(ValueError, match="needs the key 1"):
        speedup({2: 0.1, 4: 0.05})
    with pytest.raises(ValueError, match="not one of"):
        speedup({1: 0.1}, "linear")


def test_amdahl_speedup_limits():
    assert amdahl_speedup(0.0, 8) == pytest.approx(8.0)
    assert amdahl_speedup(1.0, 8) == pytest.approx(1.0)
    assert amdahl_speedup(0.1, 1) == pytest.approx(1.0)
    assert amdahl_speedup(0.05, 1e9) == pytest.approx(20.0, rel=1e-6)  # the ceiling 1 / s
    assert list(amdahl_speedup(0.5, [1, 2])) == pytest.approx([1.0, 4 / 3])


@pytest.mark.parametrize("serial_fraction", [0.0, 0.03, 0.25, 0.9])
def test_fit_amdahl_recovers_the_serial_fraction(serial_fraction):
    world_sizes = [1, 2, 4, 8, 64]
    speedups = amdahl_speedup(serial_fraction, world_sizes)
    assert fit_amdahl(world_sizes, speedups) == pytest.approx(serial_fraction, abs=1e-12)


def test_fit_amdahl_is_the_least_squares_of_the_line_and_explains_no_slowdown():
    world_sizes, speedups = [1, 2, 4, 8], [1.0, 1.9, 3.3, 5.6]
    x = [1 - 1 / n for n in world_sizes]
    y = [1 / s - 1 / n for n, s in zip(world_sizes, speedups)]
    expected = sum(a * b for a, b in zip(x, y)) / sum(a * a for a in x)
    assert fit_amdahl(world_sizes, speedups) == pytest.approx(expected)
    assert fit_amdahl([1, 2], [1.0, 0.5]) > 1  # a slowdown: no serial fraction explains it


@pytest.mark.parametrize("world_sizes, speedups, message", [
    ([1, 2], [1.0], "one speedup per world size"),
    ([1, 1], [1.0, 1.0], "more than 1 rank"),
    ([1, 2], [1.0, 0.0], "positive"),
])
def test_fit_amdahl_rejects_bad_input(world_sizes, speedups, message):
    with pytest.raises(ValueError, match=message):
        fit_amdahl(world_sizes, speedups)


def test_all_reduce_seconds_is_the_ring_of_the_gradient_bytes():
    alpha, beta = 10e-6, 1 / 50e9
    assert all_reduce_seconds(1000, 8, alpha, beta) == ring_all_reduce_time(4000, 8, alpha, beta)
    assert all_reduce_seconds(1000, 8, alpha, beta, bytes_per_parameter=2) == \
        ring_all_reduce_time(2000, 8, alpha, beta)
    assert all_reduce_seconds(1000, 1, alpha, beta) == 0.0


def test_predict_step_seconds_splits_compute_only_under_strong_scaling():
    alpha, beta, n_parameters = 10e-6, 1 / 50e9, 1_000_000
    communication = all_reduce_seconds(n_parameters, 4, alpha, beta)
    assert predict_step_seconds(0.4, n_parameters, 4, alpha, beta) == \
        pytest.approx(0.1 + communication)
    assert predict_step_seconds(0.4, n_parameters, 4, alpha, beta, scaling="weak",
                                serial_seconds=0.01) == pytest.approx(0.41 + communication)
    assert predict_step_seconds(0.4, n_parameters, 1, alpha, beta) == pytest.approx(0.4)


@pytest.mark.parametrize("global_batch_size, max_batch_size, world_size, plan", [
    (1024, 64, 1, (64, 16)), (1024, 64, 8, (64, 2)), (1024, 64, 64, (16, 1)),
    (1024, 48, 2, (32, 16)), (1000, 64, 8, (25, 5)), (7, 1, 1, (1, 7)),
])
def test_accumulation_plan_takes_the_fewest_micro_batches_that_fit(
        global_batch_size, max_batch_size, world_size, plan):
    batch_size, grad_accum_steps = accumulation_plan(global_batch_size, max_batch_size, world_size)
    assert (batch_size, grad_accum_steps) == plan
    assert batch_size * grad_accum_steps * world_size == global_batch_size


@pytest.mark.parametrize("args, message", [
    ((1000, 64, 16), "cannot be split evenly"),
    ((0, 64, 1), "global_batch_size=0"),
    ((64, 0, 1), "max_batch_size=0"),
])
def test_accumulation_plan_rejects_impossible_plans(args, message):
    with pytest.raises(ValueError, match=message):
        accumulation_plan(*args)


@pytest.mark.filterwarnings(r"ignore:\d+ ranks on \d+ CPU cores:RuntimeWarning")
@pytest.mark.parametrize("world_size", [1, 2])
def test_measure_step_seconds_times_warm_steps_of_the_slowest_rank(world_size):
    timing = measure_step_seconds(world_size, batch_size=16, steps=4, warmup=2, backend="gloo",
                                  timeout=60)
    assert isinstance(timing, Timing)
    assert len(timing.seconds) == 4 and len(timing.warmup_seconds) == 2
    assert all(0 < seconds < 10 for seconds in timing.seconds)


@pytest.mark.filterwarnings(r"ignore:\d+ ranks on \d+ CPU cores:RuntimeWarning")
def test_measure_scaling_gives_one_median_per_run_and_world_size():
    medians = measure_scaling([1, 2], batch_size=32, scaling="strong", runs=2, steps=3, warmup=1,
                              backend="gloo", timeout=60)
    assert sorted(medians) == [1, 2] and all(len(runs) == 2 for runs in medians.values())
    assert all(math.isfinite(value) and value > 0 for runs in medians.values() for value in runs)
    assert median_of_runs({1: [3.0, 1.0, 2.0]}) == {1: 2.0}
    with pytest.raises(ValueError, match="divisible by every world size"):
        measure_scaling([1, 3], batch_size=32, steps=1)


def test_spread_and_paired_ratios():
    assert spread([4.0, 1.0, 3.0, 2.0, 5.0], (0, 100)) == (3.0, 1.0, 5.0)
    assert spread(list(range(11))) == pytest.approx((5.0, 1.0, 9.0))  # numpy's linear percentiles
    runs = {1: [0.8, 1.0], 2: [0.5, 0.4]}
    assert paired_ratios(runs, 2) == pytest.approx([1.6, 2.5])  # run i against run i
    assert paired_ratios(runs, 2, "weak") == pytest.approx([3.2, 5.0])


def test_median_interval_is_the_sign_test_interval_and_covers_the_median():
    assert median_interval(range(1, 17)) == (5.0, 12.0)  # P(Bin(16, 1/2) <= 4) = 0.038 <= 0.05
    assert median_interval(range(1, 6)) == (1.0, 5.0)
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0, 6.0, 7.0], 0.5) == (3.0, 5.0)
    generator = np.random.default_rng(0)
    covered = [low <= 1.0 <= high for low, high in
               (median_interval(generator.lognormal(0, 1, 16)) for _ in range(2000))]
    assert 0.88 <= np.mean(covered) <= 0.96  # 92.3% for 16 values, whatever the distribution
    with pytest.raises(ValueError, match="too few"):
        median_interval([1.0, 2.0, 3.0])


@pytest.mark.parametrize("shares, verdict", [
    ([0.6, 0.7, 0.8, 0.75, 0.65, 0.9], "communication-bound"),
    ([0.1, 0.2, 0.15, 0.3, 0.05, 0.25], "compute-bound"),
    ([0.6, 0.7, 0.8, 0.75, 0.65, 0.45], "undecided"),  # one pair below one half: not sure
])
def test_communication_share_decides_only_when_the_interval_is_on_one_side(shares, verdict):
    without = [1e-3 * (k + 1) for k in range(len(shares))]  # the load changes from pair to pair
    with_sync = [alone / (1 - share) for alone, share in zip(without, shares)]
    share, (low, high), got = communication_share(with_sync, without)
    assert share == pytest.approx(np.median(shares))
    assert (low, high) == pytest.approx(median_interval(shares))  # 6 pairs: the min and the max
    assert got == verdict


@pytest.mark.parametrize("speedups, world_size, kind, verdict", [
    ([1.3, 1.5, 1.4, 1.6, 1.2, 1.45], 2, "strong", "faster than 1 rank"),  # efficiency above 1/2
    ([0.65, 0.75, 0.7, 0.8, 0.6, 0.72], 2, "weak", "faster than 1 rank"),  # 2 t1 / tN above 1
    ([0.8, 1.2, 0.9, 1.1, 1.3, 0.7], 4, "strong", "undecided"),  # the interval straddles 1/4
    ([0.3, 0.35, 0.25, 0.4, 0.3, 0.2], 2, "strong", "slower than 1 rank"),
])
def test_pairs_efficiency_compares_the_median_interval_with_one_over_n(speedups, world_size, kind,
                                                                       verdict):
    one_rank = [1e-3 * (k + 1) for k in range(len(speedups))]  # the load changes from pair to pair
    ranks = [alone / ratio for alone, ratio in zip(one_rank, speedups)]  # ratio: t1 / tN
    work = world_size if kind == "weak" else 1
    efficiencies = [work * ratio / world_size for ratio in speedups]
    efficiency, (low, high), got = pairs_efficiency(one_rank, ranks, world_size, kind)
    assert efficiency == pytest.approx(np.median(efficiencies))
    assert (low, high) == pytest.approx(median_interval(efficiencies))  # 6 pairs: min and max
    assert got == verdict


def test_the_published_sweeps_fit_the_ring_model_within_a_factor_of_two():
    for cluster, sweep in PUBLISHED_ALL_REDUCE.items():
        sizes, seconds = published_seconds(cluster)
        assert bus_bandwidth(sizes[-1], seconds[-1], sweep["world_size"]) == pytest.approx(
            sweep["points"][-1][1] * 1e9)  # nccl-tests' bus bandwidth, read back
        alpha, beta = fit_alpha_beta(sizes, seconds, world_size=sweep["world_size"])
        assert 0 < alpha < 1e-4 and 1e11 < 1 / beta < 1e12  # microseconds; hundreds of GB/s
        for nbytes, published in zip(sizes, seconds):
            modelled = ring_all_reduce_time(nbytes, sweep["world_size"], alpha, beta)
            assert 0.45 < modelled / published < 2.2


@pytest.mark.filterwarnings(r"ignore:\d+ ranks on \d+ CPU cores:RuntimeWarning")
def test_twins_train_alone_and_pairs_and_sync_costs_come_back_per_pair():
    twins = measure_step_seconds(1, batch_size=16, steps=3, warmup=1, backend="gloo", timeout=60,
                                 twins=2)
    assert twins.world_size == 2 and not twins.ddp and twins.buckets is None  # no DDP, no all-reduce
    pairs = measure_speedup_pairs(2, 32, "weak", pairs=4, backend="gloo", timeout=60)
    assert len(pairs.one_rank) == len(pairs.ranks) == 4 and pairs.scaling == "weak"
    assert pairs.speedups() == pytest.approx([2 * a / b for a, b in zip(pairs.one_rank, pairs.ranks)])
    assert pairs.recorded_here() and (pairs.batch_size, pairs.steps_per_sample) == (32, 2)
    assert not dataclasses.replace(pairs, ranks=pairs.ranks[::-1]).recorded_here()  # changed since
    cost = measure_sync_cost(2, 16, pairs=6, backend="gloo", timeout=60)
    assert len(cost.with_sync) == len(cost.without_sync) == 6
    # the course model's step is mostly its all-reduce's latency: with it, a step takes longer
    assert np.median(cost.with_sync) > np.median(cost.without_sync)
