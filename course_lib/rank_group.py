"""The launcher side of a run: start the ranks, watch them, relay their output, stop them all.

Used by `launch` (one job per rank) and by `DistributedSession` (many commands per rank).
"""
import os
import pickle
import selectors
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from . import channel
from .errors import DistributedRunError, RankFailure
from .output import OutputRelay
from .rank_process import RankPipes, RankSpec, notebook_friendly, run_rank, trim_stack_dump

STREAMS = ("stdout", "stderr", "messages", "stacks")


@dataclass(eq=False)
class RankHandle:
    rank: int
    pid: int
    fds: Dict[str, int]                      # the launcher's ends: STREAMS and "control"
    popen: Optional[subprocess.Popen] = None
    returncode: Optional[int] = None         # negative: killed by that signal
    exited_at: float = 0.0
    frames: channel.FrameBuffer = field(default_factory=channel.FrameBuffer)
    messages: deque = field(default_factory=deque)
    stacks: bytearray = field(default_factory=bytearray)
    pidfd: Optional[int] = None

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


class RankGroup:
    """A set of running ranks; `collect()` gathers one message from each."""

    def __init__(self, specs: List[RankSpec], start_method: str, relay: OutputRelay, job_bytes=None):
        self.relay = relay
        self.handles: List[RankHandle] = []
        self.selector = selectors.DefaultSelector()
        self._writers = []
        try:
            for spec in specs:
                handle = (self._fork if start_method == "fork" else self._spawn)(spec, job_bytes)
                self.handles.append(handle)
                self._watch(handle)
        except BaseException:
            self.stop()
            raise

    # -- starting ------------------------------------------------------------------------------
    def _pipes(self):
        ends = {name: os.pipe() for name in STREAMS + ("control",)}
        ours = {name: (w if name == "control" else r) for name, (r, w) in ends.items()}
        theirs = RankPipes(stdout=ends["stdout"][1], stderr=ends["stderr"][1],
                           messages=ends["messages"][1], control=ends["control"][0],
                           stacks=ends["stacks"][1])
        return ours, theirs

    def _fork(self, spec: RankSpec, job_bytes) -> RankHandle:
        ours, theirs = self._pipes()
        inherited = [fd for h in self.handles for fd in h.fds.values()] + list(ours.values())
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
        _close_all(vars(theirs).values())
        return RankHandle(spec.rank, pid, ours, pidfd=_pidfd(pid))

    def _spawn(self, spec: RankSpec, job_bytes: bytes) -> RankHandle:
        ours, theirs = self._pipes()
        env = dict(os.environ, **spec.env)
        env["COURSE_LIB_RANK_FDS"] = f"{theirs.messages},{theirs.control},{theirs.stacks}"
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        try:
            popen = subprocess.Popen(
                [sys.executable, "-c", "from course_lib.rank_process import spawned_main; spawned_main()"], stdin=subprocess.DEVNULL,
                stdout=theirs.stdout, stderr=theirs.stderr, env=env, start_new_session=True,
                pass_fds=(theirs.messages, theirs.control, theirs.stacks))
        finally:
            _close_all(vars(theirs).values())
        handle = RankHandle(spec.rank, popen.pid, ours, popen=popen, pidfd=_pidfd(popen.pid))
        # Write in the background: the rank may print before it reads, and we must keep reading.
        spec_bytes = channel.dumps(spec)
        writer = threading.Thread(target=_write_frames, args=(ours["control"], [spec_bytes, job_bytes]),
                                  daemon=True, name=f"course_lib-rank{spec.rank}-writer")
        writer.start()
        self._writers.append(writer)
        return handle

    def _watch(self, handle: RankHandle) -> None:
        for name in STREAMS:
            self.selector.register(handle.fds[name], selectors.EVENT_READ, (handle, name))
        if handle.pidfd is not None:
            self.selector.register(handle.pidfd, selectors.EVENT_READ, (handle, "exit"))

    # -- watching ------------------------------------------------------------------------------
    def pump(self, wait: float) -> None:
        """Read whatever the ranks have written (waiting up to `wait` seconds for something)."""
        if self.selector.get_map():
            events = self.selector.select(wait)
        else:
            events = []
            time.sleep(wait)
        for key, _ in events:
            handle, name = key.data
            if name == "exit":
                self.selector.unregister(key.fd)
                continue
            data = os.read(key.fd, 1 << 20)
            if not data:
                self.selector.unregister(key.fd)
                continue
            if name in ("stdout", "stderr"):
                self.relay.feed(handle.rank, name, data)
            elif name == "messages":
                handle.messages.extend(_decode(handle.rank, f) for f in handle.frames.feed(data))
            else:
                handle.stacks += data
        for handle in self.handles:
            handle.poll()

    def _open(self, handle: RankHandle, name: str) -> bool:
        try:
            self.selector.get_key(handle.fds[name])
            return True
        except KeyError:
            return False

    def collect(self, ranks=None, timeout: Optional[float] = None, failure_grace: float = 3.0,
                interrupted=lambda: False):
        """One message from each of `ranks`: {rank: value}; raises DistributedRunError otherwise.

        After the first failure the other ranks get `failure_grace` seconds to report their own
        (they usually fail because of it); ranks still busy then are shown with their stacks.
        `interrupted()` is polled between reads: when true, KeyboardInterrupt is raised there.
        """
        ranks = [h.rank for h in self.handles] if ranks is None else list(ranks)
        deadline = None if timeout is None else time.monotonic() + timeout
        replies, failures, first_failure = {}, {}, None
        while True:
            for handle in (self.handles[r] for r in ranks):
                if handle.rank in replies or handle.rank in failures:
                    continue
                if handle.messages:
                    kind, payload = handle.messages.popleft()
                    if kind == "ok":
                        replies[handle.rank] = payload
                    else:
                        failures[handle.rank] = RankFailure(handle.rank, **payload)
                elif not handle.alive and self._gave_up_on_messages(handle):
                    failures[handle.rank] = _exit_failure(handle)
            now = time.monotonic()
            if failures and first_failure is None:
                first_failure = now
            busy = [self.handles[r] for r in ranks if r not in replies and r not in failures]
            if not busy:
                break
            if first_failure is not None and now - first_failure > failure_grace:
                self._add_stacks(busy, failures, f"still running {failure_grace:g} s after rank "
                                 f"{min(failures)} failed", phase="hung")
                break
            if deadline is not None and now > deadline:
                self._add_stacks(busy, failures, f"still running after {timeout:g} s", phase="timeout")
                raise self.error(failures, timed_out=True)
            if interrupted():
                raise KeyboardInterrupt
            self.pump(0.05 if deadline is None else max(0.0, min(0.05, deadline - now)))
        if failures:
            raise self.error(failures)
        return replies

    def _gave_up_on_messages(self, handle: RankHandle) -> bool:
        # A rank's DataLoader workers may hold its pipe open after it exits: wait briefly.
        return not self._open(handle, "messages") or time.monotonic() - handle.exited_at > 0.5

    def _add_stacks(self, busy, failures, summary: str, phase: str) -> None:
        """Ask each busy rank for its Python stacks (faulthandler, SIGUSR1) and record where it waits."""
        for handle in busy:
            _signal(handle, signal.SIGUSR1)
        # Wait until every dump has arrived and stopped growing (3 s at most).
        end, last_sizes, stable_since = time.monotonic() + 3.0, None, time.monotonic()
        while time.monotonic() < end:
            self.pump(0.05)
            sizes = [len(h.stacks) for h in busy]
            if sizes != last_sizes:
                last_sizes, stable_since = sizes, time.monotonic()
            elif all(sizes) and time.monotonic() - stable_since > 0.2:
                break
        for handle in busy:
            stack = notebook_friendly(trim_stack_dump(handle.stacks.decode("utf-8", "replace")))
            handle.stacks.clear()
            waiting_in = _innermost_frame(stack)
            failures[handle.rank] = RankFailure(
                handle.rank, phase, summary + (f", waiting in {waiting_in}" if waiting_in else ""),
                when=time.time(), stack=stack, waiting_in=waiting_in)

    def error(self, failures, timed_out=False) -> DistributedRunError:
        self.relay.flush()
        return DistributedRunError(failures, self.relay.outputs(), len(self.handles), timed_out)

    # -- stopping ------------------------------------------------------------------------------
    def send(self, rank: int, payload: bytes) -> None:
        channel.write_frame(self.handles[rank].fds["control"], payload)

    def stop(self, wait_for_exit: float = 0.0, term_grace: float = 2.0) -> None:
        """Make sure no rank survives: wait for a clean exit, then SIGTERM, then SIGKILL; reap all.

        A second Ctrl-C while stopping is held back until every rank is gone.
        """
        interrupted = False
        for sig, grace in ((None, wait_for_exit), (signal.SIGTERM, term_grace), (signal.SIGKILL, 10)):
            alive = [h for h in self.handles if h.alive]
            if not alive:
                break
            for handle in alive if sig else []:
                _signal(handle, sig)
            end = time.monotonic() + grace
            while any(h.alive for h in self.handles) and time.monotonic() < end:
                try:
                    self.pump(0.02)
                except KeyboardInterrupt:
                    interrupted = True
        self._drain()
        self.relay.flush()
        self._close()
        if interrupted:
            raise KeyboardInterrupt

    def _drain(self, idle: float = 0.2) -> None:
        """Read what the exited ranks left in their pipes, so their last lines are not lost."""
        end = time.monotonic() + 2.0
        while self.selector.get_map() and time.monotonic() < end:
            before = sum(len(h.messages) for h in self.handles)
            keys = len(self.selector.get_map())
            self.pump(idle)
            if len(self.selector.get_map()) == keys and sum(len(h.messages) for h in self.handles) == before:
                break

    def _close(self) -> None:
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fd)
        self.selector.close()
        for handle in self.handles:
            _close_all(list(handle.fds.values()) + ([handle.pidfd] if handle.pidfd is not None else []))
            handle.fds, handle.pidfd = {}, None
            if handle.popen is not None:
                handle.popen.returncode = handle.returncode
        for writer in self._writers:
            writer.join(timeout=1)


