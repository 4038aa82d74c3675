"""Lesson 04's bucket-size measurement: time_ddp_steps records what it timed (ranks, cap, buckets
per step), and check_best_bucket_cap judges a reported cap against the sweep it was chosen from,
within its stated tolerance, so that a noisy machine never fails a choice its own data supports.

BUCKET_ALTERNATIVES are correct answers written differently from the solution (other statistics,
containers and number types); tests/checks/test_checks_alternatives.py lists them for the grader.
The wrong answers are lesson04.WRONG_ANSWERS (tests/checks/test_checks.py).
"""
import statistics

import numpy as np
import pytest
import torch

from course_lib import launch
from course_lib.checks import GradingError, lesson04, passed_line
from course_lib.topics.scaling import StepTiming, time_ddp_steps

pytestmark = pytest.mark.timeout(300)


def median_of_round_medians(sweep):
    """{cap: [its rounds' StepTimings]}, and the cap whose rounds' medians have the least median."""
    rounds = {}
    for timing in sweep:
        rounds.setdefault(timing.bucket_cap_mb, []).append(timing)
    medians = {cap: np.median([np.median(timing.seconds) for timing in timings])
               for cap, timings in rounds.items()}
    return rounds, np.float64(min(medians, key=medians.get))


def fewest_buckets_within_five_percent(sweep):
    """A tuple of the timings, and the largest cap (fewest buckets) within 5% of the fastest."""
    caps = sorted({timing.bucket_cap_mb for timing in sweep})
    medians = [np.median(np.concatenate([timing.seconds for timing in sweep
                                         if timing.bucket_cap_mb == cap])) for cap in caps]
    best = max(cap for cap, median in zip(caps, medians) if median <= 1.05 * min(medians))
    return tuple(sweep), torch.tensor(float(best))  # a 0-dim tensor


BUCKET_ALTERNATIVES = [
    pytest.param(median_of_round_medians(lesson04.recorded_bucket_sweep()), {},
                 id="a dict of each cap's rounds, the median of the rounds' medians, a numpy float"),
    pytest.param(fewest_buckets_within_five_percent(lesson04.recorded_bucket_sweep()), {},
                 id="a tuple, the fewest buckets within 5% of the fastest, a 0-dim tensor"),
]


@pytest.mark.parametrize("args, kwargs", BUCKET_ALTERNATIVES)
def test_an_alternative_correct_answer_passes(args, kwargs, capsys):
    lesson04.check_best_bucket_cap(*args, **kwargs)
    assert capsys.readouterr().out == passed_line(lesson04.check_best_bucket_cap.exercise) + "\n"


def pooled_medians(sweep):
    steps = {}
    for timing in sweep:
        steps.setdefault(timing.bucket_cap_mb, []).extend(timing.seconds)
    return {cap: statistics.median(seconds) for cap, seconds in steps.items()}


def test_a_cap_within_the_tolerance_of_the_fastest_passes_and_one_beyond_it_does_not(capsys):
    sweep = lesson04.recorded_bucket_sweep()
    medians = pooled_medians(sweep)
    assert min(medians, key=medians.get) == 25  # the recording's shape: 0.25 MiB within 10% ...
    assert medians[0.25] / medians[25] - 1 < 0.10 < medians[0.1] / medians[25] - 1  # 0.1 beyond
    lesson04.check_best_bucket_cap(sweep, 25)
    lesson04.check_best_bucket_cap(sweep, 0.25)  # a tie on a busy machine: accepted
    assert capsys.readouterr().out.count("passed") == 2
    with pytest.raises(GradingError, match=r"0.1 MiB, 25% slower than 25 MiB[\s\S]*one round only"):
        lesson04.check_best_bucket_cap(sweep, 0.1)  # the fastest of the first round, not overall


def test_a_key_that_is_not_its_timings_cap_is_named():
    sweep = lesson04.recorded_bucket_sweep()
    mislabelled = {cap: [t for t in sweep if t.bucket_cap_mb == 25] for cap in (0.01, 0.1, 1, 25)}
    with pytest.raises(GradingError, match=r"bucket_sweep\[0.01\][\s\S]*bucket_cap_mb=25"):
        lesson04.check_best_bucket_cap(mislabelled, 25)


def sweep_on_rank(caps):
    return [time_ddp_steps(32, hidden=64, hidden_layers=8, steps=4, warmup=3, bucket_cap_mb=cap)
            for _ in range(5) for cap in caps]


def test_a_sweep_measured_on_two_ranks_records_its_buckets_and_grades_its_fastest_cap(capsys):
    caps = [0.001, 0.01, 0.1, 25]
    sweep = launch(sweep_on_rank, caps, nprocs=2, backend="gloo", timeout=240, output="none")[0]
    assert {timing.world_size for timing in sweep} == {2}
    buckets = {timing.bucket_cap_mb: timing.buckets for timing in sweep}
    # 9 layers: a bucket closes once it holds the cap, so each bias rides with its layer's weight
    assert buckets[0.001] == 9 and buckets[25] == 1
    assert buckets[0.001] >= buckets[0.01] >= buckets[0.1] >= buckets[25]
    assert all(len(timing.seconds) == 4 and len(timing.warmup_seconds) == 3 for timing in sweep)
    medians = pooled_medians(sweep)
    lesson04.check_best_bucket_cap(sweep, min(medians, key=medians.get))
    assert capsys.readouterr().out == passed_line(lesson04.check_best_bucket_cap.exercise) + "\n"


def test_one_process_times_the_plain_model_and_counts_no_buckets():
    timing = time_ddp_steps(16, hidden=16, hidden_layers=2, steps=2, warmup=1, bucket_cap_mb=1)
    assert (timing.world_size, timing.bucket_cap_mb, timing.buckets) == (1, 1, None)
    assert len(timing.seconds) == 2 and timing.median > 0
