"""The launcher side of a run: start the ranks, watch them, relay their output, stop them all.

Used by `launch` (one job per rank) and by `DistributedSession` (many commands per rank).
"""
import contextlib
import os
import pickle
import selectors
import shutil
import signal
import tempfile
import time
from typing import List, Optional

from ..shared import channel
from ..shared.errors import DistributedRunError, RankFailure
from ..shared.output import OutputRelay
from ..shared.process_group import signal_group
from ..shared.protocol import COLLECTIVES, ERROR, EXITING, OK, RENDEZVOUS, RankSpec, error_record
from .diagnosis import RankState, diagnose
from ..rank import last_call
from ..rank.collective_log import ASK
from .interrupts import interrupts_held
from .starter import STREAMS, RankHandle, close_all, fork_rank, spawn_rank
from ..shared.tracebacks import (innermost_frame, native_threads, notebook_friendly, reaches_rank_code,
                                 trim_stack_dump)

# Seconds a rank may take, after its result arrived, to free what its function left and exit.
EXIT_GRACE_S = 30.0
# Asking hung ranks where they are: a rank that sends nothing for this long cannot answer; and
# the longest wait for the answers, however many keep arriving.
ANSWER_QUIET_S = 3.0
ANSWER_LIMIT_S = 60.0


class DistributedRunInterrupted(DistributedRunError, KeyboardInterrupt):
    """The run was interrupted (the notebook's stop button, Ctrl-C): each rank's line and the
    diagnosis, after every rank was stopped. Still a KeyboardInterrupt for code that catches one."""


