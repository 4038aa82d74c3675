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
