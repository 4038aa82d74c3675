"""The stop button at any point of a run: held back while ranks are forked, recorded and stopped,
then honoured: a KeyboardInterrupt within seconds, and no process of the run left.

The fast tier sends SIGINT at the points that lost it or left a rank (inside os.fork's after-fork
hooks, between a fork and the handle that records the child, as ranks are stopped, as a session's
command ends); the slow tier sweeps the first 50 ms of launch, spawn and a session, and the whole
of a short launch. The issue's 50 rounds of that sweep: python tests/interrupt_sweep.py --rounds 50.
"""
import os
import signal
import threading
import time

import pytest

import interrupt_sweep
from course_lib import DistributedSession, launch, spawn
from course_lib.runtime.launcher import starter
from course_lib.runtime.launcher.session import DistributedSession as SessionClass
from course_lib.runtime.launcher.supervisor import DistributedRunInterrupted, RankSupervisor
from interrupt_sweep import children, sleep_long, sleep_long_rank_first
from scripts import run_cells

STRESS = pytest.mark.skipif(not os.environ.get("COURSE_STRESS"), reason=(
    "the whole sweep takes minutes: COURSE_STRESS=1, or python tests/interrupt_sweep.py --rounds 50"))
pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 10       # a lost interrupt lets the run go on to this timeout
STOPPED_WITHIN_S = 5  # far below it; the sweep script reports how many stop within 1 s

_armed = []  # a test arms it: the next fork of this process sends SIGINT from the after-fork hook


def _interrupt_in_after_fork_hook():
    if _armed:
        _armed.clear()
        os.kill(os.getpid(), signal.SIGINT)


os.register_at_fork(after_in_parent=_interrupt_in_after_fork_hook)


@pytest.fixture(autouse=True)
def ctrl_c_raises_keyboard_interrupt():
    """Each test sends SIGINT as a learner's stop button does, to a process where Ctrl-C raises
    KeyboardInterrupt (a kernel, a terminal). A process started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python then installs no handler: there a
    stop would be lost whenever the launcher is not holding SIGINT itself."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupting_first(function):
    """`function`, sending SIGINT to this process before its first call runs."""
    sent = []

    def wrapper(*args, **kwargs):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        return function(*args, **kwargs)
    return wrapper


def _assert_stopped_and_nothing_left(call) -> KeyboardInterrupt:
    before = set(children())
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            call()
        assert time.monotonic() - start < STOPPED_WITHIN_S
    finally:
        left = _left_since(before)
    assert not left, f"processes of the run left (pid: state): {left}"
    return caught.value


def _left_since(before) -> dict:
    """{pid: state} of this process's children not in `before`; killed, so the next test starts clean."""
    left = {pid: state for pid, state in children().items() if pid not in before}
    for pid in left:
        interrupt_sweep.kill_and_reap(pid)
    return left


def _launch():
    launch(sleep_long, nprocs=2, timeout=TIMEOUT_S, output="none")


def _spawn():
    spawn(sleep_long_rank_first, nprocs=2, timeout=TIMEOUT_S, output="none")


def _launch_spawned_ranks():
    launch(sleep_long, nprocs=2, timeout=TIMEOUT_S, output="none", start_method="spawn")


def _session_start():
    DistributedSession(nprocs=2, output="none", startup_timeout=TIMEOUT_S).close()


@pytest.fixture(scope="module", autouse=True)
def first_launch_done():
    """The first launch of a process imports what the ranks share: not part of what is timed."""
    launch(interrupt_sweep.return_at_once, nprocs=2, output="none")


@pytest.mark.parametrize("start", [_launch, _spawn, _session_start], ids=["launch", "spawn", "session"])
def test_a_stop_inside_the_after_fork_hooks_is_honoured(start):
    # Python discards a KeyboardInterrupt raised in an at-fork hook (logging registers one)
    _armed.append(True)
    try:
        error = _assert_stopped_and_nothing_left(start)
    finally:
        _armed.clear()
    if start is not _session_start:
        assert isinstance(error, DistributedRunInterrupted)
        assert str(error).startswith("interrupted: the 2 ranks were stopped")


@pytest.mark.parametrize("start", [_launch, _launch_spawned_ranks, _spawn, _session_start],
                         ids=["launch", "spawned-ranks", "spawn", "session"])
