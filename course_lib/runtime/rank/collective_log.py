"""Which collectives this rank has issued, read from torch's own flight recorder.

torch records every collective a process group runs, below the Python API, in a ring buffer of
the last `TORCH_FR_BUFFER_SIZE` entries: its call number in its group, op, shapes, dtypes, the
Python stack that issued it, and whether it completed. gloo records since torch 2.8, NCCL since
2.3; DDP's gradient all-reduces from its C++ Reducer are recorded like dist.all_reduce. The
launcher turns recording on through that variable (see shared.protocol.RECORDER_ENV), and a rank
sends what it recorded as a COLLECTIVES note: before its result or error, and when the launcher
asks (SIGUSR2) because ranks hang. torch records point-to-point calls (send, recv) for NCCL only;
a rank waiting in one is seen in its stack instead.
"""
import os
import pickle
import signal
import sys
import threading
import time

import course_lib
from ..shared import channel
from ..shared.protocol import COLLECTIVES
from ..shared.tracebacks import place

ASK = signal.SIGUSR2  # the launcher's request: send what you recorded now
_started_ns = (0, 0)  # when this rank started: (wall clock, monotonic), in ns

_COURSE_LIB = os.path.dirname(os.path.abspath(course_lib.__file__)) + os.sep
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
           "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
           "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128"}


def mark_start() -> None:
    """Called first thing in a rank. A rank forked from a process that had a process group of its
    own (a notebook that ran one, pytest) inherits that process's records: own_entries leaves them out."""
    global _started_ns
    _started_ns = (time.time_ns(), time.monotonic_ns())


def own_entries(entries: list) -> list:
    """The flight recorder's entries this process recorded itself, not the ones a fork inherited."""
    return [entry for entry in entries if entry.get("time_created_ns") is None
            or entry["time_created_ns"] >= _start_on_the_clock_of(entry["time_created_ns"])]


def _start_on_the_clock_of(stamp: int) -> int:
    # torch 2.13 and 2.15 stamp records with the wall clock; a monotonic stamp (time since boot)
    # is below 1e18 ns, 31 years, where every wall-clock stamp of this century is above it
    wall, monotonic = _started_ns
    return wall if stamp > 10**18 else monotonic


def answer_requests(messages_fd: int) -> None:
    """Send the records whenever the launcher asks, even while the main thread waits in C++.

    A Python signal handler would run only in the main thread, which a hung collective blocks;
    so the signal is blocked in every thread (threads started later inherit that), and one thread
    of ours takes it with sigwait. Called first thing in a rank, before torch starts its threads.
    """
    if not hasattr(signal, "pthread_sigmask"):
        return
    signal.signal(ASK, lambda signum, frame: None)  # a thread started before the mask: not fatal
    signal.pthread_sigmask(signal.SIG_BLOCK, {ASK})

    def serve():
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # no stack dump is taken here
        while True:
            signal.sigwait({ASK})
            send_records(messages_fd)

    threading.Thread(target=serve, name="course_lib-collectives", daemon=True).start()


def send_records(messages_fd: int) -> None:
    try:
        channel.send(messages_fd, (COLLECTIVES, records()))
    except BaseException:  # noqa: BLE001 - a courtesy for the diagnosis; the launcher may be gone
        pass


def records() -> list:
    """This rank's recorded collectives, oldest first, as plain dicts:
    {"group", "seq", "op", "shapes", "dtypes", "done", "where", "in_backward"}; [] when torch records none."""
    dumped = []
    # torch registers it as torch._C starts; before that (a spawned rank still importing torch) no
    # collective was recorded, and importing it here would wait for that import to end (seconds)
    c10d = sys.modules.get("torch._C._distributed_c10d")
    if c10d is None:
        return []
    for name in ("_dump_fr_trace", "_dump_nccl_trace"):  # gloo's and NCCL's recorders are separate
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            dumped += own_entries(pickle.loads(dump()).get("entries", []))
        except Exception:  # noqa: BLE001 - not recording, or a torch that dumps otherwise
            continue
    return [_record(entry) for entry in dumped if not entry.get("is_p2p")]


def _record(entry: dict) -> dict:
    group = entry.get("process_group") or ("", "")
    return {
        "group": group[1] or group[0],
        "seq": entry.get("collective_seq_id", 0),
        "op": entry.get("profiling_name", "").rpartition(":")[2],
        "shapes": [list(size) for size in entry.get("input_sizes", [])],
        "dtypes": [_DTYPES.get(dtype, dtype) for dtype in entry.get("input_dtypes", [])],
        "done": bool(entry.get("retired")) or entry.get("state") == "completed",
        "where": _learner_line(entry.get("frames", [])),
        "in_backward": _in_backward(entry.get("frames", [])),
    }


def _in_backward(frames: list) -> bool:
    """Whether a hook of the backward pass issued it (DDP's Reducer all-reduces each gradient bucket
    there): the innermost Python frame is then autograd's, which runs the backward in C++."""
    return bool(frames) and frames[0].get("name") == "_engine_run_backward"


def _learner_line(frames: list) -> str:
    """The innermost frame that is neither torch's nor course_lib's: the line that called it, as
    "Cell In[5], line 9" (a notebook cell) or "train.py, line 9"."""
    import torch

    library = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, _COURSE_LIB, "<frozen")
    for frame in frames:
        filename = frame.get("filename", "")
        if not filename.startswith(library):
            return place(filename, frame.get("line"))
    return ""
