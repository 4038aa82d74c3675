"""The stop button at every moment of a run: SIGINT sent `delay` ms after a launch, a spawn, a
session's start or a session's run begins; each trial says whether the interrupt was honoured (a
KeyboardInterrupt), how soon, and which of the processes it started are left.

The tests (tests/runtime/test_interrupts.py) run a few points; the issue's sweep, 50 rounds of
every point, runs from here (minutes; before/after with PYTHONPATH pointing at another checkout):

    python tests/interrupt_sweep.py [--rounds 50] [--step-ms 2] [--only launch,session_run]
"""
import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, List

HONOURED_WITHIN_S = 1.0  # what a learner pressing stop may expect
WAIT_FOR_LOST_S = 2.0    # after a call ended: how long an interrupt sent during it may take to show
LONG_CALL_TIMEOUT_S = 6  # a lost interrupt lets the call run on to this timeout


@dataclass
class Trial:
    scenario: str
    delay_ms: float
    sent_during_call: bool = False  # False: the call had ended when the signal was sent
    honoured: bool = False          # a KeyboardInterrupt reached the caller
    seconds_to_stop: float = 0.0    # from the signal to the KeyboardInterrupt
    left: List[int] = field(default_factory=list)      # processes it started that still run
    unreaped: List[int] = field(default_factory=list)  # ... that exited but were never waited for
    note: str = ""

    @property
    def lost(self) -> bool:
        return self.sent_during_call and not self.honoured

    @property
    def slow(self) -> bool:
        return self.honoured and self.seconds_to_stop > HONOURED_WITHIN_S


def children() -> dict:
    """{pid: state letter} of this process's child processes (R, S, Z, ...), read from /proc."""
    found, me = {}, os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found[int(entry)] = fields[0]
    return found


def interrupt_at(call: Callable[[], object], delay_ms: float, scenario: str = "",
                 expected_children=()) -> Trial:
    """Run `call`, sending this process SIGINT `delay_ms` after it starts (from another thread, as
    Jupyter's stop button comes from outside the main thread); then list what it left running.
    `expected_children`: pids that may stay (a session's ranks); a callable is asked afterwards."""
    trial = Trial(scenario, delay_ms)
    before = set(children())
    started, sent = threading.Event(), []

    def send():
        started.wait()
        time.sleep(delay_ms / 1000)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    ended = None
    try:
        try:
            started.set()
            call()
            ended = time.monotonic()
            sender.join()
            deadline = time.monotonic() + WAIT_FOR_LOST_S
            while time.monotonic() < deadline:  # an interrupt on its way shows here
                time.sleep(0.01)
        except KeyboardInterrupt as interrupt:
            trial.honoured, trial.note = True, type(interrupt).__name__
            trial.seconds_to_stop = time.monotonic() - sent[0] if sent else 0.0
        except Exception as error:  # noqa: BLE001 - a timeout: the interrupt was lost
            trial.note = f"{type(error).__name__}: {str(error).splitlines()[0]}"
            ended = time.monotonic()
    except KeyboardInterrupt:  # a second one while the first was being handled: counted as honoured
        trial.honoured = True
    sender.join()
    trial.sent_during_call = ended is None or sent[0] < ended
    keep = set(expected_children() if callable(expected_children) else expected_children)
    now = children()
    trial.left = sorted(pid for pid, state in now.items() if pid not in before | keep and state not in "ZX")
    trial.unreaped = sorted(pid for pid, state in now.items() if pid not in before and state in "ZX")
    for pid in trial.left:  # so that the next trial starts clean
        kill_and_reap(pid)
    return trial


