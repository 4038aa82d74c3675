"""Lesson 04's bucket-size measurement: time_ddp_steps records what it timed (ranks, cap, buckets
per step); check_best_bucket_cap re-measures two caps on this machine and requires the sweep's
figures inside checks/engine/remeasure.py's band (made-up figures and wrong units fall out), then
judges the reported cap against the sweep it was chosen from, within its stated tolerance, so that
a noisy machine never fails a choice its own data supports.

The recorded sweep, the correct answers written differently from the solution and the wrong
answers are in answers/lesson04.py (test_checks_alternatives.py and test_checks.py run them).
"""
import pytest

from answers.lesson04 import made_up_bucket_sweep, pooled_medians, recorded_bucket_sweep
from course_lib import launch
from course_lib.checks.engine import GradingError, passed_line
from course_lib.checks.lesson04 import buckets as lesson04
from course_lib.checks.engine.remeasure import expect_like_this_machine
from course_lib.topics.scaling import time_ddp_steps

pytestmark = pytest.mark.timeout(300)


def test_a_cap_within_the_tolerance_of_the_fastest_passes_and_one_beyond_it_does_not(capsys):
    sweep = recorded_bucket_sweep()
    medians = pooled_medians(sweep)
    assert min(medians, key=medians.get) == 25  # the recording's shape: 0.25 MiB within 10% ...
    assert medians[0.25] / medians[25] - 1 < 0.10 < medians[0.1] / medians[25] - 1  # 0.1 beyond
    lesson04.check_best_bucket_cap(sweep, 25)
    lesson04.check_best_bucket_cap(sweep, 0.25)  # a tie on a busy machine: accepted
    assert capsys.readouterr().out.count("passed") == 2
    with pytest.raises(GradingError, match=r"0.1 MiB, 25% slower than 25 MiB[\s\S]*one round only"):
        lesson04.check_best_bucket_cap(sweep, 0.1)  # the fastest of the first round, not overall


def test_a_key_that_is_not_its_timings_cap_is_named():
    sweep = recorded_bucket_sweep()
    mislabelled = {cap: [t for t in sweep if t.bucket_cap_mb == 25] for cap in (0.01, 0.1, 1, 25)}
    with pytest.raises(GradingError, match=r"bucket_sweep\[0.01\][\s\S]*bucket_cap_mb=25"):
        lesson04.check_best_bucket_cap(mislabelled, 25)


def sweep_on_rank(caps):
    return [time_ddp_steps(bucket_cap_mb=cap, **lesson04.BUCKET_STEPS)
            for _ in range(3) for cap in caps]


def test_a_sweep_measured_on_two_ranks_records_its_buckets_and_grades_its_fastest_cap(capsys):
    # the exercise's own configuration, measured now: the grader re-measures two of its caps and
    # must find this machine's figures in its band, however loaded the machine is
    caps = [0.01, 0.05, 0.25, 25]
    sweep = launch(sweep_on_rank, caps, nprocs=2, backend="gloo", timeout=240, output="none")[0]
    assert {timing.world_size for timing in sweep} == {2}
    buckets = {timing.bucket_cap_mb: timing.buckets for timing in sweep}
    # 49 layers: a bucket closes once it holds the cap, so each bias rides with its layer's weight
    assert buckets[0.01] >= lesson04.MIN_BUCKETS and buckets[25] == 1
    assert buckets[0.01] >= buckets[0.05] >= buckets[0.25] >= buckets[25]
    assert all(len(timing.seconds) == 8 and len(timing.warmup_seconds) == 3 for timing in sweep)
    medians = pooled_medians(sweep)
    lesson04.check_best_bucket_cap(sweep, min(medians, key=medians.get))
    assert capsys.readouterr().out == passed_line(lesson04.check_best_bucket_cap.exercise) + "\n"


@pytest.mark.parametrize("factor, words", [(1e3, "milliseconds"), (1e6, "microseconds"),
                                           (1e-3, "1,000 times less"), (1 / 40, "faster than the "
                                                                            "fastest step"),
                                           (100, "slower than this machine")])
def test_the_band_rejects_wrong_units_and_figures_this_machine_cannot_produce(factor, words):
    machine = [0.020, 0.022, 0.025, 0.030, 0.050]  # seconds: fastest 20 ms, median 25 ms
    with pytest.raises(GradingError, match=words):
        expect_like_this_machine([factor * seconds for seconds in machine], machine, "steps")


@pytest.mark.parametrize("factor", [1 / 4.5, 1, 3, 25])
def test_the_band_accepts_a_real_measurement_under_other_load(factor):
    # 4.5x faster than the grader's median (the grader's run was loaded), 25x slower (the
    # learner's was): both inside the band, AT_MOST_FASTER and AT_MOST_SLOWER
    machine = [0.020, 0.022, 0.025, 0.030, 0.050]
    expect_like_this_machine([factor * 0.025] * 5, machine, "steps")


def test_a_made_up_sweep_and_one_in_milliseconds_are_rejected_against_this_machine():
    with pytest.raises(GradingError, match="faster than the fastest step this machine runs"):
        lesson04.check_best_bucket_cap(made_up_bucket_sweep(), 25)
    with pytest.raises(GradingError, match="milliseconds"):
        lesson04.check_best_bucket_cap(recorded_bucket_sweep(unit=1e3), 25)


def test_one_process_times_the_plain_model_and_counts_no_buckets():
    timing = time_ddp_steps(16, hidden=16, hidden_layers=2, steps=2, warmup=1, bucket_cap_mb=1)
    assert (timing.world_size, timing.bucket_cap_mb, timing.buckets) == (1, 1, None)
    assert len(timing.seconds) == 2 and timing.median > 0


def test_the_grader_re_measures_the_configuration_the_notebook_sweeps():
    import ast
    import json
    from pathlib import Path

    notebook = json.loads((Path(__file__).parents[2] / "solutions" / "04_ddp_flow.ipynb").read_text())
    source = "".join("".join(cell["source"]) for cell in notebook["cells"]
                     if "BUCKET_STEPS = dict(" in "".join(cell["source"]))
    line = next(line for line in source.splitlines() if line.startswith("BUCKET_STEPS = dict("))
    call = ast.parse(line).body[0].value
    assert {k.arg: ast.literal_eval(k.value) for k in call.keywords} == lesson04.BUCKET_STEPS