class RankSupervisor:
    """A set of running ranks; `collect()` gathers one message from each."""

    def __init__(self, specs: List[RankSpec], start_method: str, relay: OutputRelay, job_bytes=None):
        self.relay = relay
        self.record_collectives = all(spec.record_collectives for spec in specs)
        self.explain_interrupts = True  # Ctrl-C: stacks and diagnosis (a session interrupts its ranks instead)
        self.handles: List[RankHandle] = []
        self.selector = selectors.DefaultSelector()
        self.calls_folder = tempfile.mkdtemp(prefix="course-ranks-") if self.record_collectives else None
        try:
            for spec in specs:
                if self.calls_folder:
                    spec.last_call_path = last_call.make(os.path.join(self.calls_folder, f"rank{spec.rank}"))
                handle = (fork_rank(spec, self.handles) if start_method == "fork"
                          else spawn_rank(spec, job_bytes))
                self.handles.append(handle)
                self._watch(handle)
        except BaseException:
            self.stop()
            raise

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
                for kind, payload in (_decode(handle.rank, f) for f in handle.frames.feed(data)):
                    if kind == RENDEZVOUS:  # a note on the way, not the rank's reply
                        handle.rendezvous = payload
                    elif kind == EXITING:  # a note after the reply: what the rank does before it exits
                        handle.exit_step = payload
                    elif kind == COLLECTIVES:  # a note: the collectives it issued so far
                        handle.collectives, handle.collectives_at = payload, time.monotonic()
                        if handle.asked_at is not None and handle.answer is None:
                            handle.answer = payload  # what it had issued when asked (a later note
                            # may follow: a collective that then timed out in the backend reads done)
                    else:
                        handle.replied_at = time.monotonic()
                        handle.messages.append((kind, payload))
            else:
                handle.stacks += data
        self.relay.tick()
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
        __tracebackhide__ = True
        ranks = [h.rank for h in self.handles] if ranks is None else list(ranks)
        started = time.monotonic()
        replies, failures = {}, {}
        try:
            return self._collect(ranks, timeout, failure_grace, interrupted, replies, failures)
        except KeyboardInterrupt as interrupt:
            if not self.explain_interrupts:  # a session interrupts the ranks that have not answered
                interrupt.answered = sorted(set(replies) | set(failures))
                raise
            busy = [self.handles[r] for r in ranks if r not in replies and r not in failures]
            self._add_stacks(busy, failures, f"interrupted after {time.monotonic() - started:.0f} s",
                             phase="interrupted")
            raise self.error(failures, interrupted=True, finished=replies) from None

    def _collect(self, ranks, timeout, failure_grace, interrupted, replies, failures):
        __tracebackhide__ = True
        deadline = None if timeout is None else time.monotonic() + timeout
        first_failure = None
        while True:
            for handle in (self.handles[r] for r in ranks):
                if handle.rank in replies or handle.rank in failures:
                    continue
                if handle.messages:
                    kind, payload = handle.messages.popleft()
                    if kind == OK:
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
                raise self.error(failures, timed_out=True, finished=replies)
            if interrupted():
                raise KeyboardInterrupt
            self.pump(0.05 if deadline is None else max(0.0, min(0.05, deadline - now)))
        if failures:
            raise self.error(failures, finished=replies)
        return replies

    def await_exits(self, results: dict, deadline: Optional[float] = None,
                    grace: Optional[float] = None, interrupted=lambda: False) -> None:
        """After every rank's result arrived: wait until every rank has exited.

        Each rank gets `grace` seconds (EXIT_GRACE_S) from its result to free what its function
        left and exit, and never past `deadline` (the run's timeout). A rank still there is stuck
        after its function returned: DistributedRunError names it with what it was doing, its
        stacks and its threads, and carries every result in `.results`; then it is stopped.
        When `interrupted()` turns true, DistributedRunInterrupted says so, with every result.
        """
        __tracebackhide__ = True
        grace = EXIT_GRACE_S if grace is None else grace
        while True:
            alive = [h for h in self.handles if h.alive]
            if not alive:
                return
            if interrupted():
                failures = {h.rank: RankFailure(h.rank, "interrupted", "interrupted while it exited, after "
                                                "its result arrived", when=time.time()) for h in alive}
                raise self.error(failures, interrupted=True, results=results, finished=results)
            now = time.monotonic()
            timed_out = deadline is not None and now > deadline
            late = [h for h in alive
                    if timed_out or (h.replied_at is not None and now - h.replied_at > grace)]
            if late:
                failures = {}
                self._add_stacks(late, failures, _stuck_after_return, phase="exiting")
                raise self.error(failures, timed_out=timed_out, results=results)
            ends = ([h.replied_at + grace for h in alive if h.replied_at is not None]
                    + ([deadline] if deadline is not None else []))
            self.pump(max(0.0, min(0.05, min(ends, default=now + 0.05) - now)))

    def _gave_up_on_messages(self, handle: RankHandle) -> bool:
        # A rank's DataLoader workers may hold its pipe open after it exits: wait briefly.
        return (not self._open(handle, "messages")
                or (handle.exited_at is not None and time.monotonic() - handle.exited_at > 0.5))

    def _add_stacks(self, busy, failures, summary, phase: str) -> None:
        """Ask each busy rank for its Python stacks (faulthandler, SIGUSR1) and record where it waits.

        `summary`: one line for every rank, or a function of the handle that gives its line. Where
        Python shows no frame (a thread stuck in C or C++), the rank's threads as Linux sees them follow.
        """
        # Before the signal (which may wake a wait it interrupts): the threads, and each rank's line.
        threads = {handle.rank: native_threads(handle.pid) for handle in busy}
        lines = {handle.rank: summary(handle, threads[handle.rank]) if callable(summary) else summary
                 for handle in busy}
        for handle in busy:
            signal_group(handle.pid, signal.SIGUSR1)
        self._await_answers(busy, records=False)
        # Then the records, which the rank's own thread sends even from a hung collective. Not at
        # once: faulthandler reads every thread's frames without the GIL, and dumping a thread
        # while it runs Python (that one, answering) can crash the rank (seen under load)
        if self.record_collectives:
            asked = time.monotonic()
            for handle in busy:
                handle.asked_at, handle.answer = asked, None
                with contextlib.suppress(ProcessLookupError):
                    os.kill(handle.pid, ASK)
            self._await_answers(busy, records=True)
        for handle in busy:
            dump = handle.stacks.decode("utf-8", "replace")
            stack = notebook_friendly(trim_stack_dump(dump))
            handle.stacks.clear()
            shown = threads[handle.rank] if phase == "exiting" or "<no Python frame>" in stack else ""
            waiting_in = innermost_frame(dump)
            failures[handle.rank] = RankFailure(
                handle.rank, phase, lines[handle.rank] + (f", waiting in {waiting_in}" if waiting_in else ""),
                when=time.time(), stack=stack, waiting_in=waiting_in, threads=shown)

    def _await_answers(self, busy, records: bool) -> None:
        """Wait until each busy rank still alive has sent what the diagnosis needs: its main thread's
        stack (down to the rank's own code), and its records if `records`; then until nothing more
        comes for a moment (the rest of the dump). However many ranks answer at once, and however
        loaded the machine, answers that keep arriving are waited for; a rank that sends nothing
        for ANSWER_QUIET_S cannot answer (its main thread holds the GIL, which the records thread
        needs) and is given up on. A rank that was just starting has no handler yet: the signal
        ends it, and it is not waited for."""
        started = time.monotonic()
        seen, last_arrival = None, started
        while time.monotonic() - started < ANSWER_LIMIT_S:
            self.pump(0.02)
            now, answering = time.monotonic(), [h for h in busy if h.alive]
            arrived = [(h.rank, len(h.stacks), h.collectives_at) for h in answering]
            if arrived != seen:
                seen, last_arrival = arrived, now
            quiet = now - last_arrival
            answered = all(reaches_rank_code(h.stacks.decode("utf-8", "replace"))
                           and (not records or h.answer is not None) for h in answering)
            if quiet > ANSWER_QUIET_S or (quiet > 0.05 and answered):
                return

    def error(self, failures, timed_out=False, results=None, finished=(),
              interrupted=False) -> DistributedRunError:
        self.relay.flush()
        note = _rendezvous_note(self.handles, failures) if timed_out or interrupted else ""
        outputs = self.relay.outputs()
        why = diagnose(self._states(failures, finished, outputs)) if self.record_collectives else ""
        kind = DistributedRunInterrupted if interrupted else DistributedRunError
        return kind(failures, outputs, len(self.handles), timed_out, note, dict(results or {}), why)

    def _states(self, failures, finished, outputs) -> dict:
        """What the diagnosis needs of each rank: how it ended, or where it waits, and its records."""
        states = {}
        for handle in self.handles:
            failure = failures.get(handle.rank)
            state, waiting_in, summary = "running", "", ""
            if failure is None:
                state = "returned" if handle.rank in finished else "running"
            elif failure.phase in ("timeout", "hung", "interrupted"):
                waiting_in = failure.waiting_in
            elif failure.phase == "exiting":
                state = "returned"
            else:
                state, summary = ("exited" if failure.phase == "exit" else "failed"), failure.summary
            asked = failure is not None and failure.phase in ("timeout", "hung", "interrupted", "exiting")
            records = handle.answer if asked and handle.answer is not None else handle.collectives
            states[handle.rank] = RankState(handle.rank, state, failure.gave_up_waiting if failure else "",
                                            records, waiting_in, summary,
                                            outputs.get(handle.rank, [])[-200:], self._last_call(handle.rank))
        return states

    # -- stopping ------------------------------------------------------------------------------
    def send(self, rank: int, payload: bytes) -> None:
        channel.write_frame(self.handles[rank].fds["control"], payload)

    def stop(self, wait_for_exit: float = 0.0, term_grace: float = 2.0) -> None:
        """Make sure no rank survives: wait for a clean exit, then SIGTERM, then SIGKILL; reap all.

        A Ctrl-C while stopping is held back until every rank is gone, then raised.
        """
        with interrupts_held():
            for sig, grace in ((None, wait_for_exit), (signal.SIGTERM, term_grace), (signal.SIGKILL, 10)):
                alive = [h for h in self.handles if h.alive]
                if not alive:
                    break
                for handle in alive if sig else []:
                    signal_group(handle.pid, sig)
                end = time.monotonic() + grace
                while any(h.alive for h in self.handles) and time.monotonic() < end:
                    self.pump(0.02)
            self._drain()
            self.relay.flush()
            self._close()

    def _drain(self, idle: float = 0.2) -> None:
        """Read what the exited ranks left in their pipes, so their last lines are not lost."""
        end = time.monotonic() + 2.0
        while self.selector.get_map() and time.monotonic() < end:
            before = sum(len(h.messages) for h in self.handles)
            keys = len(self.selector.get_map())
            self.pump(idle)
            if len(self.selector.get_map()) == keys and sum(len(h.messages) for h in self.handles) == before:
                break

    def _last_call(self, rank: int) -> str:
        return last_call.read(os.path.join(self.calls_folder, f"rank{rank}")) if self.calls_folder else ""

    def _close(self) -> None:
        if self.calls_folder:
            shutil.rmtree(self.calls_folder, ignore_errors=True)
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fd)
        self.selector.close()
        for handle in self.handles:
            close_all(list(handle.fds.values()) + ([handle.pidfd] if handle.pidfd is not None else []))
            handle.fds, handle.pidfd = {}, None
            if handle.popen is not None:
                handle.popen.returncode = handle.returncode
            if handle.writer is not None:
                handle.writer.join(timeout=1)