def kill_and_reap(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


# -- what the ranks run -------------------------------------------------------------------------
def sleep_long():
    time.sleep(60)


def sleep_long_rank_first(rank):
    time.sleep(60)


def return_at_once():
    return 1


def _launch(fn, **kwargs):
    from course_lib import launch

    return lambda: launch(fn, nprocs=2, timeout=LONG_CALL_TIMEOUT_S, output="none", **kwargs)


def _spawn():
    from course_lib import spawn

    return lambda: spawn(sleep_long_rank_first, nprocs=2, timeout=LONG_CALL_TIMEOUT_S, output="none")


def _session_start():
    from course_lib import DistributedSession

    def start():
        DistributedSession(nprocs=2, output="none").close()  # not interrupted: closed at once
    return start


def _sessions_made():
    """The ranks of sessions that were made (a Ctrl-C between the constructor's return and
    close() leaves one that is the caller's to close, as any object it made); closed here."""
    from course_lib.runtime.launcher.session import _open_sessions

    pids = [h.pid for session in list(_open_sessions) if not session.closed for h in session._group.handles]
    for session in list(_open_sessions):
        session.close()
    return pids


def sweep_session_run(delays_ms, code: str) -> List[Trial]:
    """A run interrupted at each delay in one session: it must stop the command, keep the ranks
    (or restart them), and the next run must work."""
    from course_lib import DistributedSession

    trials = []
    with DistributedSession(nprocs=2, output="none", timeout=LONG_CALL_TIMEOUT_S) as session:
        ranks = lambda: [h.pid for h in session._group.handles]  # noqa: E731 - the session's own
        for delay in delays_ms:
            trial = interrupt_at(lambda: session.run(code), delay, f"session_run {code!r}", ranks)
            try:
                if session.run("rank") != [0, 1]:
                    trial.note += "; the next run failed"
            except BaseException as error:  # noqa: BLE001
                trial.note += f"; the next run raised {type(error).__name__}"
            trials.append(trial)
    return trials


SCENARIOS = {
    # name: (what runs, where the delays go: "start" sweeps 0-50 ms, "whole" the whole call)
    "launch": (lambda: _launch(sleep_long), "start"),
    "launch_teardown": (lambda: _launch(return_at_once), "whole"),
    "launch_spawned_ranks": (lambda: _launch(sleep_long, start_method="spawn"), "start"),
    "spawn": (_spawn, "start"),
    "session_start": (_session_start, "start"),
    "session_run": (None, "start"),
    "session_run_teardown": (None, "whole"),
}


def delays(where: str, step_ms: float, call=None) -> List[float]:
    """0 to 50 ms, or 0 to the call's own duration (measured now) and 10 ms past it."""
    end = 50.0
    if where == "whole":
        took = []
        for _ in range(3):
            start = time.monotonic()
            call()
            took.append(time.monotonic() - start)
        end = sorted(took)[1] * 1000 + 10
    return [round(i * step_ms, 1) for i in range(int(end / step_ms) + 1)]


def run_scenario(name: str, step_ms: float) -> List[Trial]:
    make, where = SCENARIOS[name]
    if name.startswith("session_run"):
        from course_lib import DistributedSession

        code = "time.sleep(60)" if where == "start" else "rank"
        if where == "whole":
            with DistributedSession(nprocs=2, output="none") as session:
                session.run("import time")
                points = delays(where, step_ms, lambda: session.run(code))
        else:
            points = delays(where, step_ms)
        return sweep_session_run(points, "import time; " + code)
    call = make()
    made = _sessions_made if name == "session_start" else ()
    return [interrupt_at(call, delay, name, made) for delay in delays(where, step_ms, call)]


def summarize(trials: List[Trial]) -> dict:
    during = [t for t in trials if t.sent_during_call]
    stops = sorted(t.seconds_to_stop for t in trials if t.honoured)
    return {"trials": len(trials), "during the call": len(during), "lost": sum(t.lost for t in trials),
            "left": sum(bool(t.left) for t in trials), "unreaped": sum(bool(t.unreaped) for t in trials),
            "over 1 s": sum(t.slow for t in trials),
            "p50 s": stops[len(stops) // 2] if stops else 0.0,
            "max s": stops[-1] if stops else 0.0,
            "broken after": sum("next run" in t.note for t in trials)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    options = parser.parse_args()
    import course_lib

    names = options.only.split(",")
    print(f"course_lib from {os.path.dirname(course_lib.__file__)}; {options.rounds} rounds, "
          f"a point every {options.step_ms:g} ms", flush=True)
    from course_lib import launch

    launch(return_at_once, nprocs=2, output="none")  # the first launch imports what ranks share
    totals = {name: [] for name in names}
    rounds_clean = {name: 0 for name in names}
    for round_number in range(1, options.rounds + 1):
        for name in names:
            trials = run_scenario(name, options.step_ms)
            totals[name] += trials
            clean = not any(t.lost or t.left or t.unreaped or "next run" in t.note for t in trials)
            rounds_clean[name] += clean
            bad = [t for t in trials if t.lost or t.left or t.unreaped or "next run" in t.note]
            print(f"round {round_number} {name}: {summarize(trials)}", flush=True)
            for t in bad:
                print(f"    {t.delay_ms} ms: lost={t.lost} left={t.left} unreaped={t.unreaped} {t.note}", flush=True)
    print("\nscenario: rounds with 0 lost and 0 left / rounds; totals")
    for name in names:
        print(f"{name}: {rounds_clean[name]} / {options.rounds}; {summarize(totals[name])}")


if __name__ == "__main__":
    sys.exit(main())
