"""What the from-scratch wrappers did, and when: one record per collective or memory change.

Each wrapper keeps `events`, the records of the current step (cleared when its forward starts):
graders and the lesson read them to see the mechanism (an all-reduce launched inside backward(),
each gradient reduced once, buckets in reverse order, an FSDP unit gathered only while it runs).
Times are `time.perf_counter()` seconds, the clock `course_lib.training.timeline_recorder` uses on a CPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch


@dataclass
class Event:
    """One thing a wrapper did on this rank."""

    op: str                       # "all_reduce" (DDP), "all_gather", "reduce_scatter", "free" (FSDP)
    names: Tuple[str, ...]        # the parameters it carried (an FSDP unit: the unit's name)
    nbytes: int                   # bytes this rank sent in (0 for "free")
    started: float                # time.perf_counter() when it was launched
    in_backward: bool             # launched while autograd's backward() was running
    bucket: Optional[int] = None  # DDPFromScratch with buckets: the bucket's index
    phase: str = ""               # FSDP: "forward" or "backward" (which pass the gather served)
    completed: Optional[float] = None  # when it finished: its future's callback, or the wait's return


def in_backward() -> bool:
    """True inside a backward() pass (autograd's current graph task exists)."""
    return torch._C._current_graph_task_id() != -1


def record(events: List[Event], op: str, names, nbytes: int, work=None, started=None, **fields) -> Event:
    """Append an Event launched now (or at `started`); with `work` (an async collective's handle),
    note when it completes.

    The completion time comes from a callback on the work's future, which gloo runs on its own
    thread when the collective ends (NCCL: when it is queued; use CUDA events to time kernels).
    A blocking collective passes started= and completed= itself.
    """
    started = time.perf_counter() if started is None else started
    event = Event(op, tuple(names), nbytes, started, in_backward(), **fields)
    events.append(event)
    if work is not None:
        try:
            future = work.get_future()
        except RuntimeError:  # gloo's reduce-scatter has no future: completion stays unknown
            return event
        future.add_done_callback(lambda _: _set_completed(event))
    return event


def _set_completed(event: Event) -> None:
    event.completed = time.perf_counter()


def collectives(events: List[Event], op: Optional[str] = None) -> List[Event]:
    """The events that are collectives (not "free"), of one `op` if given, in launch order."""
    return [event for event in events if event.op != "free" and (op is None or event.op == op)]