def _decode(rank: int, frame: bytes):
    try:
        return pickle.loads(frame)
    except Exception as exc:  # noqa: BLE001
        return ("error", {"phase": "returning", "traceback": "", "when": time.time(),
                          "summary": f"the launcher could not unpickle rank {rank}'s message: "
                                     f"{type(exc).__name__}: {exc}"})


def _exit_failure(handle: RankHandle) -> RankFailure:
    code = handle.returncode
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        summary = f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    else:
        summary = f"exited with code {code} without reporting a result"
    return RankFailure(handle.rank, "exit", summary, when=time.time(), exitcode=code)


def _innermost_frame(stack: str) -> str:
    """'all_reduce (distributed_c10d.py:2950)' from faulthandler's dump of the current thread."""
    blocks = stack.split("\n\n")
    block = next((b for b in blocks if b.lstrip().startswith("Current thread")), blocks[0] if blocks else "")
    for line in block.splitlines():
        line = line.strip()
        if line.startswith("File ") and " in " in line:
            location, function = line.rsplit(" in ", 1)
            if function in ("wrapper", "_fn", "inner"):
                continue
            filename = location.split('"')[1].rsplit("/", 1)[-1] if '"' in location else location
            line_no = location.rsplit("line ", 1)[-1].strip(", ")
            return f"{function} ({filename}:{line_no})"
    return ""


def _signal(handle: RankHandle, sig: int) -> None:
    for kill, target in ((os.killpg, handle.pid), (os.kill, handle.pid)):
        try:
            kill(target, sig)
            return
        except (ProcessLookupError, PermissionError):
            continue


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


def _close_all(fds) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
