"""Timing a piece of work honestly: warm up first, wait for the GPU, report the median.

CUDA kernels run asynchronously: without a synchronisation the clock only measures their launch.
"""
import contextlib
import gc
import hashlib
import hmac
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import numpy as np
import torch


# Records: what the course's measuring helpers return keeps its raw timings, the clocks read at its
# start and end, and a seal, so that a grader can tell a measurement from numbers typed in. The key
# is this process's, passed to the ranks it starts through the environment (fork or spawn alike).
_SEAL_KEY = os.environ.setdefault("COURSE_LIB_RECORD_KEY", os.urandom(16).hex()).encode()


def clock_now() -> tuple:
    """(time.time(), time.perf_counter()) read together: a record's clock at its start or end."""
    return time.time(), time.perf_counter()


def seal(facts) -> str:
    """The seal of a record's raw facts (any repr-able value), made with this session's key."""
    return hmac.new(_SEAL_KEY, repr(facts).encode(), hashlib.sha256).hexdigest()


def sealed_here(record, facts) -> bool:
    """Whether `record.seal` was made in this session (this kernel or a rank it started) for
    exactly `facts`: False for a record changed since, made elsewhere, or typed in."""
    return isinstance(getattr(record, "seal", None), str) and hmac.compare_digest(record.seal,
                                                                               seal(facts))


def synchronize(device=None) -> None:
    """Wait until the work queued on `device` has finished; the CPU has nothing to wait for."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def interruption_counts() -> tuple:
    """(times the OS has taken the core from this thread against its will, garbage collections
    Python has run), both counted since the process started: read before and after a step, the
    differences say what interrupted it. The OS count is the kernel's involuntary context switches
    (getrusage's ru_nivcsw: per thread on Linux, per process elsewhere; 0 where Python has no
    `resource` module, as on Windows)."""
    try:
        import resource
    except ImportError:
        switches = 0
    else:
        who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
        switches = resource.getrusage(who).ru_nivcsw
    return switches, sum(generation["collections"] for generation in gc.get_stats())


def uninterrupted_seconds(fn: Callable[[], object], repeats: int = 20, warmup: int = 2,
                          device: Optional[torch.device] = None) -> List[float]:
    """The seconds of `repeats` timed calls of `fn` (after `warmup` calls), without those during
    which the OS switched this thread out (interruption_counts): what `fn` costs while it has the
    core, on a machine that other programs share. Fewer than `repeats` numbers where some were."""
    if warmup:  # the warm-up calls, timed by time_it and dropped
        time_it(fn, repeats=1, warmup=warmup - 1, device=device)
    kept = []
    for _ in range(repeats):
        switches = interruption_counts()[0]
        seconds = time_it(fn, repeats=1, warmup=0, device=device).seconds[0]
        if interruption_counts()[0] == switches:
            kept.append(seconds)
    return kept


def spread(values, interval=(10, 90)):
    """(median, low, high): the median and the `interval` percentiles (numpy's, linear);
    interval=(0, 100) gives the minimum and the maximum."""
    low, high = np.percentile(np.asarray(values, dtype=np.float64), interval)
    return float(np.median(values)), float(low), float(high)


def describe_us(microseconds: List[float]) -> str:
    """'median X µs (p10 A, p90 B)' of some microseconds; 'none' for none."""
    if not microseconds:
        return "none"
    median, p10, p90 = spread(microseconds)
    return f"median {median:.0f} µs (p10 {p10:.0f}, p90 {p90:.0f})"


@dataclass
class Timing:
    """Seconds per call: `seconds` are the timed repeats, `warmup_seconds` the calls left out."""

    seconds: List[float] = field(default_factory=list)
    warmup_seconds: List[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        # The median ignores the odd slow repeat (another process, a page fault); the mean does not.
        return statistics.median(self.seconds)


def time_it(fn: Callable[[], object], repeats: int = 20, warmup: int = 3,
            device: Optional[torch.device] = None) -> Timing:
    """Call `fn()` `warmup` times (kept apart, out of the median), then `repeats` timed times.

    With a CUDA `device`, each call is bracketed by synchronisations, so a repeat's time is the
    time the GPU took, not the time Python took to queue the kernels.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats={repeats} must be at least 1 and warmup={warmup} at least 0")
    timing = Timing()
    for index in range(warmup + repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        elapsed = time.perf_counter() - start
        (timing.warmup_seconds if index < warmup else timing.seconds).append(elapsed)
    return timing


@contextlib.contextmanager
def drop_stderr_lines(prefix: str = "USDT:"):
    """Hold back the lines that C++ code writes to this process's stderr (file descriptor 2)
    while the block runs, and write out again every line that does not start with `prefix`.

    Torch's profiler (Kineto) logs a line on fd 2 when it starts and one when it stops
    ("USDT:... profiler_start"); Python's own sys.stderr is untouched.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not line.startswith(prefix))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()