def _stuck_after_return(handle: RankHandle, threads: str) -> str:
    """What a rank that sent its result but did not exit was doing (its own note says)."""
    step = handle.exit_step or {}
    seconds = 0.0 if handle.replied_at is None else time.monotonic() - handle.replied_at
    if step.get("step") == "freeing":
        names = [f"{name} ({kind})" for name, kind in step.get("locals", [])]
        doing = "freeing your function's local variables" + (f": {', '.join(names)}" if names else "")
    elif step.get("step") == "destroy_process_group":
        doing = "in destroy_process_group(), which the launcher calls after your function"
    else:
        doing = "before it could exit"
    line = f"your function returned and its result arrived, then the rank was stuck {seconds:.0f} s {doing}"
    gloo_waits = "pt_gloo_runloop" in threads and "(main thread): waits on a lock" in threads
    if any(kind == "DistributedDataParallel" for _, kind in step.get("locals", [])) and gloo_waits:
        line += (" (freeing DDP's Reducer frees its gloo process group once destroy_process_group() "
                 "has run; gloo's destructor then waits for its worker threads, and a worker that "
                 "frees a finished all-reduce waits for the Python lock: PyTorch issue 56297)")
    return line


def _rendezvous_note(handles: List[RankHandle], failures) -> str:
    """When ranks hang in their own init_process_group: which ranks arrived, at which address."""
    waiting = [rank for rank, failure in failures.items() if "in init_process_group" in failure.stack]
    arrived = {h.rank: h.rendezvous for h in handles if h.rendezvous}
    if not waiting or not arrived:
        return ""
    places = {}
    for rank, where in sorted(arrived.items()):
        key = (where["address"], where["world_size"], where["hosted_by"])
        places.setdefault(key, []).append(rank)
    lines = ["The rendezvous did not complete:"]
    for (address, world_size, hosted_by), ranks in places.items():
        lines.append(f"  {_ranks_phrase(ranks)} called init_process_group at {address} "
                     f"(store hosted by {hosted_by}), for world_size={world_size}")
    missing = [h.rank for h in handles if h.rank not in arrived]
    if missing:
        lines.append(f"  {_ranks_phrase(missing)} never called init_process_group: every rank must call it")
    if len(places) > 1:
        lines.append("  every rank must use the same address, port and world_size")
    return "\n".join(lines)


def _ranks_phrase(ranks) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _decode(rank: int, frame: bytes):
    try:
        return pickle.loads(frame)
    except Exception as exc:  # noqa: BLE001
        return (ERROR, error_record("returning", f"the launcher could not unpickle rank {rank}'s message: "
                                                 f"{type(exc).__name__}: {exc}"))


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