def test_a_stop_between_a_fork_and_the_record_of_the_child_leaves_no_rank(start, monkeypatch):
    monkeypatch.setattr(starter, "_pidfd", _interrupting_first(starter._pidfd))
    _assert_stopped_and_nothing_left(start)


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_failure_between_a_fork_and_the_record_of_the_child_stops_that_child(start_method, monkeypatch):
    def fails(pid):
        raise RuntimeError("no pidfd, on purpose")

    monkeypatch.setattr(starter, "_pidfd", fails)
    before = set(children())
    with pytest.raises(RuntimeError, match="on purpose"):
        launch(sleep_long, nprocs=2, timeout=TIMEOUT_S, output="none", start_method=start_method)
    left = _left_since(before)
    assert not left, f"processes of the run left (pid: state): {left}"


def test_a_stop_while_the_ranks_are_stopped_after_a_timeout_stops_them_all(monkeypatch):
    monkeypatch.setattr(RankSupervisor, "stop", _interrupting_first(RankSupervisor.stop))
    error = _assert_stopped_and_nothing_left(
        lambda: launch(sleep_long, nprocs=2, timeout=1, output="none"))
    assert "timed out" in str(error.__context__)  # raised once the ranks were gone, after the timeout


def test_a_stop_as_a_session_command_ends_is_raised_after_it_and_the_session_goes_on(monkeypatch):
    with DistributedSession(nprocs=2, output="none") as session:
        monkeypatch.setattr(SessionClass, "_end_cell_output",
                            _interrupting_first(SessionClass._end_cell_output))
        with pytest.raises(KeyboardInterrupt):
            session.run("x = rank")
        assert session.pull("x") == [0, 1]


def test_a_stop_as_a_session_command_is_sent_stops_it_on_every_rank_and_keeps_the_names(monkeypatch, capsys):
    # the ranks may not have started the command when their SIGINT comes: they must not run it
    with DistributedSession(nprocs=2, output="all") as session:
        session.run("kept = rank")
        monkeypatch.setattr(RankSupervisor, "send", _interrupting_first(RankSupervisor.send))
        with pytest.raises(KeyboardInterrupt):
            session.run("import time\ntime.sleep(30)\nlate = rank")
        monkeypatch.undo()
        assert session.run("kept, 'late' in globals()") == [(0, False), (1, False)]
    assert "restarting" not in capsys.readouterr().out  # the names were kept: no restart


def test_a_stop_after_some_ranks_answered_stops_the_others_and_keeps_the_names(capsys):
    with DistributedSession(nprocs=2, output="all") as session:
        session.run("kept = rank")
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            session.run("import time\nif rank == 1:\n    time.sleep(30)")  # rank 0 answers at once
        timer.join()
        assert session.run("kept") == [0, 1]
    assert "restarting" not in capsys.readouterr().out  # the names were kept: no restart


@STRESS
@pytest.mark.slow  # a Jupyter kernel: SIGINT may land on any of its threads, as the stop button's does
@pytest.mark.timeout(600)
def test_a_stop_at_every_moment_is_honoured_in_a_jupyter_kernel():
    output = run_cells(
        "import sys\nsys.path.insert(0, 'tests')\nimport interrupt_sweep\n"
        "from course_lib import launch\nlaunch(interrupt_sweep.return_at_once, nprocs=2, output='none')",
        "for name in ('launch', 'session_run'):\n"
        "    trials = interrupt_sweep.run_scenario(name, step_ms=4.0)\n"
        "    print(name, interrupt_sweep.summarize(trials))", timeout=500)[1]
    for line in output.splitlines():
        assert "'lost': 0, 'left': 0, 'unreaped': 0" in line and "'broken after': 0" in line, output


@STRESS
@pytest.mark.slow  # hundreds of interrupted launches; the fast tier keeps the points above
@pytest.mark.timeout(900)
@pytest.mark.parametrize("scenario", sorted(interrupt_sweep.SCENARIOS))
def test_a_stop_at_every_moment_is_honoured_and_leaves_nothing(scenario):
    trials = interrupt_sweep.run_scenario(scenario, step_ms=2.0)
    summary = interrupt_sweep.summarize(trials)
    bad = [t for t in trials if t.lost or t.left or t.unreaped or "next run" in t.note
           or t.seconds_to_stop > STOPPED_WITHIN_S]
    assert not bad, f"{summary}; {bad}"
