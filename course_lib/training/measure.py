"""Measuring a training run: time per phase of a step, and peak memory per device.

On CUDA the phases are timed with CUDA events (no synchronisation per step); on CPU with the wall clock.
"""
import resource
import sys
import time

import torch

STEP_PHASES = ("data", "forward", "backward", "optimizer")


def clock_mark(on_cuda: bool):
    """A point in time: the wall clock on CPU; on CUDA an event recorded on the current stream."""
    if not on_cuda:
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


class PhaseTimer:
    """Splits a step into consecutive laps: `start()`, then `lap("data")`, `lap("forward")`, ..."""

    def __init__(self, device: torch.device):
        self.totals = dict.fromkeys(STEP_PHASES, 0.0)
        self.on_cuda = device.type == "cuda"
        self._last = None
        self._pending = []  # (phase, start_event, end_event) not yet read back from the GPU

    def _now(self):
        return clock_mark(self.on_cuda)

    def start(self) -> None:
        self._last = self._now()

    def lap(self, phase: str) -> None:
        now = self._now()
        if self.on_cuda:
            self._pending.append((phase, self._last, now))
            if len(self._pending) >= 4096:
                self.flush()
        else:
            self.totals[phase] += now - self._last
        self._last = now

    def flush(self) -> dict:
        """Read back pending CUDA timings (one synchronisation); returns seconds per phase."""
        if self._pending:
            self._pending[-1][2].synchronize()
            for phase, begin, end in self._pending:
                self.totals[phase] += begin.elapsed_time(end) / 1000.0
            self._pending.clear()
        return dict(self.totals)


class StepClock:
    """Seconds per optimizer step: `tick()` after each step, `seconds()` at the end.

    On CUDA the clock is a CUDA event per step, read back once at the end: the wall clock would
    time how fast steps are queued, not how long the GPU takes, and synchronising every step
    would stop the CPU from running ahead.
    """

    def __init__(self, device: torch.device):
        self.on_cuda = device.type == "cuda"
        self._marks = [self._mark()]

    def _mark(self):
        return clock_mark(self.on_cuda)

    def tick(self) -> None:
        self._marks.append(self._mark())

    def seconds(self) -> list:
        marks = self._marks
        if not self.on_cuda:
            return [end - begin for begin, end in zip(marks, marks[1:])]
        marks[-1].synchronize()
        return [begin.elapsed_time(end) / 1000.0 for begin, end in zip(marks, marks[1:])]


def reset_peak_memory(devices: list) -> None:
    for device in devices:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)


def peak_memory_bytes(devices: list) -> dict:
    """{device: peak bytes}: CUDA memory allocated on each GPU; for the CPU, the process's peak RSS."""
    return {str(device): _peak_bytes(device) for device in devices}


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB
