"""course_lib.checks.ranks: how a grader's launch reports stubs, hangs and crashes."""
import time

import pytest
import torch
import torch.distributed as dist

from course_lib.checks import GradingError, grader
from course_lib.checks.ranks import run_on_ranks

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
