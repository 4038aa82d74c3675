"""Starting one rank process, by fork or by spawn, with its five pipes to the launcher.

`RankHandle` is the launcher's end of a started rank: its pid, its pipes, its exit status.
"""
import importlib
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import course_lib
from ..shared import channel
from ..shared.process_group import signal_group
from ..rank.main import run_rank
from ..shared.protocol import RankPipes, RankSpec

STREAMS = ("stdout", "stderr", "messages", "stacks")
SPAWNED_MAIN = "from course_lib.runtime.rank.main import spawned_main; spawned_main()"


@dataclass(eq=False)
class RankHandle:
    rank: int
    pid: int
    fds: Dict[str, int]                      # the launcher's ends: STREAMS and "control"
    popen: Optional[subprocess.Popen] = None
    returncode: Optional[int] = None         # negative: killed by that signal
    exited_at: Optional[float] = None        # time.monotonic() when its exit was seen; None: not yet
    frames: channel.FrameBuffer = field(default_factory=channel.FrameBuffer)
    messages: deque = field(default_factory=deque)
    stacks: bytearray = field(default_factory=bytearray)
    pidfd: Optional[int] = None
    writer: Optional[threading.Thread] = None  # spawn: sends the spec and job in the background
    rendezvous: Optional[dict] = None        # where the rank's own init_process_group went, if it called one
    replied_at: Optional[float] = None       # time.monotonic() of its latest reply; None: none yet
    exit_step: Optional[dict] = None         # what it does after its function returned (rank.main)
    collectives: Optional[list] = None       # the collectives it recorded, as of its latest note
    collectives_at: Optional[float] = None   # time.monotonic() of that note
    asked_at: Optional[float] = None         # when the launcher last asked where it is (it hangs)
    answer: Optional[list] = None            # the collectives it had issued then: its first note since

    @property
    def alive(self) -> bool:
        return self.returncode is None

    def poll(self) -> None:
        if self.returncode is not None:
            return
        if self.popen is not None:
            code = self.popen.poll()
        else:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            code = os.waitstatus_to_exitcode(status) if pid else None
        if code is not None:
            self.returncode, self.exited_at = code, time.monotonic()


def _pipes():
    ends = {name: os.pipe() for name in STREAMS + ("control",)}
    ours = {name: (w if name == "control" else r) for name, (r, w) in ends.items()}
    theirs = RankPipes(stdout=ends["stdout"][1], stderr=ends["stderr"][1],
                       messages=ends["messages"][1], control=ends["control"][0],
                       stacks=ends["stacks"][1])
    return ours, theirs


def preload_for_fork() -> None:
    """Import, once, what every forked rank would otherwise import for itself.

    DistributedDataParallel's constructor imports torch._dynamo (hundreds of modules, seconds):
    imported here, the first launch pays it once and each later rank inherits it for free.
    In a notebook, so is tqdm's notebook bar, which each rank turns into a text bar.

    torch._dynamo imports torch.distributed.nn, so a rank now has it before init_process_group,
    which changes how a DDP model frees its process group (issue 21): rank.main's
    `keep_process_groups` makes that safe in every rank, whatever was imported when.
    """
    modules = ["torch._dynamo"] + (["tqdm.auto", "tqdm.notebook"] if "ipykernel.zmqshell" in sys.modules else [])
    for module in modules:
        if module not in sys.modules:
            try:
                importlib.import_module(module)
            except ImportError:
                pass


def fork_rank(spec: RankSpec, started: List[RankHandle]) -> RankHandle:
    """Fork a rank; `started` are the ranks before it, whose pipes the child must not keep.

    Call it with the stop button held back (interrupts.interrupts_held): a KeyboardInterrupt inside
    os.fork's after-fork hooks is lost. A child whose handle could not be made is stopped here."""
    ours, theirs = _pipes()
    inherited = [fd for h in started for fd in h.fds.values()] + list(ours.values())
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork in a threaded process (Jupyter always is): the rank
        # only touches fresh pipes and its own objects, never the kernel's locks.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        try:
            for fd in inherited:
                os.close(fd)
            run_rank(spec, theirs, forked=True)
        finally:
            os._exit(70)
    try:
        close_all(vars(theirs).values())
        return RankHandle(spec.rank, pid, ours, pidfd=_pidfd(pid))
    except BaseException:
        _stop_unrecorded(pid)
        close_all(ours.values())
        raise


def spawn_rank(spec: RankSpec, job_bytes: bytes) -> RankHandle:
    """Start a fresh interpreter; its spec and job follow on the control pipe."""
    ours, theirs = _pipes()
    env = dict(os.environ, **spec.env)
    env["COURSE_LIB_RANK_FDS"] = f"{theirs.messages},{theirs.control},{theirs.stacks}"
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(course_lib.__file__)))  # holds course_lib/
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    try:
        popen = subprocess.Popen(
            [sys.executable, "-c", SPAWNED_MAIN], stdin=subprocess.DEVNULL, stdout=theirs.stdout,
            stderr=theirs.stderr, env=env, start_new_session=True,
            pass_fds=(theirs.messages, theirs.control, theirs.stacks))
    finally:
        close_all(vars(theirs).values())
    try:
        handle = RankHandle(spec.rank, popen.pid, ours, popen=popen, pidfd=_pidfd(popen.pid))
        # Write in the background: the rank may print before it reads, and we must keep reading.
        spec_bytes = channel.dumps(spec)
        writer = threading.Thread(target=_write_frames, args=(ours["control"], [spec_bytes, job_bytes]),
                                  daemon=True, name=f"course_lib-rank{spec.rank}-writer")
        writer.start()  # fails where no thread can start
        handle.writer = writer
        return handle
    except BaseException:
        _stop_unrecorded(popen.pid)
        popen.returncode = -signal.SIGKILL  # reaped here: Popen must not wait for it again
        close_all(ours.values())
        raise


def _stop_unrecorded(pid: int) -> None:
    """Kill and reap a rank that was started but never handed to the launcher, which would not
    know to stop it (the rank leads a process group of its own once it runs: end that too)."""
    signal_group(pid, signal.SIGKILL)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _pidfd(pid: int) -> Optional[int]:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _write_frames(fd: int, frames) -> None:
    try:
        for frame in frames:
            if frame is not None:
                channel.write_frame(fd, frame)
    except OSError:
        pass  # the rank died before reading: its exit is reported instead


def close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
