"""Lesson 12's health check: the course's reference (cost_model.all_reduce_health, which the
lesson's measurement cell runs) on 2 and 3 gloo ranks, and the grader's slow rank as its ranks
see it (checks/lesson12/ranks.py): the delay reaches the slowest rank's times, not the others'."""
import pytest

from course_lib import launch
from course_lib.checks.lesson12.ranks import watched_health_check
from course_lib.topics import cost_model

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.filterwarnings(r"ignore:\d+ ranks on \d+ CPU cores:RuntimeWarning")]

SIZES = [2**12, 2**16, 2**18]


def _health(sizes):
    link = cost_model.measure_ring_link(max(sizes), repeats=3, warmup=1)
    return link, [cost_model.all_reduce_health(sizes, expected, repeats=3, warmup=1)
                  for expected in (1.0, 1e15)]


@pytest.mark.parametrize("nprocs", [2, 3])
def test_the_course_health_check_follows_its_own_times(nprocs):
    link, (low, high) = launch(_health, SIZES, nprocs=nprocs, backend="gloo", timeout=120,
                               output="none")[0]
    assert link > 0
    assert (low["healthy"], high["healthy"]) == (True, False)  # 1 B/s and 1 PB/s expected
    for result in (low, high):
        assert [row["nbytes"] for row in result["rows"]] == SIZES
        for row in result["rows"]:
            assert len(row["times"]) == 3 and min(row["times"]) <= row["seconds"] <= max(row["times"])
            assert row["algorithm_bandwidth"] == row["nbytes"] / row["seconds"]
            assert row["bus_bandwidth"] == pytest.approx(
                row["algorithm_bandwidth"] * 2 * (nprocs - 1) / nprocs, rel=1e-12)
        assert result["best_bus_bandwidth"] == max(row["bus_bandwidth"] for row in result["rows"])


def _reference(sizes, expected):
    return cost_model.all_reduce_health(sizes, expected, repeats=3, warmup=1)


def test_the_slow_rank_delays_only_its_own_clock_when_the_ranks_line_up():
    delay = 0.05
    outcomes = launch(watched_health_check, _reference, [2**14], 1.0, 1, delay, nprocs=2,
                      backend="gloo", timeout=120, output="none")
    timed = [[seconds for nbytes, seconds in outcome["calls"] if nbytes == 2**14][-3:]
             for outcome in outcomes]
    assert min(timed[1]) >= delay and sorted(timed[0])[1] < delay / 2  # the barrier lined them up
    assert outcomes[0]["library"] == ["all_reduce_health"]          # the call watch sees it
    assert min(outcomes[0]["result"]["rows"][0]["times"]) >= delay  # the slowest rank's times
