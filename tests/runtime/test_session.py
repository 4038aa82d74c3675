"""DistributedSession: persistent ranks, namespaces, errors and hangs that leave it usable."""
import os
import signal
import threading

import pytest
import torch

from course_lib import DistributedRunError, DistributedSession
from scripts import process_is_gone

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def session():
    with DistributedSession(nprocs=2, output="none") as s:
        yield s


def test_each_rank_keeps_its_namespace_across_runs(session):
    assert session.run("rank, world_size, torch.__name__, dist.is_initialized()") == [
        (0, 2, "torch", True), (1, 2, "torch", True)]
    assert session.run("x = torch.ones(2) * (rank + 1)") == [None, None]
    assert [t.tolist() for t in session.run("dist.all_reduce(x)\nx")] == [[3.0, 3.0]] * 2
    assert [t.tolist() for t in session.pull("x")] == [[3.0, 3.0]] * 2


def test_functions_run_on_every_rank_and_push_sets_names(session):
    assert session.run(lambda a, b=0: torch.distributed.get_rank() + a + b, 10, b=100) == [110, 111]
    session.push(lr=0.5, weights=torch.arange(3.0))
    assert session.run("lr * rank, weights.sum().item()") == [(0.0, 3.0), (0.5, 3.0)]


def test_an_error_names_the_rank_and_the_session_keeps_its_names(session):
    session.run("kept = rank * 10")
    with pytest.raises(DistributedRunError) as info:
        session.run("if rank == 1:\n    raise ValueError('only on rank 1')")
    assert info.value.failed_ranks == [1]
    assert "ValueError: only on rank 1" in str(info.value)
    assert 'File "<distributed cell 2>", line 2' in info.value.root_cause.traceback
    assert "session_loop.py" not in info.value.root_cause.traceback
    assert session.pull("kept") == [0, 10]
    with pytest.raises(DistributedRunError, match="name 'missing' is not defined on rank 0"):
        session.pull("missing")


def test_a_failure_that_strands_a_rank_in_a_collective_restarts_the_ranks(session, capsys):
    session.run("kept = 1")
    with pytest.raises(DistributedRunError) as info:
        session.run("if rank == 1:\n    raise RuntimeError('rank 1 skips the all_reduce')\n"
                    "dist.all_reduce(torch.ones(1))")
    assert info.value.root_cause.rank == 1
    assert info.value.failures[0].waiting_in.startswith("all_reduce")
    assert "names defined on them are lost" in capsys.readouterr().out
    assert session.run("rank") == [0, 1]
    with pytest.raises(DistributedRunError, match="name 'kept' is not defined"):
        session.pull("kept")


def test_a_hang_past_the_timeout_shows_stacks_and_the_session_goes_on(session):
    pids = session.run("import os\nos.getpid()")
    with pytest.raises(DistributedRunError) as info:
        session.run("if rank == 0:\n    dist.all_reduce(torch.ones(1))", timeout=2)
    assert info.value.timed_out and info.value.failures[0].waiting_in.startswith("all_reduce")
    assert all(process_is_gone(pid) for pid in pids)  # the old ranks are gone
    assert session.run("world_size") == [2, 2]


def test_an_interrupt_stops_the_command_on_every_rank_and_keeps_the_names(session):
    session.run("import time\nkept = rank")
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        session.run("time.sleep(60)")
    timer.join()
    assert session.pull("kept") == [0, 1]  # interrupted, not restarted


def test_output_is_labelled_and_closing_leaves_no_process(capsys):
    session = DistributedSession(nprocs=2, start_method="spawn")
    session.run("print('hello from', rank)")
    out = capsys.readouterr().out
    assert "[rank0] hello from 0" in out and "[rank1] hello from 1" in out
    pids = session.run("import os\nos.getpid()")
    session.close()
    assert session.closed and all(process_is_gone(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        session.run("rank")


def test_bad_requests_get_clear_errors(session):
    with pytest.raises(TypeError, match="code \\(a str\\) or a function"):
        session.run(42)
    with pytest.raises(TypeError, match="could not send"):
        session.push(lock=threading.Lock())
    with pytest.raises(DistributedRunError, match="cannot be pickled"):
        session.run("(i for i in range(3))")
    assert session.run("1 + 1") == [2, 2]
