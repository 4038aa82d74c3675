"""course_lib.checks.ranks: how a grader's launch reports stubs, hangs and crashes."""
import time

import pytest
import torch
import torch.distributed as dist

from course_lib.checks.engine import GradingError, grader
from course_lib.checks.engine.ranks import failure_verdict, run_on_ranks, without_grader_frames
from course_lib.runtime.shared.errors import DistributedRunError, RankFailure

pytestmark = pytest.mark.timeout(120)


def test_results_come_back_and_nothing_is_printed(capsys):
    assert run_on_ranks(lambda x: dist.get_rank() + x, 10, what="w", hang_hint="h") == [10, 11]
    assert capsys.readouterr() == ("", "")


def test_a_stub_on_a_rank_becomes_the_graders_advice(capsys):
    def stub():
        raise NotImplementedError("Exercise: write this part")

    @grader("an exercise")
    def check(fn):
        run_on_ranks(fn, what="fn on 2 ranks", hang_hint="h")

    with pytest.raises(GradingError, match="replace the `raise NotImplementedError"):
        check(stub)


def test_a_hang_says_where_each_rank_waits_and_gives_the_hint():
    def one_sided():
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))
        else:
            time.sleep(60)

    with pytest.raises(GradingError) as info:
        run_on_ranks(one_sided, what="one_sided", hang_hint="call it on every rank", timeout=3)
    message = str(info.value)
    assert "rank 0 waits in all_reduce" in message and "call it on every rank" in message


def test_a_crash_names_the_rank_and_its_error():
    def crash():
        if dist.get_rank() == 1:
            raise ValueError("bad value")

    with pytest.raises(GradingError, match="rank 1 in your function: ValueError: bad value"):
        run_on_ranks(crash, what="crash", hang_hint="h")


def test_a_rank_that_left_early_is_named_by_the_launchers_diagnosis():
    def one_sided():
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))

    with pytest.raises(GradingError) as info:
        run_on_ranks(one_sided, what="one_sided", hang_hint="h", timeout=30)
    got = info.value.got
    assert got.startswith("rank 1 finished after 0 collectives; rank 0 wait"), got
    assert "GLHF" not in got and info.value.details.splitlines()[-1].startswith("  rank 0: ")


CHECKS_FRAME = "/site-packages/course_lib/checks/lesson04/collectives.py"
RANK_TRACEBACK = f"""Traceback (most recent call last):
  File "{CHECKS_FRAME}", line 40, in _run_train_step
    train_step_by_hand(model, optimizer, X, y)
  File "Cell In[12], line 7", in train_step_by_hand
    dist.broadcast(torch.zeros(3), src=0)
  File "/site-packages/torch/distributed/distributed_c10d.py", line 2800, in broadcast
    work.wait()
ValueError: my mistake
"""


def test_a_crash_shows_the_ranks_own_traceback_without_the_graders_frames_and_gloo_last():
    lost = "RuntimeError: [pair.cc:537] Read error: Connection reset by peer. GLHF!"
    error = DistributedRunError(
        {0: RankFailure(0, "running", lost, traceback="...", when=2.0),
         1: RankFailure(1, "running", "ValueError: my mistake", traceback=RANK_TRACEBACK, when=1.0)},
        world_size=2, diagnosis="rank 1 failed after 0 collectives (ValueError: my mistake); "
                                "rank 0 waited in its 1st (broadcast float32[3])")
    got, details = failure_verdict(error)
    assert got.startswith("rank 1 failed after 0 collectives")
    assert CHECKS_FRAME not in details and "train_step_by_hand(model" not in details
    assert 'File "Cell In[12], line 7", in train_step_by_hand' in details
    assert "ValueError: my mistake" in details
    assert details.splitlines()[-1] == f"  rank 0: {lost}"  # gloo's words come last


def test_without_grader_frames_keeps_the_header_the_learners_frames_and_the_error():
    kept = without_grader_frames(RANK_TRACEBACK).splitlines()
    assert kept[0] == "Traceback (most recent call last):" and kept[-1] == "ValueError: my mistake"
    assert len(kept) == len(RANK_TRACEBACK.splitlines()) - 2
