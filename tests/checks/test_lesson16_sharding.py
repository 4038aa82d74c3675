"""Lesson 16's graders (ZeRO-1, an FSDP layer): the watch the FSDP grader stands on sees what it
claims to.

Correct answers written differently from the solution, and wrong ones, are in
tests/checks/answers/lesson16.py (run by test_checks_alternatives.py and test_checks.py).
"""
import weakref

import pytest
import torch

from answers.lesson16 import GATHER
from course_lib import launch
from course_lib.checks.lesson16.sharding import WatchSharding

pytestmark = pytest.mark.timeout(300)


# -- the watch -------------------------------------------------------------------------------------
def _gather_twice(keep_first):
    shard = torch.ones(3)
    with WatchSharding() as watch:
        first = torch.empty(6)
        GATHER(first, shard)
        kept = first if keep_first else None
        del first
        second = torch.empty(6)
        GATHER(second, shard)
    del kept, second
    return [event[3] for event in watch.events]


def test_the_watch_sees_a_gathered_tensor_still_alive():
    assert launch(_gather_twice, False, nprocs=2, timeout=60, output="none") == [[0, 0], [0, 0]]
    assert launch(_gather_twice, True, nprocs=2, timeout=60, output="none") == [[0, 1], [0, 1]]


def test_a_weakref_sees_a_tensor_freed_at_once():
    tensor = torch.empty(4)
    ref = weakref.ref(tensor)
    del tensor
    assert ref() is None
