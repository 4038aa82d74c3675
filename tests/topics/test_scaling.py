"""course_lib.topics.scaling: speedup and efficiency, Amdahl's law and its fit, the step-time model,
batch plans, and timing real steps on 1 and 2 ranks."""
import math

import pytest

from course_lib.topics.cost_model import ring_all_reduce_time
from course_lib.topics.scaling import (accumulation_plan, all_reduce_seconds, amdahl_speedup, efficiency,
                                fit_amdahl, measure_scaling, measure_step_seconds,
                                median_of_runs, predict_step_seconds, speedup)
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
