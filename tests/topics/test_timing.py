"""Timing helpers: drop_stderr_lines holds back the profiler's C++ log lines, and only those."""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from course_lib.topics.timing import drop_stderr_lines, time_it


def test_drop_stderr_lines_drops_the_prefix_and_passes_the_rest(capfd):
    with drop_stderr_lines("USDT:"):
        os.write(2, b"USDT: a log line\n")
        os.write(2, b"a line that stays\n")
        print("stdout is untouched")
    sys.stderr.flush()
    out, err = capfd.readouterr()
    assert "stdout is untouched" in out
    assert "a line that stays" in err and "USDT" not in err


def test_the_profiler_leaves_no_usdt_lines(capfd):
    with drop_stderr_lines("USDT:"), profile(activities=[ProfilerActivity.CPU]):
        torch.ones(4).sum()
    assert "USDT" not in capfd.readouterr().err


def test_drop_stderr_lines_restores_stderr_after_an_exception(capfd):
    try:
        with drop_stderr_lines():
            raise RuntimeError("inside")
    except RuntimeError:
        pass
    os.write(2, b"USDT: after the block\n")
    assert "USDT: after the block" in capfd.readouterr().err


def test_time_it_keeps_warmup_apart():
    timing = time_it(lambda: None, repeats=4, warmup=2)
    assert len(timing.seconds) == 4 and len(timing.warmup_seconds) == 2


def test_interruption_counts_sees_a_garbage_collection_and_never_goes_back():
    import gc

    from course_lib.topics.timing import interruption_counts

    switches, collections = interruption_counts()
    gc.collect()
    later_switches, later_collections = interruption_counts()
    assert later_collections > collections
    assert later_switches >= switches >= 0


def test_uninterrupted_seconds_leaves_out_the_repeats_the_os_switched_out(monkeypatch):
    from course_lib.topics import timing

    calls, switches = [], iter([0, 0, 0, 1, 1, 1])  # read before and after each of 3 repeats
    monkeypatch.setattr(timing, "interruption_counts", lambda: (next(switches), 0))
    kept = timing.uninterrupted_seconds(lambda: calls.append(1), repeats=3, warmup=2)
    assert len(calls) == 5  # 2 warm-up calls, 3 timed
    assert len(kept) == 2 and all(seconds >= 0 for seconds in kept)  # the second was switched out


def test_describe_us_gives_the_median_and_the_deciles_within_the_values():
    from course_lib.topics.timing import describe_us

    assert describe_us([]) == "none"
    assert describe_us([5.0]) == "median 5 µs (p10 5, p90 5)"
    assert describe_us([float(us) for us in range(1, 12)]) == "median 6 µs (p10 2, p90 10)"
